// Package bench drives workloads against an OpenAI-compatible endpoint (a
// router or a single server) and measures what clients see.
package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute/internal/workload"
)

// Client sends chat requests to one endpoint and times them.
type Client struct {
	// BaseURL is the endpoint, e.g. http://127.0.0.1:8080.
	BaseURL string
	// Model is the model id to request.
	Model string
	// HTTP is the client to use; nil means a client tuned for many streams.
	HTTP *http.Client
	// TimeScale is the backends' wall/model time ratio: waits are scaled by
	// it, and measured times divided by it, so results are in model time.
	// 0 means 1.
	TimeScale float64
}

// Result is one request as the client saw it. Times are in model time.
type Result struct {
	Session, Turn int
	// Heavy marks a turn carrying a long document.
	Heavy bool
	// Backend and Route are the router's X-Kvroute-Backend and
	// X-Kvroute-Route headers (empty without a router).
	Backend, Route string
	// Status is the HTTP status; 0 if the request failed before one.
	Status int
	// Err is set when the request failed.
	Err error
	// Sent is when the request was sent, from the start of the run.
	Sent time.Duration
	// TTFT is the time to the first content token; E2E to the end.
	TTFT, E2E time.Duration
	// PromptTokens, CachedTokens and CompletionTokens are the response's usage.
	PromptTokens, CachedTokens, CompletionTokens int
}

func (c *Client) scale() float64 {
	if c.TimeScale <= 0 {
		return 1
	}
	return c.TimeScale
}

func (c *Client) http() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns, t.MaxIdleConnsPerHost = 1024, 1024
	c.HTTP = &http.Client{Transport: t}
	return c.HTTP
}

// RunChat plays sessions against the endpoint, each in its own goroutine
// from its start time, every turn carrying the conversation so far (the
// replies the server gave included). It calls done (if not nil) after each
// request, from any goroutine, and returns every result when all sessions
// have ended or ctx is done.
func (c *Client) RunChat(ctx context.Context, sessions []workload.Session, done func(Result)) []Result {
	c.http()
	start := time.Now()
	var (
		mu      sync.Mutex
		results []Result
		wg      sync.WaitGroup
	)
	record := func(r Result) {
		mu.Lock()
		results = append(results, r)
		mu.Unlock()
		if done != nil {
			done(r)
		}
	}
	for i := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := &sessions[i]
			if !c.sleepUntil(ctx, start, s.Start) {
				return
			}
			msgs := []message{{Role: "system", Content: s.System}}
			for t, turn := range s.Turns {
				if !c.sleep(ctx, turn.Think) {
					return
				}
				msgs = append(msgs, message{Role: "user", Content: turn.User})
				res, reply := c.chat(ctx, start, s.ID, msgs, turn.MaxTokens)
				res.Session, res.Turn, res.Heavy = i, t, turn.Heavy
				record(res)
				if res.Err != nil {
					return // the conversation cannot go on without its reply
				}
				msgs = append(msgs, message{Role: "assistant", Content: reply})
			}
		}()
	}
	wg.Wait()
	return results
}

// model converts a wall duration into model time.
func (c *Client) model(d time.Duration) time.Duration {
	return time.Duration(float64(d) / c.scale())
}

func (c *Client) sleep(ctx context.Context, model time.Duration) bool {
	if model <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(time.Duration(float64(model) * c.scale()))
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func (c *Client) sleepUntil(ctx context.Context, start time.Time, model time.Duration) bool {
	return c.sleep(ctx, time.Duration(float64(model)*c.scale())-time.Since(start))
}

type message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// chat sends one streaming chat request and reads the reply.
func (c *Client) chat(ctx context.Context, start time.Time, session string, msgs []message, maxTokens int) (Result, string) {
	body, err := json.Marshal(map[string]any{
		"model":          c.Model,
		"messages":       msgs,
		"max_tokens":     maxTokens,
		"stream":         true,
		"stream_options": map[string]any{"include_usage": true},
	})
	var res Result
	if err != nil {
		res.Err = err
		return res, ""
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(c.BaseURL, "/")+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		res.Err = err
		return res, ""
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Session-ID", session)
	sent := time.Now()
	res.Sent = c.model(sent.Sub(start))
	resp, err := c.http().Do(req)
	if err != nil {
		res.Err = err
		return res, ""
	}
	defer resp.Body.Close()
	res.Status = resp.StatusCode
	res.Backend = resp.Header.Get("X-Kvroute-Backend")
	res.Route = resp.Header.Get("X-Kvroute-Route")
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		res.Err = fmt.Errorf("status %d: %s", resp.StatusCode, bytes.TrimSpace(msg))
		return res, ""
	}
	var reply strings.Builder
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	sawDone := false
	for sc.Scan() {
		line := sc.Bytes()
		data, ok := bytes.CutPrefix(line, []byte("data: "))
		if !ok {
			continue
		}
		if string(data) == "[DONE]" {
			sawDone = true
			break
		}
		var chunk struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Usage *struct {
				PromptTokens        int `json:"prompt_tokens"`
				CompletionTokens    int `json:"completion_tokens"`
				PromptTokensDetails *struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(data, &chunk); err != nil {
			res.Err = fmt.Errorf("bad event %q: %w", data, err)
			return res, ""
		}
		for _, ch := range chunk.Choices {
			if ch.Delta.Content != "" && res.TTFT == 0 {
				res.TTFT = c.model(time.Since(sent))
			}
			reply.WriteString(ch.Delta.Content)
		}
		if u := chunk.Usage; u != nil {
			res.PromptTokens, res.CompletionTokens = u.PromptTokens, u.CompletionTokens
			if u.PromptTokensDetails != nil {
				res.CachedTokens = u.PromptTokensDetails.CachedTokens
			}
		}
	}
	res.E2E = c.model(time.Since(sent))
	if err := sc.Err(); err != nil {
		res.Err = err
	} else if !sawDone {
		res.Err = errors.New("stream ended without [DONE]")
	}
	return res, reply.String()
}
