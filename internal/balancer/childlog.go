package balancer

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
)

// childLog is a child's stdout and stderr: it logs each line at the level
// the line names and keeps the last lines for errors. Safe for concurrent
// use.
type childLog struct {
	log *slog.Logger

	mu   sync.Mutex
	part []byte   // an unfinished line
	tail []string // the last balancerTailLines lines
}

// Write logs every complete line in p.
func (c *childLog) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.part = append(c.part, p...)
	rest := c.part
	for {
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			break
		}
		c.line(string(rest[:i]))
		rest = rest[i+1:]
	}
	if len(rest) > 64<<10 { // no newline in sight: don't grow without bound
		c.line(string(rest))
		rest = nil
	}
	c.part = c.part[:copy(c.part, rest)]
	return len(p), nil
}

// line logs one line; c.mu is held.
func (c *childLog) line(s string) {
	s = strings.TrimRight(s, "\r ")
	if s == "" {
		return
	}
	if len(c.tail) == balancerTailLines {
		c.tail = append(c.tail[:0], c.tail[1:]...)
	}
	c.tail = append(c.tail, s)
	c.log.Log(context.Background(), childLevel(s), s)
}

// childLevel reads the level from nginx's "[warn]" or HAProxy's "[WARNING]".
func childLevel(s string) slog.Level {
	l := strings.ToLower(s)
	switch {
	case strings.Contains(l, "[emerg]"), strings.Contains(l, "[alert]"), strings.Contains(l, "[crit]"), strings.Contains(l, "[error]"):
		return slog.LevelError
	case strings.Contains(l, "[warn"):
		return slog.LevelWarn
	default:
		return slog.LevelInfo
	}
}

// tailText returns the last lines written, and any unfinished one.
func (c *childLog) tailText() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	lines := append([]string(nil), c.tail...)
	if len(c.part) > 0 {
		lines = append(lines, string(c.part))
	}
	return strings.Join(lines, "\n")
}

// tailBlock is tailText set off for the end of an error message, or "".
func (c *childLog) tailBlock() string {
	t := c.tailText()
	if t == "" {
		return ""
	}
	return "; its output ended:\n" + t
}
