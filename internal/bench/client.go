// Package bench is the live bench driver (`kvroute bench` and `kvroute
// demo`): it starts a fleet behind kvroute or a real balancer (package
// balancer), drives workloads against an OpenAI-compatible endpoint (a router
// or a single server) and measures what clients see, as a results.Report.
package bench

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute/internal/emulator"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/proxy"
	"github.com/kvroute/kvroute/internal/results"
	"github.com/kvroute/kvroute/internal/tokenizer"
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
	// Users, when positive, runs closed loop: that many users, each
	// starting the next session as soon as its previous one ended (the
	// sessions' start times are ignored).
	Users int
	// BlockTokens, when positive, records in every Result the block hashes
	// of its prompt and of its whole sequence (prompt and reply), tokenized
	// as the emulator does, for computing cache bounds.
	BlockTokens int
	// Tag, when set, starts every conversation's first message. Real
	// servers cannot be emptied between runs; a tag of its own per run
	// makes sure no run reuses the cache an earlier one left behind, while
	// prompts shared within the run stay shared.
	Tag string
	// Timeout, when positive, bounds each request in wall time, from
	// sending it to the end of its stream; one that runs out counts as lost
	// or cut like any other failure. A fault run sets it so that a request
	// nobody ever answers cannot keep the run from ending.
	Timeout time.Duration
	// IgnoreEOS asks the server to generate exactly max_tokens (vLLM's and
	// llama.cpp's ignore_eos), so that output lengths are the workload's even
	// when a model would stop early.
	IgnoreEOS bool
	// CheckReplies checks every completed reply's text against the one the
	// emulated backends, seeded EmulatorSeed, give its prompt
	// (Result.TextWrong): they all give an equal prompt an equal reply.
	CheckReplies bool
	EmulatorSeed uint64
	// Start, when not zero, is the run's start, from which arrivals and
	// Result.Sent count; zero: when Run is called.
	Start time.Time
}

// fail records err as the request's failure.
func fail(r *results.Result, err error) {
	r.Err = err
	r.Error = err.Error()
}

// lose records err as a failure before any stream began: no usable answer.
func lose(r *results.Result, err error) {
	fail(r, err)
	r.Lost = true
}

// cut records err as the end of a stream that began; event says whether
// the server said so with an error event.
func cut(r *results.Result, err error, event bool) {
	fail(r, err)
	r.CutWithEvent, r.CutSilent = event, !event
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

// Run plays sessions against the endpoint, every turn carrying the
// conversation so far (the replies the server gave included): open loop,
// each session in its own goroutine from its start time, or closed loop
// with c.Users users. It calls done (if not nil) after each request, from
// any goroutine, and returns every result when all sessions have ended or
// ctx is done.
func (c *Client) Run(ctx context.Context, sessions []workload.Session, done func(results.Result)) []results.Result {
	c.http()
	start := c.Start
	if start.IsZero() {
		start = time.Now()
	}
	var (
		mu  sync.Mutex
		out []results.Result
		wg  sync.WaitGroup
	)
	record := func(r results.Result) {
		mu.Lock()
		out = append(out, r)
		mu.Unlock()
		if done != nil {
			done(r)
		}
	}
	play := func(i int) {
		s := &sessions[i]
		msgs := []message{}
		if s.System != "" {
			msgs = append(msgs, message{Role: "system", Content: c.Tag + s.System})
		}
		for t := range s.Turns {
			turn := &s.Turns[t]
			if !c.sleep(ctx, turn.Think) {
				return
			}
			text := turn.Text()
			if len(msgs) == 0 {
				text = c.Tag + text
			}
			msgs = append(msgs, message{Role: turn.MessageRole(), Content: text})
			res, reply := c.chat(ctx, start, cmp.Or(s.Adapter, s.Model, c.Model), s.ID, msgs, turn.MaxTokens)
			res.Session, res.Turn, res.Heavy = i, t, turn.Heavy
			if c.BlockTokens > 0 && res.Err == nil {
				res.PromptBlocks, res.SequenceBlocks = blocks(msgs, reply, c.BlockTokens)
			}
			if c.CheckReplies && res.Err == nil && turn.MaxTokens > 0 { // no limit: a natural length
				res.TextWrong = reply != emulatorReply(c.EmulatorSeed, msgs, turn.MaxTokens)
			}
			record(res)
			if res.Err != nil {
				return // the conversation cannot go on without its reply
			}
			msgs = append(msgs, message{Role: "assistant", Content: reply})
		}
	}
	if c.Users > 0 {
		next := make(chan int)
		for range c.Users {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range next {
					play(i)
				}
			}()
		}
	feed:
		for i := range sessions {
			select {
			case next <- i:
			case <-ctx.Done():
				break feed
			}
		}
		close(next)
	} else {
		for i := range sessions {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if c.sleepUntil(ctx, start, sessions[i].Start) {
					play(i)
				}
			}()
		}
	}
	wg.Wait()
	return out
}

