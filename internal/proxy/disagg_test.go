package proxy

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/router"
)

// prefillAnswer is what a vLLM prefill server with NixlConnector answers:
// the transfer parameters that name its KV blocks.
const prefillAnswer = `{"id":"cmpl-p","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"A"},"finish_reason":"length"}],` +
	`"usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10},` +
	`"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[1,2],"remote_engine_id":"p-engine","remote_request_id":"r1","remote_host":"10.0.0.9","remote_port":5600,"tp_size":1}}`

const decodeAnswer = `{"id":"cmpl-d","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"All done."},"finish_reason":"stop"}],` +
	`"usage":{"prompt_tokens":9,"completion_tokens":3,"total_tokens":12}}`

func decodeJSON(t *testing.T, s string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		t.Fatalf("%v: %s", err, s)
	}
	return m
}

func TestDisaggSequentialWire(t *testing.T) {
	pre, preSeen := recordingBackend(t, http.StatusOK, http.Header{"Content-Type": {"application/json"}}, prefillAnswer)
	dec, decSeen := recordingBackend(t, http.StatusOK, http.Header{"Content-Type": {"application/json"}}, decodeAnswer)
	pb, db := testBackend(t, 0, "p", pre.URL, "m"), testBackend(t, 1, "d", dec.URL, "m")
	pb.SetRole(fleet.RolePrefill)
	pol := newFirstPolicy()
	_, px := newTestProxy(t, newFakeFleet(pb, db), pol, nil)

	const body = `{"model":"m","messages":[{"role":"user","content":"Summarise the report."}],"max_tokens":50,"max_completion_tokens":50,"min_tokens":5,"stream":false,"temperature":0}`
	res, got := post(t, px.URL, "/v1/chat/completions", body)
	if res.StatusCode != http.StatusOK || got != decodeAnswer {
		t.Fatalf("status %d body %s, want the decode's answer", res.StatusCode, got)
	}
	p := <-preSeen
	pm := decodeJSON(t, p.body)
	for k, want := range map[string]any{"max_tokens": 1.0, "max_completion_tokens": 1.0, "stream": false, "temperature": 0.0} {
		if pm[k] != want {
			t.Errorf("prefill leg %s = %v, want %v", k, pm[k], want)
		}
	}
	for _, k := range []string{"stream_options", "min_tokens"} {
		if _, ok := pm[k]; ok {
			t.Errorf("prefill leg kept %s", k)
		}
	}
	wantKV := map[string]any{"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": nil,
		"remote_block_ids": nil, "remote_host": nil, "remote_port": nil}
	kv, _ := pm["kv_transfer_params"].(map[string]any)
	if len(kv) != len(wantKV) {
		t.Errorf("prefill kv_transfer_params %v, want %v", kv, wantKV)
	}
	for k, v := range wantKV {
		if got, ok := kv[k]; !ok || got != v {
			t.Errorf("prefill kv_transfer_params[%s] = %v, want %v", k, got, v)
		}
	}
	d := <-decSeen
	if p.header.Get(HeaderRequestID) == "" || p.header.Get(HeaderRequestID) != d.header.Get(HeaderRequestID) {
		t.Errorf("request ids: prefill %q decode %q, want one id", p.header.Get(HeaderRequestID), d.header.Get(HeaderRequestID))
	}
	dm := decodeJSON(t, d.body)
	if dm["max_tokens"] != 50.0 || dm["min_tokens"] != 5.0 || dm["stream"] != false {
		t.Errorf("decode leg lost the client's limits: %s", d.body)
	}
	want := decodeJSON(t, prefillAnswer)["kv_transfer_params"]
	gotKV, _ := json.Marshal(dm["kv_transfer_params"])
	wantJSON, _ := json.Marshal(want)
	if string(gotKV) != string(wantJSON) {
		t.Errorf("decode kv_transfer_params %s, want the prefill's %s", gotKV, wantJSON)
	}
	if o := pol.outcome(t); o.Decision.Backend != db {
		t.Errorf("decode routed to %s, want d", o.Decision.Backend.Name)
	}
	assertIdle(t, pb, db)
}

