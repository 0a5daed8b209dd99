//go:build unix

package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/emulator"
	"github.com/kvroute/kvroute/internal/testfleet"
)

// The non-streamed deadline of TestChaosHangNonStreamed: floor + factor ×
// (predicted TTFT + maxTokens × token time).
const (
	responseFloor     = 2 * time.Second
	responseFactor    = 2.0
	responseTokenTime = 20 * time.Millisecond
	nonStreamedTokens = 20
)

// A backend that accepts non-streamed requests and never answers holds
// none of them past its deadline: 30 requests, every one answered by
// another backend, none lost.
func TestChaosHangNonStreamed(t *testing.T) {
	emus := testfleet.Start(t, 3, "--seed", "6", "--time-scale", "0.1")
	emus[2].SetFaults(emulator.Faults{Hang: true})
	s := startRouter(t, emus, func(c *Config) {
		r := &c.Proxy.Resilience
		r.ResponseFloor, r.ResponseFactor, r.ResponseTokenTime = responseFloor, responseFactor, responseTokenTime
	})
	type answer struct {
		status  int
		text    string
		elapsed time.Duration
		err     error
	}
	out := make([]answer, 30)
	var wg sync.WaitGroup
	for i := range out {
		wg.Go(func() {
			start := time.Now()
			status, text, err := complete(s.URL, nonStreamedTokens, fmt.Sprintf("request %d: a short answer", i))
			out[i] = answer{status, text, time.Since(start), err}
		})
	}
	wg.Wait()
	// The deadline with a predicted TTFT of up to a second (the emulators'
	// are milliseconds), and the retry's own answer.
	bound := responseFloor + time.Duration(responseFactor*float64(time.Second+nonStreamedTokens*responseTokenTime))
	limit := bound + 5*time.Second
	var took []time.Duration
	for i, a := range out {
		if a.err != nil || a.status != http.StatusOK || a.text == "" {
			t.Errorf("request %d: status %d, text %q, err %v", i, a.status, a.text, a.err)
		}
		if a.elapsed > limit {
			t.Errorf("request %d took %v, more than its deadline (%v) and a retry allow", i, a.elapsed, bound)
		}
		took = append(took, a.elapsed)
	}
	slices.Sort(took)
	hung := faultsServed(t, emus[2], "hang")
	t.Logf("30 non-streamed requests, %v of them sent to the hung backend first: slowest %v, median %v (deadline %v at most)",
		hung, took[len(took)-1].Round(time.Millisecond), took[len(took)/2].Round(time.Millisecond), bound)
	if hung == 0 {
		t.Error("no request reached the hung backend: the test proves nothing")
	}
}

// complete sends one non-streamed chat request and returns its status and
// the reply's text.
func complete(url string, maxTokens int, text string) (int, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":%d}`, model, text, maxTokens)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer res.Body.Close()
	data, err := io.ReadAll(res.Body)
	if err != nil {
		return res.StatusCode, "", err
	}
	var r struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(data, &r); err != nil || len(r.Choices) != 1 {
		return res.StatusCode, "", fmt.Errorf("body %s: %v", data, err)
	}
	return res.StatusCode, r.Choices[0].Message.Content, nil
}