// blocks returns the block hashes of the prompt the emulator renders for
// msgs, and of that prompt followed by the reply (what its cache holds
// afterwards).
func blocks(msgs []message, reply string, blockTokens int) (prompt, sequence []uint64) {
	tm := make([]tokenizer.Message, len(msgs))
	for i, m := range msgs {
		tm[i] = tokenizer.Message{Role: m.Role, Content: m.Content}
	}
	ids := tokenizer.EncodeChat(nil, tm, true)
	n := len(ids)
	ids = tokenizer.Encode(ids, reply)
	sequence = engine.HashTokens(nil, ids, blockTokens)
	return sequence[:min(len(sequence), n/blockTokens)], sequence
}

// emulatorReply is the text an emulator seeded seed streams for a chat of
// msgs limited to maxTokens tokens: the first maxTokens tokens of the reply
// seeded by its rendered prompt (emulator.newCall).
func emulatorReply(seed uint64, msgs []message, maxTokens int) string {
	tm := make([]tokenizer.Message, len(msgs))
	for i, m := range msgs {
		tm[i] = tokenizer.Message{Role: m.Role, Content: m.Content}
	}
	_, pieces := tokenizer.Generate(tokenizer.ReplySeed(seed, tokenizer.EncodeChat(nil, tm, true)), maxTokens)
	return strings.Join(pieces, "")
}

// model converts a wall duration into model time.
func (c *Client) model(d time.Duration) time.Duration {
	return time.Duration(float64(d) / c.scale())
}

// sleep waits for a model-time duration.
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

// sleepUntil waits until model time at since start (in wall time).
func (c *Client) sleepUntil(ctx context.Context, start time.Time, at time.Duration) bool {
	return c.sleep(ctx, at-c.model(time.Since(start)))
}

type message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// streamChunk is the part of a chat completion stream event the client reads.
type streamChunk struct {
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
	// Timings is llama-server's account of the request; its
	// prompt time is the prefill it computed, without queueing.
	Timings *struct {
		PromptMS float64 `json:"prompt_ms"`
	} `json:"timings"`
	// Error is a failure after the stream began (llama-server and
	// vLLM send one as a data event, then end the stream).
	Error json.RawMessage `json:"error"`
}

