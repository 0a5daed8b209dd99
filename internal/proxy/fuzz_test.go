package proxy

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http/httptest"
	"testing"
)

// The fuzz targets' seed corpora are under testdata/fuzz/<target>/; CI runs
// each target for a few seconds (.ci/run).

// FuzzParseGeneration feeds request bodies to the chat and completion
// parser, and the chat bodies to the Responses API parser too. It must not
// panic; it either accepts the body with a model, or refuses it with a 4xx
// OpenAI error; and when it asks the backend for the usage chunk the body
// it sends stays valid JSON.
func FuzzParseGeneration(f *testing.F) {
	f.Add([]byte(chatBody), true, "")
	f.Add([]byte(`{"model":"m","prompt":["a","b"],"max_tokens":3,"stream":true}`), false, "s")
	f.Add([]byte(`{"model":"m","instructions":"S","input":[{"role":"user","content":[{"type":"input_text","text":"a"}]},`+
		`{"type":"function_call","call_id":"c","arguments":"{}"}],"previous_response_id":"r","metadata":{"session_id":"s"}}`), true, "")
	f.Fuzz(func(t *testing.T, body []byte, chat bool, session string) {
		ep := endpointCompletion
		if chat {
			ep = endpointChat
		}
		fuzzGeneration(t, ep, body, session)
		if chat {
			fuzzGeneration(t, endpointResponses, body, session)
		}
	})
}

// fuzzGeneration checks parseGeneration's result for one body at ep.
func fuzzGeneration(t *testing.T, ep endpoint, body []byte, session string) {
	t.Helper()
	g, e := parseGeneration(ep, body, session)
	if e != nil {
		if g != nil {
			t.Fatal("both a result and an error")
		}
		assertAPIError(t, e)
		return
	}
	if g.req.Model == "" {
		t.Fatalf("accepted %q without a model", body)
	}
	if n := estimateTokens(&g.req); n < 0 {
		t.Fatalf("estimated %d tokens", n)
	}
	if g.stream && !g.includeUsage {
		out, _ := withIncludeUsage(body)
		if json.Valid(body) && !json.Valid(out) {
			t.Fatalf("withIncludeUsage(%q) = %q, not JSON", body, out)
		}
	}
}

// assertAPIError checks that e is a client error that renders as an
// OpenAI-shaped body.
func assertAPIError(t *testing.T, e *apiError) {
	t.Helper()
	if e.Status < 400 || e.Status > 499 || e.Type != typeInvalidRequest || e.Message == "" {
		t.Fatalf("error %+v is not a client error", e)
	}
	rec := httptest.NewRecorder()
	writeError(rec, e)
	var got struct {
		Error *struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Param   *string `json:"param"`
			Code    *string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil || got.Error == nil || got.Error.Message != e.Message {
		t.Fatalf("error body %q is not OpenAI-shaped: %v", rec.Body, err)
	}
}

// FuzzJSONScan checks the JSON scanner against encoding/json: on any input
// it stays in bounds and does not panic, and on a valid object every member
// it finds is a valid JSON value, found in the order and number
// encoding/json finds them.
func FuzzJSONScan(f *testing.F) {
	f.Add([]byte(`{"a":1,"b":[true,null,{"c":"\u0065"}],"d":"x\"y"}`))
	f.Add([]byte(` [1, "two", {"three": 3}] `))
	f.Fuzz(func(t *testing.T, data []byte) {
		n := 0
		for m := range members(data) {
			if m.key < 0 || m.val <= m.key || m.end < m.val || m.end > len(data) {
				t.Fatalf("member %+v out of bounds of %d bytes", m, len(data))
			}
			if json.Valid(data) && !json.Valid(data[m.val:m.end]) {
				t.Fatalf("member %q of valid %q is not valid JSON", data[m.val:m.end], data)
			}
			_ = m.is("model")
			n++
		}
		for e := range elems(data) {
			_ = stringValue(e)
			_ = intValue(e)
			_ = appendCompact(nil, e)
			_ = appendString(nil, e)
		}
		_ = field(data, "usage")
		_, _ = parseUsage(data)
		if !json.Valid(data) {
			return
		}
		var obj map[string]json.RawMessage
		if json.Unmarshal(data, &obj) == nil {
			dec := json.NewDecoder(bytes.NewReader(data))
			_, _ = dec.Token() // {
			want := 0
			for dec.More() {
				if _, err := dec.Token(); err != nil { // the key
					return
				}
				var v json.RawMessage
				if err := dec.Decode(&v); err != nil {
					return
				}
				want++
			}
			if n != want {
				t.Fatalf("found %d members in %q, encoding/json %d", n, data, want)
			}
		}
		if c := appendCompact(nil, data); !json.Valid(c) {
			t.Fatalf("appendCompact(%q) = %q, not JSON", data, c)
		}
	})
}

// chunkReader returns its bytes at most n at a time, as a backend's stream
// arrives in pieces.
type chunkReader struct {
	b []byte
	n int
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	k := min(len(p), r.n, len(r.b))
	copy(p, r.b[:k])
	r.b = r.b[k:]
	return k, nil
}

// FuzzEventStream feeds event streams through copyEvents in pieces of any
// size. It must not panic; what comes out must not depend on how the
// stream was cut into reads; without hideUsage the stream passes
// byte-for-byte; with it, the only edits are dropped usage-only events and
// cut `"usage":null` members, so a stream without "usage" passes as is.
func FuzzEventStream(f *testing.F) {
	f.Add([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\ndata: [DONE]\n\n"), true, uint8(3))
	f.Add([]byte(": keep-alive\r\n\r\nevent: x\ndata: {}\n\n"), false, uint8(0))
	f.Fuzz(func(t *testing.T, stream []byte, hideUsage bool, piece uint8) {
		run := func(n int) (string, eventScanner) {
			rec := httptest.NewRecorder()
			sc := eventScanner{hideUsage: hideUsage}
			firsts := 0
			readErr, writeErr := copyEvents(rec, &chunkReader{b: stream, n: n}, &sc, func() { firsts++ })
			if readErr != nil || writeErr != nil {
				t.Fatalf("copyEvents: %v, %v", readErr, writeErr)
			}
			if firsts > 1 || (firsts == 1) != (sc.tokens > 0) {
				t.Fatalf("onFirst called %d times for %d content chunks", firsts, sc.tokens)
			}
			return rec.Body.String(), sc
		}
		whole, sc1 := run(len(stream) + 1)
		cut, sc2 := run(int(piece) + 1)
		if whole != cut || sc1 != sc2 {
			t.Fatalf("reads of %d bytes gave %q %+v, one read %q %+v", piece+1, cut, sc2, whole, sc1)
		}
		if len(whole) > len(stream) {
			t.Fatalf("output %q longer than input %q", whole, stream)
		}
		if (!hideUsage || !bytes.Contains(stream, []byte("usage"))) && whole != string(stream) {
			t.Fatalf("stream %q came out as %q", stream, whole)
		}
	})
}
