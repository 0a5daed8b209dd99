package sse

import (
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestRecord(t *testing.T) {
	chunk := func(choice string) string {
		return `data: {"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[` + choice + `]}` + "\n\n"
	}
	tests := []struct {
		name       string
		stream     string
		wantText   string
		wantChunks int
		other      bool
		finished   bool
		failed     bool
		wantOut    string // the end of what reached the client
	}{
		{"chat", chunk(`{"index":0,"delta":{"role":"assistant","content":""}}`) + chunk(`{"index":0,"delta":{"content":"Hi \"x\"\n"}}`) +
			chunk(`{"index":0,"delta":{"content":" there"}}`) + chunk(`{"index":0,"delta":{},"finish_reason":"stop"}`) + "data: [DONE]\n\n",
			"Hi \"x\"\n there", 2, false, true, false, "data: [DONE]\n\n"},
		{"completion", `data: {"id":"c1","created":7,"model":"m","choices":[{"index":0,"text":"Once","logprobs":null,"finish_reason":null}]}` + "\n\n",
			"Once", 1, false, false, false, ""},
		{"a tool call", chunk(`{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"a\""}}]}}`), "", 0, true, false, false, ""},
		{"another choice", chunk(`{"index":1,"delta":{"content":"x"}}`), "", 0, true, false, false, ""},
		{"logprobs", chunk(`{"index":0,"delta":{"content":"x"},"logprobs":{"content":[]}}`), "x", 1, true, false, false, ""},
		{"error event", chunk(`{"index":0,"delta":{"content":"Hi"}}`) + `data: {"error":{"message":"boom"}}` + "\n\ndata: [DONE]\n\n",
			"Hi", 1, false, false, true, `"Hi"}}]}` + "\n\n"},
		{"vLLM's older error", chunk(`{"index":0,"delta":{"content":"Hi"}}`) + `data: {"object":"error","message":"boom"}` + "\n\ndata: [DONE]\n\n",
			"Hi", 1, false, false, true, `"Hi"}}]}` + "\n\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := NewRecord()
			w := httptest.NewRecorder()
			rerr, werr := Copy(w, strings.NewReader(tt.stream), &Scanner{Rec: rec}, nil)
			if werr != nil || (rerr != nil) != tt.failed || tt.failed && !errors.Is(rerr, ErrErrorEvent) {
				t.Errorf("Copy = %v, %v", rerr, werr)
			}
			if string(rec.Text) != tt.wantText || rec.Chunks != tt.wantChunks || rec.Other != tt.other ||
				rec.Finished != tt.finished || (rec.Failed != nil) != tt.failed {
				t.Errorf("recorded %q in %d chunks, other %v, finished %v, failed %q", rec.Text, rec.Chunks, rec.Other, rec.Finished, rec.Failed)
			}
			if string(rec.ID) != `"c1"` || string(rec.Created) != "7" || string(rec.Model) != `"m"` {
				t.Errorf("identity %s %s %s", rec.ID, rec.Created, rec.Model)
			}
			if out := w.Body.String(); !strings.HasSuffix(out, tt.wantOut) || tt.failed && strings.Contains(out, "boom") {
				t.Errorf("the client got %q", out)
			}
		})
	}
}