// chat sends one streaming chat request and reads the reply. It is a
// little over a hundred lines because it classifies every way a stream can
// end (whole, cut with an error event, cut silently, lost) where it reads
// it, so that each outcome is decided in one place.
func (c *Client) chat(ctx context.Context, start time.Time, model, session string, msgs []message, maxTokens int) (results.Result, string) {
	fields := map[string]any{
		"model":          model,
		"messages":       msgs,
		"max_tokens":     maxTokens,
		"stream":         true,
		"stream_options": map[string]any{"include_usage": true},
	}
	if c.IgnoreEOS {
		fields["ignore_eos"] = true
	}
	body, err := json.Marshal(fields)
	var res results.Result
	if err != nil {
		lose(&res, err)
		return res, ""
	}
	if c.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.Timeout)
		defer cancel()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(c.BaseURL, "/")+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		lose(&res, err)
		return res, ""
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Session-ID", session)
	sent := time.Now()
	res.Sent = c.model(sent.Sub(start))
	resp, err := c.http().Do(req)
	if err != nil {
		lose(&res, err)
		return res, ""
	}
	defer resp.Body.Close()
	res.Status = resp.StatusCode
	res.Backend = resp.Header.Get("X-Kvroute-Backend")
	res.Route = resp.Header.Get("X-Kvroute-Route")
	res.PredictedCached, _ = strconv.Atoi(resp.Header.Get(proxy.HeaderPredictedCached))
	// The router predicts in wall time, as it measures.
	res.PredictedTTFT = c.model(headerSeconds(resp.Header.Get(proxy.HeaderPredictedTTFTSeconds)))
	if lo, hi, ok := strings.Cut(resp.Header.Get(proxy.HeaderPredictedTTFTInterval), " "); ok {
		res.PredictedTTFTLow, res.PredictedTTFTHigh = c.model(headerSeconds(lo)), c.model(headerSeconds(hi))
	}
	res.PredictedITL = c.model(headerSeconds(resp.Header.Get(proxy.HeaderPredictedITL)))
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		lose(&res, fmt.Errorf("status %d: %s", resp.StatusCode, bytes.TrimSpace(msg)))
		return res, ""
	}
	var reply strings.Builder
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	sawDone, chunks := false, 0
	var last time.Time // when the latest content chunk came
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
		var chunk streamChunk
		if err := json.Unmarshal(data, &chunk); err != nil {
			cut(&res, fmt.Errorf("bad event %q: %w", data, err), false)
			return res, ""
		}
		if len(chunk.Error) > 0 && string(chunk.Error) != "null" {
			cut(&res, fmt.Errorf("error in the stream: %s", chunk.Error), true)
			return res, ""
		}
		for _, ch := range chunk.Choices {
			if ch.Delta.Content == "" {
				continue
			}
			chunks++
			now := time.Now()
			if chunks == 1 {
				res.TTFT = c.model(now.Sub(sent))
			} else {
				res.MaxGap = max(res.MaxGap, c.model(now.Sub(last)))
			}
			last = now
			reply.WriteString(ch.Delta.Content)
		}
		if tm := chunk.Timings; tm != nil && tm.PromptMS > 0 {
			res.ServerTTFT = time.Duration(tm.PromptMS * float64(time.Millisecond))
		}
		if u := chunk.Usage; u != nil {
			res.PromptTokens, res.CompletionTokens = u.PromptTokens, u.CompletionTokens
			if u.PromptTokensDetails != nil {
				res.CachedTokens = u.PromptTokensDetails.CachedTokens
			}
		}
	}
	res.E2E = c.model(time.Since(sent))
	// Trailers arrive after the last event: read to the end for them.
	_, _ = io.Copy(io.Discard, resp.Body)
	if v := resp.Trailer.Get(emulator.HeaderModelTTFT); v != "" {
		if secs, err := strconv.ParseFloat(v, 64); err == nil {
			res.ServerTTFT = time.Duration(secs * float64(time.Second))
		}
	}
	if chunks > 1 {
		res.ITL = (res.E2E - res.TTFT) / time.Duration(chunks-1)
	}
	if err := sc.Err(); err != nil {
		cut(&res, err, false)
	} else if !sawDone {
		cut(&res, errors.New("stream ended without [DONE]"), false)
	}
	return res, reply.String()
}

// headerSeconds reads a header's decimal seconds; 0 when absent or bad.
func headerSeconds(v string) time.Duration {
	s, err := strconv.ParseFloat(v, 64)
	if err != nil || s < 0 {
		return 0
	}
	return time.Duration(s * float64(time.Second))
}
