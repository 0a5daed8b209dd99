package frontbench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
)

// Backends is the backends' process: n fast streaming servers that answer
// as much of vLLM's API as a front needs (/health, /v1/models, /metrics and
// streamed chat completions) and spend as little CPU as a server can, so
// that what a front adds is what is measured.
type Backends struct {
	// URLs are the servers' base URLs, http://127.0.0.1:PORT.
	URLs []string

	servers []*http.Server
}

// Request parameters of a stream: max_tokens in the body is the number of
// content events; the gap between them is this header's Go duration.
const headerGap = "X-Bench-Gap"

// StartBackends starts n streaming servers on 127.0.0.1 serving model.
func StartBackends(n int, model string) (*Backends, error) {
	bs := &Backends{}
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			bs.Close()
			return nil, err
		}
		st := &streamer{model: model}
		srv := &http.Server{Handler: st, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		bs.servers = append(bs.servers, srv)
		bs.URLs = append(bs.URLs, "http://"+ln.Addr().String())
	}
	return bs, nil
}

// Close stops the servers at once.
func (bs *Backends) Close() {
	for _, s := range bs.servers {
		_ = s.Close()
	}
}

// Shutdown stops the servers once their streams end, or at ctx's end.
func (bs *Backends) Shutdown(ctx context.Context) error {
	var errs []error
	for _, s := range bs.servers {
		errs = append(errs, s.Shutdown(ctx))
	}
	return errors.Join(errs...)
}

// streamer is one backend.
type streamer struct {
	model   string
	running atomic.Int64
}

func (s *streamer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/health":
		_, _ = io.WriteString(w, "ok\n")
	case "/v1/models":
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"object":"list","data":[{"id":%q,"object":"model"}]}`, s.model)
	case "/metrics":
		// The load gauges kvroute scrapes from vLLM.
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprintf(w, "vllm:num_requests_running %d\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0\n", s.running.Load())
	case "/v1/chat/completions":
		s.stream(w, r)
	default:
		http.NotFound(w, r)
	}
}

// stream answers a chat completion with max_tokens content events, the
// first at once and then one every gap, each stamped with its send time
// (Unix nanoseconds) so that the client can time its delivery; then the
// usage chunk if the request asked for it, and [DONE].
func (s *streamer) stream(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		return
	}
	events := intField(body, `"max_tokens":`)
	gap, err := time.ParseDuration(r.Header.Get(headerGap))
	if events <= 0 || err != nil {
		http.Error(w, "want max_tokens and "+headerGap, http.StatusBadRequest)
		return
	}
	s.running.Add(1)
	defer s.running.Add(-1)
	w.Header().Set("Content-Type", "text/event-stream")
	rc := http.NewResponseController(w)
	buf := make([]byte, 0, 512)
	const head = `data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" tok"},"logprobs":null,"finish_reason":null}],"sent":`
	next := time.Now()
	for i := range events {
		if i > 0 {
			next = next.Add(gap)
			time.Sleep(time.Until(next))
		}
		buf = append(buf[:0], head...)
		buf = strconv.AppendInt(buf, time.Now().UnixNano(), 10)
		buf = append(buf, "}\n\n"...)
		if _, err := w.Write(buf); err != nil {
			return
		}
		if rc.Flush() != nil {
			return
		}
	}
	if bytes.Contains(body, []byte(`"include_usage":true`)) {
		fmt.Fprintf(w, `data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":0}}}`+"\n\n",
			len(body)/4, events, len(body)/4+events)
	}
	_, _ = io.WriteString(w, "data: [DONE]\n\n")
}

// intField reads the integer after key in b; 0 if there is none.
func intField(b []byte, key string) int {
	i := bytes.Index(b, []byte(key))
	if i < 0 {
		return 0
	}
	b = bytes.TrimLeft(b[i+len(key):], " ")
	n := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			break
		}
		n = n*10 + int(c-'0')
	}
	return n
}
