package main

import (
	"fmt"
	"io"
	"log/slog"
)

// logFormat is the --log-format flag: "text" (slog's key=value lines, for
// people) or "json" (one JSON object a line, for log collectors such as
// Loki, Elasticsearch or Cloud Logging, which parse it without a pattern).
type logFormat string

// The log formats.
const (
	logText logFormat = "text"
	logJSON logFormat = "json"
)

func (f *logFormat) String() string { return string(*f) }

func (f *logFormat) Set(s string) error {
	switch v := logFormat(s); v {
	case logText, logJSON:
		*f = v
		return nil
	}
	return fmt.Errorf("log format %q is neither text nor json", s)
}

// logFormatUsage is the --log-format flag's help.
const logFormatUsage = "log `format`: text (key=value) or json (one object a line, for log collectors)"

// newLogger returns the logger of a subcommand: level and format as its
// flags say, written to w.
func newLogger(w io.Writer, format logFormat, level slog.Level) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if format == logJSON {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
