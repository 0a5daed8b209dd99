package sim

import (
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/fleet"
)

// adapters numbers the workload's LoRA adapters for the engines (1, 2, …;
// 0 is the base model) and names them back for the scraped metrics.
type adapters struct {
	ids   map[string]int32
	names []string // by id − 1
	max   int      // max_loras, reported in the metrics
	run   []int32  // scratch
	wait  []int32
}

// setLoRA turns LoRA on in every server when the config asks for it and
// numbers the workload's adapters.
func (s *simulation) setLoRA() error {
	if s.cfg.LoRA == nil {
		return nil
	}
	for i := range s.servers {
		if err := s.servers[i].eng.SetLoRA(*s.cfg.LoRA); err != nil {
			return err
		}
	}
	a := &s.adapters
	a.ids, a.max = map[string]int32{}, s.cfg.LoRA.MaxLoRAs
	for _, name := range s.cfg.Workload.Adapters() {
		a.names = append(a.names, name)
		a.ids[name] = int32(len(a.names))
	}
	return nil
}

// apply makes f a request for the adapter called name ("" the base model):
// the engine's request runs under it, its block hashes and the router's
// are keyed by it, and the router is told it.
func (a *adapters) apply(f *flight, name string) {
	if name == "" {
		return
	}
	f.req.Adapter = a.ids[name]
	engine.SeedHashes(f.hashes, engine.AdapterSeed(name))
	f.rreq.Model, f.rreq.Adapter = name, name
}

// info is what a scrape of e's vllm:lora_requests_info would read; nil
// without LoRA.
func (a *adapters) info(e *engine.Engine) *fleet.LoRAInfo {
	if a.ids == nil {
		return nil
	}
	a.run, a.wait = e.Adapters(a.run[:0], a.wait[:0])
	l := &fleet.LoRAInfo{MaxLoRAs: a.max}
	for _, id := range a.run {
		l.Running = append(l.Running, a.names[id-1])
	}
	for _, id := range a.wait {
		l.Waiting = append(l.Waiting, a.names[id-1])
	}
	return l
}
