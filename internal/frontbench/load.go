package frontbench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// LoadConfig is one measurement: Streams streams kept open through a front
// for Warmup+Duration, each of Events content events one every Gap.
type LoadConfig struct {
	// Targets are the base URLs streams go to, in turn: the front, or the
	// backends themselves for the direct baseline.
	Targets []string
	// Streams are kept open at once (closed loop); each is Events
	// content events, one every Gap.
	Streams int
	Events  int
	Gap     time.Duration
	// Warmup is the time over which the streams start (connections open,
	// pools fill); streams started in it are not measured. Duration is the
	// time after it in which measured streams start.
	Warmup, Duration time.Duration
	// Model is the requests' model; Seed seeds their prompts and starts.
	Model string
	Seed  uint64
}

// LoadResult is what one measurement saw at the client. Times are in
// milliseconds.
type LoadResult struct {
	// Events counts every content event delivered, warm-up included: the
	// front's CPU time is divided by it.
	Events int64 `json:"events"`
	// Started counts every stream started, warm-up included: the front's
	// allocations are divided by it.
	Started int `json:"started"`
	// Measured counts the streams started after the warm-up; Errors the
	// streams that failed (status, cut, missing events), warm-up included.
	Measured int `json:"measured"`
	Errors   int `json:"errors"`
	// FirstError describes the first failure.
	FirstError string `json:"first_error,omitempty"`
	// TTFT is from sending the request to its first content event;
	// ChunkGap between consecutive events of a stream; Delay from an
	// event's send time at the backend to its arrival.
	TTFT     Quantiles `json:"ttft_ms"`
	ChunkGap Quantiles `json:"chunk_gap_ms"`
	Delay    Quantiles `json:"delay_ms"`
}

// Quantiles summarizes samples in milliseconds.
type Quantiles struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50"`
	P99 float64 `json:"p99"`
}

func quantiles(ds []time.Duration) Quantiles {
	if len(ds) == 0 {
		return Quantiles{}
	}
	slices.Sort(ds)
	at := func(q float64) float64 {
		return float64(ds[min(len(ds)-1, int(q*float64(len(ds))))]) / float64(time.Millisecond)
	}
	return Quantiles{N: len(ds), P50: at(0.5), P99: at(0.99)}
}

// samples are one worker's measurements.
type samples struct {
	ttft, gap, delay          []time.Duration
	events                    int64
	started, measured, errors int
	firstErr                  error
}

// RunLoad plays cfg and returns what the client saw; it ends by itself
// once the last stream started before Warmup+Duration has ended.
func RunLoad(ctx context.Context, cfg LoadConfig) (*LoadResult, error) {
	if len(cfg.Targets) == 0 || cfg.Streams <= 0 || cfg.Events <= 0 {
		return nil, errors.New("load: want targets, streams and events")
	}
	client := &http.Client{Transport: &http.Transport{
		MaxIdleConnsPerHost: cfg.Streams, DisableCompression: true, IdleConnTimeout: time.Minute,
	}}
	defer client.CloseIdleConnections()
	start := time.Now()
	measureFrom, stopAt := start.Add(cfg.Warmup), start.Add(cfg.Warmup+cfg.Duration)
	all := make([]samples, cfg.Streams)
	var wg sync.WaitGroup
	for i := range cfg.Streams {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(cfg.Seed, uint64(i)))
			if cfg.Warmup > 0 {
				time.Sleep(rand.N(cfg.Warmup)) // a spread start, as clients come
			}
			s := &all[i]
			// The first stream is of a random length, so that the
			// streams end, and the next ones start, spread over time
			// as they do in steady state: streams longer than Duration
			// are measured too.
			events := 1 + rng.IntN(cfg.Events)
			for n := 0; ctx.Err() == nil; n++ {
				begin := time.Now()
				if begin.After(stopAt) {
					return
				}
				target := cfg.Targets[(i+n)%len(cfg.Targets)]
				measure := !begin.Before(measureFrom)
				if n > 0 || measure {
					events = cfg.Events
				}
				s.started++
				err := playStream(ctx, client, target, cfg, events, i, rng, s, measure)
				if err != nil {
					s.errors++
					if s.firstErr == nil {
						s.firstErr = err
					}
				}
			}
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var res LoadResult
	var ttft, gap, delay []time.Duration
	for i := range all {
		s := &all[i]
		res.Events += s.events
		res.Started += s.started
		res.Measured += s.measured
		res.Errors += s.errors
		if s.firstErr != nil && res.FirstError == "" {
			res.FirstError = s.firstErr.Error()
		}
		ttft, gap, delay = append(ttft, s.ttft...), append(gap, s.gap...), append(delay, s.delay...)
	}
	res.TTFT, res.ChunkGap, res.Delay = quantiles(ttft), quantiles(gap), quantiles(delay)
	return &res, nil
}

// systemPrompt is the part of every prompt that is shared, as a chat
// application's system prompt is.
var systemPrompt = strings.Repeat("You are a helpful assistant. Answer briefly and precisely. ", 6)

// playStream sends one streamed chat request of events events for user i
// and reads them, recording them into s if measure.
func playStream(ctx context.Context, client *http.Client, target string, cfg LoadConfig, events, user int, rng *rand.Rand, s *samples, measure bool) error {
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"system","content":%q},{"role":"user","content":"Question %d of user %d: tell me about topic %d."}],"stream":true,"max_tokens":%d}`,
		cfg.Model, systemPrompt, rng.IntN(1<<30), user, rng.IntN(1000), events)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Session-ID", "user-"+strconv.Itoa(user))
	req.Header.Set(headerGap, cfg.Gap.String())
	begin := time.Now()
	res, err := client.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(res.Body, 512))
		return fmt.Errorf("status %d: %s", res.StatusCode, bytes.TrimSpace(b))
	}
	br := bufio.NewReaderSize(res.Body, 16<<10)
	var prev time.Time
	got := 0
	var ttft time.Duration
	var gaps, delays []time.Duration
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return err
		}
		i := bytes.LastIndex(line, []byte(`"sent":`))
		if i < 0 || !bytes.HasPrefix(line, []byte("data: {")) {
			continue
		}
		now := time.Now()
		sent := intField(line[i:], `"sent":`)
		got++
		s.events++
		if !measure {
			continue
		}
		delays = append(delays, now.Sub(time.Unix(0, int64(sent))))
		if got == 1 {
			ttft = now.Sub(begin)
		} else {
			gaps = append(gaps, now.Sub(prev))
		}
		prev = now
	}
	if got != events {
		return fmt.Errorf("stream ended after %d of %d events", got, events)
	}
	if measure {
		s.measured++
		s.ttft = append(s.ttft, ttft)
		s.gap = append(s.gap, gaps...)
		s.delay = append(s.delay, delays...)
	}
	return nil
}
