package epp

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvroute/kvroute/internal/emulator"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/router/policies"
	"github.com/kvroute/kvroute/internal/server"
)

// The harness plays Envoy's part of the ext_proc protocol exactly as the
// ext_proc filter does in FULL_DUPLEX_STREAMED mode, over a real gRPC
// connection on loopback, and carries the request to the endpoint the
// picker named itself, as Envoy's ORIGINAL_DST cluster would.

// emulators starts n emulated vLLM servers, equal seeds (so that a prompt
// gets the same reply wherever it goes), and returns them as backends.
func emulators(t testing.TB, ctx context.Context, n int) []*fleet.Backend {
	t.Helper()
	var bs []*fleet.Backend
	for i := range n {
		e, err := emulator.New(emulator.Config{Seed: 1, TimeScale: 0.05, Logger: quiet()})
		if err != nil {
			t.Fatal(err)
		}
		go e.Run(ctx)
		ts := httptest.NewServer(e)
		t.Cleanup(ts.Close)
		b, err := fleet.ParseBackend(i, fmt.Sprintf("gpu%d=%s", i, ts.URL))
		if err != nil {
			t.Fatal(err)
		}
		bs = append(bs, b)
	}
	return bs
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// startPicker starts an endpoint picker for bs on loopback and returns it
// with an Envoy stand-in connected to it.
func startPicker(t testing.TB, ctx context.Context, bs []*fleet.Backend, policy string, po Options) (*Server, *envoy) {
	t.Helper()
	s, err := Start(ctx, Config{CoreConfig: server.CoreConfig{Backends: bs, Policy: policy, Router: policies.Options{Seed: 1}, Logger: quiet()},
		Picker: po, GRPCListen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	env := connect(t, s)
	for _, b := range bs {
		env.pool[Address(b)] = true
	}
	return s, env
}

// connect returns an Envoy stand-in connected to the picker s, with an
// empty pool.
func connect(t testing.TB, s *Server) *envoy {
	t.Helper()
	conn, err := grpc.NewClient(s.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &envoy{ext: extprocv3.NewExternalProcessorClient(conn), pool: map[string]bool{}, http: &http.Client{}}
}

// envoy is the data plane's side of the protocol.
type envoy struct {
	ext  extprocv3.ExternalProcessorClient
	pool map[string]bool
	http *http.Client
	// chunks is how many pieces the request body is sent in.
	chunks int
	// method is the requests' method (default POST); a request without a
	// body ends with its headers.
	method string
	// subset, when not nil, is sent as the subset hint in the request's
	// metadata_context: a []string is sent as a list, a string as one
	// comma-separated value (proxies write either).
	subset any
	// originalDst accepts a header naming the chosen endpoint alone while
	// the metadata has the list (Options.OriginalDstHeader); otherwise the
	// two must be equal, as the protocol says.
	originalDst bool
	// serve chooses, from the destination list, the endpoint Envoy sends
	// the request to and reports as served (default: the first, as when
	// it answers).
	serve func(list []string) string
	// rewrites lets the picker change the response body (the Responses
	// API's ids); otherwise it must come back exactly as the endpoint
	// sent it.
	rewrites bool
}

// exchangeResult is what one request through the harness saw.
type exchangeResult struct {
	// status is the client's status: the backend's, or the immediate
	// response's.
	status     int
	immediate  bool
	retryAfter string
	// dest is the header's value, list the metadata's.
	dest string
	list []string
	body []byte
	// upstream is the body the endpoint sent, path the path it was asked
	// for, dropLength set when the picker removed the response's
	// content-length.
	upstream   []byte
	path       string
	dropLength bool
	// prefiller is the HeaderPrefiller the reply set; removed the headers
	// it removed (disagg.go).
	prefiller string
	removed   []string
}

func hv(k, v string) *corev3.HeaderValue { return &corev3.HeaderValue{Key: k, RawValue: []byte(v)} }

// do sends one request through the picker and, if it routes it, to the
// chosen endpoint, feeding the response back through the stream.
func (e *envoy) do(ctx context.Context, path string, headers map[string]string, body []byte) (exchangeResult, error) {
	var res exchangeResult
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := e.ext.Process(ctx)
	if err != nil {
		return res, err
	}
	method := cmp.Or(e.method, http.MethodPost)
	hs := []*corev3.HeaderValue{hv(":method", method), hv(":path", path), hv(":authority", "gateway")}
	if body != nil {
		hs = append(hs, hv("content-type", "application/json"), hv("content-length", strconv.Itoa(len(body))))
	}
	for k, v := range headers {
		hs = append(hs, hv(k, v))
	}
	// Headers, then every body chunk, without waiting for any reply.
	if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: hs}, EndOfStream: body == nil}},
		MetadataContext: e.subsetMetadata()}); err != nil {
		return res, err
	}
	n := max(e.chunks, 1)
	if body == nil {
		n = 0
	}
	for i := range n {
		part := body[i*len(body)/n : (i+1)*len(body)/n]
		if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: part, EndOfStream: i == n-1}}}); err != nil {
			return res, err
		}
	}

	// The header reply comes first: a body reply before it is a "spurious
	// message" to Envoy.
	m, err := st.Recv()
	if err != nil {
		return res, err
	}
	if ir := m.GetImmediateResponse(); ir != nil {
		res.immediate, res.status, res.body = true, int(ir.GetStatus().GetCode()), ir.GetBody()
		for _, h := range ir.GetHeaders().GetSetHeaders() {
			if strings.EqualFold(h.GetHeader().GetKey(), "retry-after") {
				res.retryAfter = string(h.GetHeader().GetRawValue())
			}
		}
		return res, nil
	}
	hr := m.GetRequestHeaders()
	if hr == nil {
		return res, fmt.Errorf("first reply is %T, want the request headers' reply", m.GetResponse())
	}
	contentLength := -1
	res.path = path
	for _, h := range hr.GetResponse().GetHeaderMutation().GetSetHeaders() {
		hdr := h.GetHeader()
		if hdr.GetValue() != "" || len(hdr.GetRawValue()) == 0 {
			return res, fmt.Errorf("header %s: value %q, raw_value %q: want raw_value only", hdr.GetKey(), hdr.GetValue(), hdr.GetRawValue())
		}
		switch strings.ToLower(hdr.GetKey()) {
		case HeaderDestination:
			res.dest = string(hdr.GetRawValue())
		case "content-length":
			contentLength, _ = strconv.Atoi(string(hdr.GetRawValue()))
		case ":path":
			res.path = string(hdr.GetRawValue())
		case HeaderPrefiller:
			res.prefiller = string(hdr.GetRawValue())
		}
	}
	res.removed = hr.GetResponse().GetHeaderMutation().GetRemoveHeaders()
	lb := m.GetDynamicMetadata().GetFields()[MetadataNamespace].GetStructValue()
	if lb == nil {
		return res, errors.New("no envoy.lb dynamic metadata")
	}
	md := lb.GetFields()[HeaderDestination].GetStringValue()
	res.list = strings.Split(md, ",")
	switch {
	case res.dest == "" || res.list[0] != strings.Split(res.dest, ",")[0]:
		return res, fmt.Errorf("header %q and metadata %q disagree on the chosen endpoint", res.dest, md)
	case !e.originalDst && res.dest != md:
		// The protocol's MUST ("Destination Endpoint", Constraints).
		return res, fmt.Errorf("header %q and metadata %q differ", res.dest, md)
	}
	for _, a := range res.list {
		if !e.pool[a] {
			return res, fmt.Errorf("endpoint %q is not in the pool", a)
		}
	}
	if len(slices.Compact(slices.Sorted(slices.Values(res.list)))) != len(res.list) {
		return res, fmt.Errorf("destination list %q repeats an endpoint", res.list)
	}

	// Then the body, as streamed body responses, to end_of_stream.
	var fwd []byte
	for body != nil {
		m, err := st.Recv()
		if err != nil {
			return res, err
		}
		sr := m.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		if sr == nil {
			return res, fmt.Errorf("got %T while the request body was due as streamed body responses", m.GetResponse())
		}
		fwd = append(fwd, sr.GetBody()...)
		if sr.GetEndOfStream() {
			break
		}
	}
	if body != nil && contentLength != len(fwd) {
		return res, fmt.Errorf("content-length %d for a body of %d bytes", contentLength, len(fwd))
	}

	// Envoy connects to the chosen endpoint (ORIGINAL_DST), or to the
	// one serve names (override_host walking the list on a retry).
	target := res.list[0]
	if e.serve != nil {
		target = e.serve(res.list)
	}
	req, _ := http.NewRequestWithContext(ctx, method, "http://"+target+res.path, bytes.NewReader(fwd))
	req.Header.Set("Content-Type", "application/json")
	resp, err := e.http.Do(req)
	if err != nil {
		return res, err
	}
	defer resp.Body.Close()
	res.status = resp.StatusCode
	served, _ := structpb.NewStruct(map[string]any{KeyServed: target})
	if err := st.Send(&extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			hv(":status", strconv.Itoa(resp.StatusCode)), hv("content-type", resp.Header.Get("Content-Type"))}}}},
		MetadataContext: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{MetadataNamespace: served}},
	}); err != nil {
		return res, err
	}
	if m, err := st.Recv(); err != nil {
		return res, err
	} else if m.GetResponseHeaders() == nil {
		return res, fmt.Errorf("got %T, want the response headers' reply", m.GetResponse())
	} else {
		res.dropLength = slices.Contains(m.GetResponseHeaders().GetResponse().GetHeaderMutation().GetRemoveHeaders(), "content-length")
	}

	// The response body goes through the picker as it arrives, each chunk
	// sent without waiting for the echo of the one before.
	sent := make(chan []byte, 1)
	go func() {
		var all []byte
		buf := make([]byte, 4096)
		for {
			k, err := resp.Body.Read(buf)
			if k > 0 {
				all = append(all, buf[:k]...)
				if st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
					ResponseBody: &extprocv3.HttpBody{Body: slices.Clone(buf[:k])}}}) != nil {
					break
				}
			}
			if err != nil {
				// The last chunk: empty, end_of_stream, as Envoy sends it
				// when the upstream ends the body.
				_ = st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
					ResponseBody: &extprocv3.HttpBody{EndOfStream: true}}})
				break
			}
		}
		sent <- all
	}()
	for {
		m, err := st.Recv()
		if err != nil {
			return res, err
		}
		sr := m.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		if sr == nil {
			return res, fmt.Errorf("got %T while the response body was due", m.GetResponse())
		}
		res.body = append(res.body, sr.GetBody()...)
		if sr.GetEndOfStream() {
			break
		}
	}
	res.upstream = <-sent
	if !e.rewrites && !bytes.Equal(res.upstream, res.body) {
		return res, fmt.Errorf("the response body came back changed: %d bytes sent, %d back", len(res.upstream), len(res.body))
	}
	if !bytes.Equal(res.upstream, res.body) && !res.dropLength {
		return res, errors.New("the response body came back changed, its content-length kept")
	}
	if err := st.CloseSend(); err != nil {
		return res, err
	}
	if _, err := st.Recv(); !errors.Is(err, io.EOF) {
		return res, fmt.Errorf("after the response, the stream ended with %v, want EOF", err)
	}
	return res, nil
}

