package kvroute

import (
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/router"
)

// DefaultAdapterLoad is Config.AdapterLoad's default: the engine model's
// load of a rank-16 LoRA adapter of Llama-3.1-8B from storage (84 MB read
// at 1.5 GB/s after 20 ms to open it; docs/engine-model.md).
const DefaultAdapterLoad = 76 * time.Millisecond

// defaultMaxLoRAs is the batch's adapter limit assumed for a backend that
// reports none: vLLM's --max-loras default.
const defaultMaxLoRAs = 1

// adapters is the router's own view of the LoRA adapters on each backend:
// the requests it sent there in flight per adapter, counted the moment they
// are routed (a scrape is seconds late), and the adapters it sent there
// most recently, which are the ones still loaded.
type adapters struct {
	mu      sync.Mutex
	flights []map[string]int // by backend index
	recent  [][]string       // by backend index, least recent first
	// waited counts, by backend index, the requests routed there with an
	// adapter load or a slot wait priced (kvroute_adapter_waits_total).
	waited []int64
}

// adapterRecent bounds the adapters remembered per backend: more than any
// engine keeps in CPU memory by default.
const adapterRecent = 64

func (a *adapters) grow(n int) {
	for len(a.flights) < n {
		a.flights = append(a.flights, map[string]int{})
		a.recent = append(a.recent, nil)
		a.waited = append(a.waited, 0)
	}
}

// routed counts a request for adapter on backend i, priced to wait for it
// there or not, and returns the call that uncounts it.
func (a *adapters) routed(i int, adapter string, waits bool) func() {
	a.mu.Lock()
	a.grow(i + 1)
	a.flights[i][adapter]++
	if waits {
		a.waited[i]++
	}
	r := slices.DeleteFunc(a.recent[i], func(x string) bool { return x == adapter })
	if len(r) >= adapterRecent {
		r = slices.Delete(r, 0, 1)
	}
	a.recent[i] = append(r, adapter)
	a.mu.Unlock()
	return func() {
		a.mu.Lock()
		if a.flights[i][adapter]--; a.flights[i][adapter] <= 0 {
			delete(a.flights[i], adapter)
		}
		a.mu.Unlock()
	}
}

// adapterWait is the seconds a request for adapter waits on backend b
// before its prefill can start, beyond the queue the other terms price, in
// two parts:
//
//	load: AdapterLoad, unless the adapter is among the last max_loras
//	      adapters used there (still in a GPU slot); and when max_loras
//	      adapters were used there, evict, the same again for the one
//	      whose slot it takes, priced in the cost but not the TTFT;
//	slot: when max_loras other adapters have requests in flight there,
//	      the time until the first of them has none, each of its n
//	      requests ending after a mean lifetime (life) as if memoryless:
//	      life × (1 + 1/2 + … + 1/n) for the adapter with the fewest.
//
// (docs/decisions/0018-lora-adapter-pricing.md.) An adapter with requests
// in flight there costs nothing: it is in the
// batch, or queued with them. The engine's max_loras is read from its
// scrape; its running adapters are added to the router's own counts only
// behind several router replicas, where the others' requests are not counted.
func (p *Policy) adapterWait(b *fleet.Backend, adapter string, life float64) (load, slot, evict float64) {
	if adapter == "" {
		return 0, 0, 0
	}
	var info *fleet.LoRAInfo
	if p.cfg.Metrics != nil {
		if m := p.cfg.Metrics(b); m != nil {
			info = m.LoRA
		}
	}
	slots := p.cfg.MaxLoRAs
	if info != nil && info.MaxLoRAs > 0 {
		slots = info.MaxLoRAs
	}
	if p.cfg.Replicas <= 1 {
		// One router's own counts are exact and immediate; a scrape's
		// adapters are a scrape old, and made backends look full that
		// were not (the live bench's TTFT p99 doubled).
		info = nil
	}
	a := &p.adapters
	a.mu.Lock()
	defer a.mu.Unlock()
	a.grow(b.Index + 1)
	flights := a.flights[b.Index]
	if flights[adapter] > 0 || info.Active(adapter) {
		return 0, 0, 0
	}
	recent := a.recent[b.Index]
	if !slices.Contains(recent[max(0, len(recent)-slots):], adapter) {
		load = p.cfg.AdapterLoad.Seconds()
		if len(recent) >= slots {
			evict = load // the slot's adapter, when it returns, loads again
		}
	}
	active, fewest := len(flights), 0
	for _, n := range flights {
		if fewest == 0 || n < fewest {
			fewest = n
		}
	}
	if info != nil {
		for _, r := range info.Running {
			if _, ok := flights[r]; !ok {
				active++
				fewest = 1
			}
		}
	}
	if active >= slots {
		slot = life * harmonic(fewest)
	}
	return load, slot, evict
}

// adapterStall is what the adapter's load costs beyond the request on
// candidate i, whose load l is: evict, the reload of the adapter whose GPU
// slot it takes; and, under the e2e objective, the streams in flight
// there, which all stall for the load (the engine loads it before the step
// that first runs it), weighed as the recompute a backend adds by not
// holding a prompt.
func (s *streamCost) adapterStall(i int, load, evict float64, l fleet.Load) float64 {
	if !s.on || !s.others || load == 0 {
		return evict
	}
	return evict + s.wOthers.recompute*load*stalled(float64(l.Requests), s.typical, s.inverse[i])
}

// harmonic is 1 + 1/2 + … + 1/n: the mean of the longest of n memoryless
// lifetimes, in lifetimes.
func harmonic(n int) float64 {
	var h float64
	for k := 1; k <= n; k++ {
		h += 1 / float64(k)
	}
	return h
}

// countAdapter counts d's request under its adapter on the chosen backend
// until its outcome; wait is the adapter term priced there.
func (p *Policy) countAdapter(req *router.Request, d *router.Decision, wait float64) {
	if req.Adapter == "" {
		return
	}
	release := p.adapters.routed(d.Backend.Index, req.Adapter, wait > 0)
	done := d.Done
	d.Done = func(o router.Outcome) {
		release()
		if done != nil {
			done(o)
		}
	}
}

var (
	adaptersInFlightDesc = prometheus.NewDesc("kvroute_adapters_in_flight",
		"LoRA adapters with requests kvroute routed to the backend in flight (against its max_loras slots).",
		[]string{"backend"}, nil)
	adapterWaitsDesc = prometheus.NewDesc("kvroute_adapter_waits_total",
		"Requests routed to a backend where kvroute priced a load of their LoRA adapter or a wait for an adapter slot.",
		[]string{"backend"}, nil)
)

// collectAdapters sends the adapter metrics of every backend.
func (p *Policy) collectAdapters(ch chan<- prometheus.Metric) {
	a := &p.adapters
	for _, b := range p.backends() {
		a.mu.Lock()
		a.grow(b.Index + 1)
		inFlight, waited := len(a.flights[b.Index]), a.waited[b.Index]
		a.mu.Unlock()
		ch <- prometheus.MustNewConstMetric(adaptersInFlightDesc, prometheus.GaugeValue, float64(inFlight), b.Name)
		ch <- prometheus.MustNewConstMetric(adapterWaitsDesc, prometheus.CounterValue, float64(waited), b.Name)
	}
}
