package emulator

import (
	"crypto/sha256"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/engine"
)

// gpuWindow is how far back the GPU activity gauges look, in model time.
// NVIDIA's driver averages utilisation over a sample period of a fraction
// of a second to a second; a window of one second follows load changes as
// fast as a router scraping every second can see them.
const gpuWindow = time.Second

// mib is a mebibyte: DCGM reports framebuffer memory in MiB.
const mib = 1 << 20

// gpuStep is one engine step as the GPU sees it, in model time.
type gpuStep struct {
	start, end time.Duration
	// kernels is the part of the step with kernels running (the roofline
	// time, without the per-step CPU overheads); compute and memory are
	// the roofline's terms: how long the step's FLOPs and bytes keep the
	// tensor pipes and the memory interface busy.
	kernels, compute, memory time.Duration
}

// gpuActivity keeps the steps of the last gpuWindow and sums them into the
// fractions DCGM reports. Guarded by Server.mu.
type gpuActivity struct {
	steps []gpuStep
}

// record adds a step that computed something (an idle wait is not GPU
// time) and drops the steps that ended before the window.
func (g *gpuActivity) record(res engine.StepResult, fixed time.Duration) {
	if res.PrefillTokens+res.DecodeTokens == 0 || res.End <= res.Start {
		return
	}
	d := res.End - res.Start
	kernels := min(d, max(res.ComputeTime, res.MemoryTime))
	if kernels == 0 {
		kernels = max(d-fixed, 0)
	}
	g.steps = append(g.steps, gpuStep{res.Start, res.End, kernels, min(res.ComputeTime, d), min(res.MemoryTime, d)})
	cut := 0
	for cut < len(g.steps) && g.steps[cut].end < res.Start-gpuWindow {
		cut++
	}
	g.steps = append(g.steps[:0], g.steps[cut:]...)
}

// gpuFractions are the activity ratios of one window, each in [0, 1].
type gpuFractions struct {
	busy, sm, tensor, dram float64
}

// fractions sums the window ending at now: each step counts for the part
// of it inside the window, its kernels, compute and memory time scaled
// alike.
func (g *gpuActivity) fractions(now time.Duration) gpuFractions {
	var f gpuFractions
	from := now - gpuWindow
	for _, s := range g.steps {
		lo, hi := max(s.start, from), min(s.end, now)
		if hi <= lo {
			continue
		}
		share := float64(hi-lo) / float64(s.end-s.start)
		f.busy += float64(hi - lo)
		f.sm += share * float64(s.kernels)
		f.tensor += share * float64(s.compute)
		f.dram += share * float64(s.memory)
	}
	w := float64(gpuWindow)
	clamp := func(x float64) float64 { return min(max(x/w, 0), 1) }
	return gpuFractions{clamp(f.busy), clamp(f.sm), clamp(f.tensor), clamp(f.dram)}
}

// dcgmCollector exports the engine model's GPU activity under the names
// and labels of NVIDIA's DCGM exporter (etc/default-counters.csv in
// github.com/NVIDIA/dcgm-exporter), one series per GPU of the profile
// (tensor parallelism splits the work evenly, so all read alike):
//
//   - DCGM_FI_DEV_GPU_UTIL (gauge, percent): the share of the window with
//     a step running.
//   - DCGM_FI_PROF_GR_ENGINE_ACTIVE (gauge, ratio): the same share.
//   - DCGM_FI_PROF_SM_ACTIVE (gauge, ratio): the share with kernels
//     running, the step without its CPU overheads; memory-bound kernels
//     keep SMs occupied too. The exporter's default list has it commented
//     out; operators who profile enable it.
//   - DCGM_FI_PROF_PIPE_TENSOR_ACTIVE and DCGM_FI_PROF_DRAM_ACTIVE (gauges,
//     ratios): the roofline's compute and memory terms over the window:
//     how compute-bound (prefill) or memory-bound (decode) the load is.
//   - DCGM_FI_DEV_FB_USED and DCGM_FI_DEV_FB_FREE (gauges, MiB): what the
//     engine reserves, as vLLM allocates its whole KV pool at start-up:
//     weights, activations and the KV pool. They do not move with load;
//     vllm:kv_cache_usage_perc does.
//
// Labels: gpu, UUID (fake, stable: a hash of Config.GPUID and the GPU's
// index), pci_bus_id, device (nvidiaN), modelName (Profile.GPU) and
// Hostname, as released exporters name them.
type dcgmCollector struct {
	s                          *Server
	util, gr, sm, tensor, dram *prometheus.Desc
	fbUsed, fbFree             *prometheus.Desc
	labels                     [][]string // label values per GPU
	usedMiB, freeMiB           float64
}

var _ prometheus.Collector = (*dcgmCollector)(nil)

// dcgmLabels are the DCGM exporter's per-GPU labels.
var dcgmLabels = []string{"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname"}

func newDCGMCollector(s *Server, id string) *dcgmCollector {
	d := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, dcgmLabels, nil) }
	c := &dcgmCollector{
		s:      s,
		util:   d("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)."),
		gr:     d("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active."),
		sm:     d("DCGM_FI_PROF_SM_ACTIVE", "The ratio of cycles an SM has at least 1 warp assigned."),
		tensor: d("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles the tensor (HMMA) pipe is active."),
		dram:   d("DCGM_FI_PROF_DRAM_ACTIVE", "Ratio of cycles the device memory interface is active sending or receiving data."),
		fbUsed: d("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)."),
		fbFree: d("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB)."),
	}
	p := s.profile
	host, _ := os.Hostname()
	for i := range p.GPUs {
		sum := sha256.Sum256([]byte(id + "/" + strconv.Itoa(i)))
		uuid := fmt.Sprintf("GPU-%x-%x-%x-%x-%x", sum[0:4], sum[4:6], sum[6:8], sum[8:10], sum[10:16])
		c.labels = append(c.labels, []string{strconv.Itoa(i), uuid,
			fmt.Sprintf("00000000:%02X:00.0", 0x18+i), "nvidia" + strconv.Itoa(i), p.GPU(), host})
	}
	gpus := float64(p.GPUs)
	kvPool := float64(p.Blocks()*p.BlockSize) * p.KVBytesPerToken()
	used := p.WeightBytes()/gpus + p.ActivationMemory + kvPool/gpus
	c.usedMiB = float64(int64(used / mib))
	c.freeMiB = max(float64(int64(p.GPUMemory/mib))-c.usedMiB, 0)
	return c
}

// Describe implements prometheus.Collector.
func (c *dcgmCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.util, c.gr, c.sm, c.tensor, c.dram, c.fbUsed, c.fbFree} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *dcgmCollector) Collect(ch chan<- prometheus.Metric) {
	c.s.mu.Lock()
	f := c.s.gpu.fractions(max(c.s.modelNow(), c.s.mnow))
	c.s.mu.Unlock()
	for _, l := range c.labels {
		gauge := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, l...)
		}
		// The exporter's utilisation is a whole percent.
		gauge(c.util, float64(int(100*f.busy+0.5)))
		gauge(c.gr, f.busy)
		gauge(c.sm, f.sm)
		gauge(c.tensor, f.tensor)
		gauge(c.dram, f.dram)
		gauge(c.fbUsed, c.usedMiB)
		gauge(c.fbFree, c.freeMiB)
	}
}