func TestDisaggFallsBack(t *testing.T) {
	tests := []struct {
		name   string
		status int
		answer string
	}{
		{name: "500", status: http.StatusInternalServerError, answer: `{"error":{"message":"boom"}}`},
		{name: "no params", status: http.StatusOK, answer: decodeAnswer},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pre1, seen1 := recordingBackend(t, tt.status, nil, tt.answer)
			pre2, seen2 := recordingBackend(t, tt.status, nil, tt.answer)
			dec, decSeen := recordingBackend(t, http.StatusOK, http.Header{"Content-Type": {"application/json"}}, decodeAnswer)
			p1, p2, db := testBackend(t, 0, "p1", pre1.URL, "m"), testBackend(t, 1, "p2", pre2.URL, "m"), testBackend(t, 2, "d", dec.URL, "m")
			p1.SetRole(fleet.RolePrefill)
			p2.SetRole(fleet.RolePrefill)
			ff := newFakeFleet(p1, p2, db)
			_, px := newTestProxy(t, ff, newFirstPolicy(), nil)
			res, got := post(t, px.URL, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`)
			if res.StatusCode != http.StatusOK || got != decodeAnswer {
				t.Fatalf("status %d body %s, want the decode's answer", res.StatusCode, got)
			}
			<-seen1 // each prefill server tried once
			<-seen2
			if d := <-decSeen; strings.Contains(d.body, "kv_transfer_params") {
				t.Errorf("the fallback sent transfer parameters: %s", d.body)
			}
			if tt.status == http.StatusInternalServerError {
				for _, b := range []*fleet.Backend{p1, p2} {
					if got := ff.reported(b.Name); !slices.Equal(got, []fleet.ResultKind{fleet.ResultServerError}) {
						t.Errorf("%s reported %v, want one server error", b.Name, got)
					}
				}
			}
			assertIdle(t, p1, p2, db)
		})
	}
}

func TestDisaggNeverAndRoles(t *testing.T) {
	pre, preSeen := recordingBackend(t, http.StatusOK, nil, prefillAnswer)
	dec, decSeen := recordingBackend(t, http.StatusOK, http.Header{"Content-Type": {"application/json"}}, decodeAnswer)
	pb, db := testBackend(t, 0, "p", pre.URL, "m"), testBackend(t, 1, "d", dec.URL, "m")
	pb.SetRole(fleet.RolePrefill)
	pol := newFirstPolicy()
	_, px := newTestProxy(t, newFakeFleet(pb, db), pol, func(c *Config) { c.Disagg.Splitter = router.SplitNever{} })
	for range 3 {
		if res, _ := post(t, px.URL, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`); res.StatusCode != http.StatusOK {
			t.Fatalf("status %d", res.StatusCode)
		}
		<-decSeen
	}
	select {
	case s := <-preSeen:
		t.Errorf("the prefill server got a request: %s", s.body)
	default:
	}
	// The prefill server is never a decode candidate.
	if r := pol.lastRequest(t); r.Model != "m" || pol.asked() != 3 {
		t.Errorf("policy asked %d times", pol.asked())
	}
	if o := pol.outcome(t); o.Decision.Backend != db {
		t.Errorf("routed to %s", o.Decision.Backend.Name)
	}
}

// TestDisaggSGLangWire checks SGLang's way: a prefill server with a
// bootstrap port gets its leg at the same time as the decode server, both
// with the same bootstrap host, port and room.
func TestDisaggSGLangWire(t *testing.T) {
	pre, preSeen := recordingBackend(t, http.StatusOK, http.Header{"Content-Type": {"application/json"}}, decodeAnswer)
	dec, decSeen := recordingBackend(t, http.StatusOK, http.Header{"Content-Type": {"application/json"}}, decodeAnswer)
	pb, db := testBackend(t, 0, "p", pre.URL, "m"), testBackend(t, 1, "d", dec.URL, "m")
	pb.SetRole(fleet.RolePrefill)
	if err := pb.SetBootstrapPort(8998); err != nil {
		t.Fatal(err)
	}
	_, px := newTestProxy(t, newFakeFleet(pb, db), newFirstPolicy(), nil)
	res, got := post(t, px.URL, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":7,"stream":false}`)
	if res.StatusCode != http.StatusOK || got != decodeAnswer {
		t.Fatalf("status %d body %s", res.StatusCode, got)
	}
	d, p := decodeJSON(t, (<-decSeen).body), decodeJSON(t, (<-preSeen).body)
	pre.await(t)
	for _, k := range []string{"bootstrap_host", "bootstrap_port", "bootstrap_room"} {
		if d[k] == nil || d[k] != p[k] {
			t.Errorf("%s: decode %v, prefill %v; want one value", k, d[k], p[k])
		}
	}
	if d["bootstrap_host"] != "127.0.0.1" || d["bootstrap_port"] != 8998.0 {
		t.Errorf("bootstrap %v:%v, want the prefill server's host and port 8998", d["bootstrap_host"], d["bootstrap_port"])
	}
	if d["max_tokens"] != 7.0 || p["max_tokens"] != 1.0 || d["kv_transfer_params"] != nil || p["kv_transfer_params"] != nil {
		t.Errorf("decode max_tokens %v, prefill %v, decode kv_transfer_params %v", d["max_tokens"], p["max_tokens"], d["kv_transfer_params"])
	}
}