// subsetMetadata is the request's metadata_context carrying e.subset, or
// nil.
func (e *envoy) subsetMetadata() *corev3.Metadata {
	if e.subset == nil {
		return nil
	}
	v := e.subset
	if l, ok := v.([]string); ok {
		items := make([]any, len(l))
		for i, a := range l {
			items[i] = a
		}
		v = items
	}
	hint, err := structpb.NewStruct(map[string]any{KeySubset: v})
	if err != nil {
		panic(err) // a test's mistake
	}
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{SubsetNamespace: hint}}
}

// chatBody is a streamed chat request with usage, as the workload's client
// sends it.
func chatBody(model string, msgs []message, maxTokens int) []byte {
	b, _ := json.Marshal(map[string]any{"model": model, "messages": msgs, "max_tokens": maxTokens,
		"stream": true, "stream_options": map[string]any{"include_usage": true}})
	return b
}

type message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// reply reads a streamed response: the assistant's text and the usage.
func reply(body []byte) (text string, prompt, cached int) {
	w := newWatcher(true)
	var sb strings.Builder
	for line := range bytes.SplitSeq(body, []byte("\n")) {
		data, ok := bytes.CutPrefix(line, []byte("data: "))
		if !ok || !bytes.HasPrefix(data, []byte("{")) {
			continue
		}
		var c chunkJSON
		if json.Unmarshal(data, &c) == nil {
			for _, ch := range c.Choices {
				sb.WriteString(ch.Delta.Content)
			}
		}
	}
	w.feed(body)
	return sb.String(), w.prompt, w.cached
}
