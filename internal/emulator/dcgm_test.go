package emulator

import (
	"math"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/kvroute/kvroute/internal/engine"
)

// labelsOf returns a sample's labels as a map.
func labelsOf(m *dto.Metric) map[string]string {
	l := map[string]string{}
	for _, p := range m.GetLabel() {
		l[p.GetName()] = p.GetValue()
	}
	return l
}

func TestDCGMMetricsFollowTheModel(t *testing.T) {
	s, url := startServer(t, Config{GPUID: "replica-a"}, nil)
	idle := scrape(t, url)
	if v := metricValue(t, idle, "DCGM_FI_DEV_GPU_UTIL"); v != 0 {
		t.Errorf("idle GPU_UTIL = %v, want 0", v)
	}
	// About 40 decode steps of 7 ms: a few tenths of the one-second window.
	complete(t, url+"/v1/completions", map[string]any{"prompt": words(500), "max_tokens": 40})
	fams := scrape(t, url)
	busy := s.Stats().BusyTime
	util := metricValue(t, fams, "DCGM_FI_DEV_GPU_UTIL")
	if want := math.Round(100 * busy.Seconds() / gpuWindow.Seconds()); util != want || util < 10 {
		t.Errorf("GPU_UTIL = %v%%, want the model's busy time %v over %v = %v%%", util, busy, gpuWindow, want)
	}
	gr := metricValue(t, fams, "DCGM_FI_PROF_GR_ENGINE_ACTIVE")
	sm := metricValue(t, fams, "DCGM_FI_PROF_SM_ACTIVE")
	tensor := metricValue(t, fams, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")
	dram := metricValue(t, fams, "DCGM_FI_PROF_DRAM_ACTIVE")
	if math.Abs(gr-util/100) > 0.006 || !(sm < gr && sm > 0.5*gr) {
		t.Errorf("GR_ENGINE_ACTIVE %v, SM_ACTIVE %v: want GPU_UTIL/100 and a little less (the steps' CPU overhead)", gr, sm)
	}
	if !(tensor > 0 && tensor < dram && dram <= sm) {
		t.Errorf("tensor %v, dram %v: a decode-bound load keeps memory busier than the tensor pipes", tensor, dram)
	}
	used, free := metricValue(t, fams, "DCGM_FI_DEV_FB_USED"), metricValue(t, fams, "DCGM_FI_DEV_FB_FREE")
	if total := used + free; math.Abs(total-80e9/mib) > 1 || used < 0.85*total || used > 0.9*total {
		t.Errorf("FB_USED %v + FB_FREE %v MiB: want 80 GB in all, vLLM's 0.9 of it reserved", used, free)
	}

	l := labelsOf(fams["DCGM_FI_DEV_GPU_UTIL"].GetMetric()[0])
	if l["gpu"] != "0" || l["device"] != "nvidia0" || l["modelName"] != "NVIDIA H100 80GB HBM3" ||
		!strings.HasPrefix(l["UUID"], "GPU-") || len(l["UUID"]) != len("GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52") {
		t.Errorf("labels %v, want the DCGM exporter's", l)
	}
	_, other := startServer(t, Config{GPUID: "replica-b"}, nil)
	_, again := startServer(t, Config{GPUID: "replica-a"}, nil)
	uuid := func(url string) string {
		return labelsOf(scrape(t, url)["DCGM_FI_DEV_GPU_UTIL"].GetMetric()[0])["UUID"]
	}
	if uuid(again) != l["UUID"] || uuid(other) == l["UUID"] {
		t.Error("the UUID must be stable for one GPUID and differ between two")
	}
}

func TestDCGMOneSeriesPerTensorParallelGPU(t *testing.T) {
	p, err := engine.LookupProfile("4xh100-llama3-70b")
	if err != nil {
		t.Fatal(err)
	}
	_, url := startServer(t, Config{Profile: p}, nil)
	ms := scrape(t, url)["DCGM_FI_DEV_FB_USED"].GetMetric()
	if len(ms) != 4 {
		t.Fatalf("%d series, want one per GPU", len(ms))
	}
	seen := map[string]bool{}
	for _, m := range ms {
		seen[labelsOf(m)["UUID"]] = true
	}
	if len(seen) != 4 {
		t.Errorf("UUIDs %v, want four distinct", seen)
	}
}

func TestGPUWindowForgetsOldSteps(t *testing.T) {
	var g gpuActivity
	step := func(at time.Duration) engine.StepResult {
		return engine.StepResult{Start: at, End: at + 10*time.Millisecond, DecodeTokens: 1,
			ComputeTime: time.Millisecond, MemoryTime: 8 * time.Millisecond}
	}
	for i := range 100 {
		g.record(step(time.Duration(i)*10*time.Millisecond), time.Millisecond)
	}
	if f := g.fractions(time.Second); math.Abs(f.busy-1) > 1e-9 || math.Abs(f.sm-0.8) > 1e-9 || math.Abs(f.tensor-0.1) > 1e-9 {
		t.Errorf("a second of back-to-back steps: %+v, want busy 1, sm 0.8, tensor 0.1", f)
	}
	if f := g.fractions(1500 * time.Millisecond); math.Abs(f.busy-0.5) > 1e-9 {
		t.Errorf("half a second later: busy %v, want 0.5", f.busy)
	}
	// An idle wait (no tokens) is not GPU time.
	g.record(engine.StepResult{Start: 2 * time.Second, End: 3 * time.Second}, 0)
	if f := g.fractions(3 * time.Second); f.busy != 0 {
		t.Errorf("after an idle second: busy %v, want 0", f.busy)
	}
	if len(g.steps) > 101 {
		t.Errorf("%d steps kept", len(g.steps))
	}
}

func TestShapeProfilesThroughTheAPI(t *testing.T) {
	lookup := func(name string) engine.Profile {
		p, err := engine.LookupProfile(name)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	body := map[string]any{"prompt": words(300), "max_tokens": 5}
	ttft := func(p engine.Profile) float64 {
		_, url := startServer(t, Config{Profile: p}, nil)
		_, h := complete(t, url+"/v1/completions", body)
		return headerSeconds(t, h, HeaderModelTTFT)
	}
	base := ttft(lookup(engine.DefaultProfile))
	if got := ttft(lookup("h100-llama3-8b-request-overhead")); math.Abs(got-base-0.150) > 1e-6 {
		t.Errorf("request-overhead TTFT %v s, want the default's %v + 0.150", got, base)
	}
	if got := ttft(lookup("h100-llama3-8b-slow-prefill")); got <= 2*base {
		t.Errorf("slow-prefill TTFT %v s, want well above the default's %v", got, base)
	}

	// llama.cpp-like slots: a repeated prompt lands in the slot holding it.
	_, url := startServer(t, Config{Profile: lookup("h100-llama3-8b-llamacpp-slots")}, nil)
	complete(t, url+"/v1/completions", body)
	r, _ := complete(t, url+"/v1/completions", body)
	if r.Usage.PromptTokensDetails.CachedTokens == 0 {
		t.Error("llamacpp-slots: a repeated prompt found nothing in its slot")
	}
	fams := scrape(t, url)
	if v := metricValue(t, fams, "vllm:num_requests_waiting"); v != 0 {
		t.Errorf("waiting %v after the requests finished", v)
	}
}
