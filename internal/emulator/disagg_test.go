package emulator

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"testing"
	"time"
)

// prefillAnswer is a prefill's response, with its transfer parameters.
type prefillAnswer struct {
	responseJSON
	KV *struct {
		DoRemotePrefill bool   `json:"do_remote_prefill"`
		DoRemoteDecode  bool   `json:"do_remote_decode"`
		RemoteEngineID  string `json:"remote_engine_id"`
		RemoteBlockIDs  []int  `json:"remote_block_ids"`
		RemoteRequestID string `json:"remote_request_id"`
		RemoteHost      string `json:"remote_host"`
		RemotePort      int    `json:"remote_port"`
		TPSize          int    `json:"tp_size"`
	} `json:"kv_transfer_params"`
}

var askRemoteDecode = json.RawMessage(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)

// TestDisaggPrefillThenDecode runs a prompt through a prefill server and a
// decode server as vLLM's proxy does and checks both sides: the transfer
// parameters, the decode's TTFT (no prefill), its cached tokens and
// metrics, and that the KV is pulled only once.
func TestDisaggPrefillThenDecode(t *testing.T) {
	_, pre := startServer(t, Config{Disagg: Disagg{Role: "prefill", EngineID: "engine-p"}}, nil)
	_, dec := startServer(t, Config{Disagg: Disagg{Role: "decode", LinkBandwidth: 1e9}}, nil)
	_, solo := startServer(t, Config{}, nil)
	prompt := words(6000)
	chat := func(kv json.RawMessage, maxTokens int) map[string]any {
		return map[string]any{"model": testModel, "max_tokens": maxTokens,
			"messages": []map[string]any{{"role": "user", "content": prompt}}, "kv_transfer_params": kv}
	}

	res, data := post(t, pre+"/v1/chat/completions", chat(askRemoteDecode, 1))
	if res.StatusCode != http.StatusOK {
		t.Fatalf("prefill: %d %s", res.StatusCode, data)
	}
	var p prefillAnswer
	if err := json.Unmarshal(data, &p); err != nil {
		t.Fatal(err)
	}
	kv := p.KV
	switch {
	case kv == nil:
		t.Fatalf("prefill answer has no kv_transfer_params: %s", data)
	case !kv.DoRemotePrefill || kv.DoRemoteDecode || kv.RemoteEngineID != "engine-p" || kv.TPSize != 1:
		t.Errorf("prefill kv_transfer_params %+v", kv)
	case kv.RemoteRequestID != p.ID || kv.RemoteHost != "127.0.0.1" || kv.RemotePort == 0:
		t.Errorf("prefill kv_transfer_params name %s at %s:%d, want %s on the server's address", kv.RemoteRequestID, kv.RemoteHost, kv.RemotePort, p.ID)
	case len(kv.RemoteBlockIDs) != (p.Usage.PromptTokens+15)/16:
		t.Errorf("%d block ids for %d prompt tokens", len(kv.RemoteBlockIDs), p.Usage.PromptTokens)
	}
	params, _ := json.Marshal(kv)

	whole, wh := complete(t, solo+"/v1/chat/completions", chat(nil, 20))
	split, sh := complete(t, dec+"/v1/chat/completions", chat(params, 20))
	if split.Choices[0].Message.Content != whole.Choices[0].Message.Content {
		t.Errorf("the decode's reply differs from the whole server's")
	}
	if got, want := split.Usage.PromptTokensDetails.CachedTokens, split.Usage.PromptTokens-1; got != want {
		t.Errorf("decode cached_tokens %d, want %d (all pulled but the last)", got, want)
	}
	ttftWhole, ttftSplit := headerSeconds(t, wh, HeaderModelTTFT), headerSeconds(t, sh, HeaderModelTTFT)
	if ttftSplit > ttftWhole/5 {
		t.Errorf("decode TTFT %.4fs, not well under the whole prefill's %.4fs", ttftSplit, ttftWhole)
	}
	m := scrape(t, dec)
	if got := metricValue(t, m, "vllm:prefix_cache_hits_total"); got != 0 {
		t.Errorf("decode prefix cache hits %v, want 0: pulled blocks are no local hit", got)
	}
	if n := m["vllm:nixl_xfer_time_seconds"].GetMetric()[0].GetHistogram(); n.GetSampleCount() != 1 ||
		n.GetSampleSum() < float64(split.Usage.PromptTokens-1)*128*1024/1e9*0.99 {
		t.Errorf("transfer time: %d samples, %.4f s", n.GetSampleCount(), n.GetSampleSum())
	}

	// The KV is read once: a second decode with the same parameters fails
	// its pull and prefills itself.
	again, _ := complete(t, dec+"/v1/chat/completions", chat(params, 20))
	if again.Usage.PromptTokensDetails.CachedTokens == split.Usage.PromptTokens-1 && metricValue(t, scrape(t, dec), "vllm:nixl_num_failed_transfers_total") != 1 {
		t.Errorf("a second pull of the same KV succeeded")
	}
	if got := metricValue(t, scrape(t, dec), "vllm:nixl_num_failed_transfers_total"); got != 1 {
		t.Errorf("failed transfers %v, want 1", got)
	}
}

