package engine

import (
	"testing"
	"time"
)

// runUntilDone steps e from now until every request in rs is done and
// returns the time then.
func runUntilDone(t *testing.T, e *Engine, now time.Duration, rs ...*Request) time.Duration {
	t.Helper()
	for range 100_000 {
		done := true
		for _, r := range rs {
			done = done && r.Done()
		}
		if done {
			return now
		}
		res := e.Step(now)
		if res.End == now {
			t.Fatal("engine idle with requests not done")
		}
		now = res.End
	}
	t.Fatal("requests never finished")
	return now
}

func TestLoRADefaultLoadTimes(t *testing.T) {
	p := testProfile(t, 1000, 8192, 256)
	// A rank-16 adapter of Llama-3.1-8B on every linear layer is 84 MB.
	if mb := p.LoRABytes(16) / 1e6; mb < 75 || mb > 95 {
		t.Errorf("LoRABytes(16) = %.1f MB, want about 84", mb)
	}
	l := DefaultLoRA(p)
	if l.LoadDisk < 50*time.Millisecond || l.LoadDisk > 100*time.Millisecond {
		t.Errorf("LoadDisk = %v, want 50–100 ms", l.LoadDisk)
	}
	if l.LoadCPU < time.Millisecond || l.LoadCPU > 10*time.Millisecond {
		t.Errorf("LoadCPU = %v, want 1–10 ms", l.LoadCPU)
	}
}

// With one GPU slot, a request for a second adapter waits until the first
// adapter's request ends, then pays a load; a third for the first adapter,
// still in the CPU cache, pays the CPU load only.
func TestLoRASlotWaitAndLoads(t *testing.T) {
	p := testProfile(t, 1000, 8192, 256)
	e, err := New(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.SetLoRA(LoRA{MaxLoRAs: 1, MaxCPULoRAs: 2, LoadDisk: 80 * time.Millisecond, LoadCPU: 3 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	mk := func(id uint64, adapter int32, base int) *Request {
		r := &Request{ID: id, PromptLen: 64, MaxTokens: 20, Adapter: adapter}
		r.BlockHashes = HashTokens(nil, seq(base, 84), p.BlockSize)
		SeedHashes(r.BlockHashes, uint64(adapter)*7919)
		return r
	}
	a, b := mk(1, 1, 0), mk(2, 2, 0)
	for _, r := range []*Request{a, b} {
		if err := e.Add(0, r); err != nil {
			t.Fatal(err)
		}
	}
	res := e.Step(0)
	if len(e.running) != 1 || e.running[0] != a {
		t.Fatalf("running %d requests after the first step, want a alone", len(e.running))
	}
	if d := res.End - res.Start; d < 80*time.Millisecond {
		t.Errorf("first step took %v, want the disk load (80 ms) in it", d)
	}
	run, wait := e.Adapters(nil, nil)
	if len(run) != 1 || run[0] != 1 || len(wait) != 1 || wait[0] != 2 {
		t.Errorf("Adapters = %v running, %v waiting; want [1], [2]", run, wait)
	}
	now := runUntilDone(t, e, res.End, a)
	if b.FirstToken != 0 && b.FirstToken < a.Finish {
		t.Errorf("b's first token at %v, before a finished at %v", b.FirstToken, a.Finish)
	}
	now = runUntilDone(t, e, now, b)
	if got := e.Stats().LoRALoads; got != 2 {
		t.Errorf("LoRALoads = %d after two adapters, want 2", got)
	}
	c := mk(3, 1, 1000)
	if err := e.Add(now, c); err != nil {
		t.Fatal(err)
	}
	res = e.Step(now)
	if d := res.End - res.Start; d < 3*time.Millisecond || d >= 80*time.Millisecond {
		t.Errorf("step loading adapter 1 from the CPU cache took %v, want 3 ms plus compute", d)
	}
	runUntilDone(t, e, res.End, c)
	st := e.Stats()
	if st.LoRALoads != 2 || st.LoRAActivations != 3 {
		t.Errorf("LoRALoads, LoRAActivations = %d, %d; want 2, 3", st.LoRALoads, st.LoRAActivations)
	}
}

// KV computed under one adapter is not reused under another.
func TestLoRAPrefixCacheKeyedByAdapter(t *testing.T) {
	p := testProfile(t, 1000, 8192, 256)
	e, _ := New(p)
	if err := e.SetLoRA(LoRA{MaxLoRAs: 2}); err != nil {
		t.Fatal(err)
	}
	mk := func(id uint64, name string, adapter int32) *Request {
		r := &Request{ID: id, PromptLen: 160, MaxTokens: 2, Adapter: adapter}
		r.BlockHashes = HashTokens(nil, seq(0, 162), p.BlockSize)
		SeedHashes(r.BlockHashes, AdapterSeed(name))
		return r
	}
	now := time.Duration(0)
	for i, tc := range []struct {
		name       string
		adapter    int32
		wantCached int
	}{{"a", 1, 0}, {"b", 2, 0}, {"a", 1, 144}, {"", 0, 0}} {
		r := mk(uint64(i), tc.name, tc.adapter)
		if err := e.Add(now, r); err != nil {
			t.Fatal(err)
		}
		now = runUntilDone(t, e, now, r)
		if r.CachedTokens != tc.wantCached {
			t.Errorf("request %d (adapter %q): %d cached tokens, want %d", i, tc.name, r.CachedTokens, tc.wantCached)
		}
	}
}