func TestDisaggIgnoredWithoutConnector(t *testing.T) {
	_, url := startServer(t, Config{}, nil)
	res, data := post(t, url+"/v1/chat/completions", map[string]any{"model": testModel, "max_tokens": 1,
		"messages": []map[string]any{{"role": "user", "content": "hi"}}, "kv_transfer_params": askRemoteDecode})
	var p prefillAnswer
	if err := json.Unmarshal(data, &p); res.StatusCode != http.StatusOK || err != nil || p.KV != nil {
		t.Errorf("status %d, kv_transfer_params %v: %s", res.StatusCode, p.KV, data)
	}
	_, dec := startServer(t, Config{Disagg: Disagg{Role: "decode"}}, nil)
	res, data = post(t, dec+"/v1/chat/completions", `{"model":"test-model","messages":[{"role":"user","content":"hi"}],"kv_transfer_params":"yes"}`)
	if res.StatusCode != http.StatusBadRequest {
		t.Errorf("malformed kv_transfer_params: status %d %s", res.StatusCode, data)
	}
}

// TestDisaggSGLangRoom runs SGLang's way: the decode leg, sent first,
// waits in its bootstrap room until the prefill leg is done, then decodes
// with the prompt pulled; a room no prefill comes to ends in 503.
func TestDisaggSGLangRoom(t *testing.T) {
	_, pre := startServer(t, Config{Disagg: Disagg{Role: "prefill"}}, nil)
	_, dec := startServer(t, Config{Disagg: Disagg{Role: "decode", BootstrapTimeout: 200 * time.Millisecond}}, nil)
	u, err := url.Parse(pre)
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(u.Port())
	chat := func(room uint64, maxTokens int) map[string]any {
		return map[string]any{"model": testModel, "max_tokens": maxTokens, "messages": []map[string]any{{"role": "user", "content": words(3000)}},
			"bootstrap_host": u.Hostname(), "bootstrap_port": port, "bootstrap_room": room}
	}
	got := make(chan []byte, 1)
	go func() {
		body, _ := json.Marshal(chat(42, 10))
		res, err := http.Post(dec+"/v1/chat/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			got <- nil
			return
		}
		defer res.Body.Close()
		data, _ := io.ReadAll(res.Body)
		got <- data
	}()
	complete(t, pre+"/v1/chat/completions", chat(42, 1))
	var r responseJSON
	if data := <-got; json.Unmarshal(data, &r) != nil || r.Usage == nil || r.Usage.PromptTokensDetails == nil {
		t.Fatalf("decode answered %s", data)
	}
	if n := r.Usage.PromptTokensDetails.CachedTokens; n != r.Usage.PromptTokens-1 {
		t.Errorf("decode cached %d of %d prompt tokens, want all but the last", n, r.Usage.PromptTokens)
	}
	res, data := post(t, dec+"/v1/chat/completions", chat(43, 10))
	if res.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("a room never prefilled: status %d %s, want 503", res.StatusCode, data)
	}
}
