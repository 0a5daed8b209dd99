package bench

import "github.com/kvroute/kvroute/internal/emulator"

// loraModules are the adapters cfg's workload names, served by every
// emulator from the start (as vLLM's --lora-modules), when cfg.LoRA is set.
func loraModules(cfg Config) []emulator.LoRAModule {
	if cfg.LoRA == nil || len(cfg.BackendURLs) > 0 {
		return nil
	}
	var out []emulator.LoRAModule
	for _, name := range cfg.Workload.Adapters() {
		out = append(out, emulator.LoRAModule{Name: name, Path: "/adapters/" + name})
	}
	return out
}

// adapterLoads sums the adapters the emulators have loaded from storage; 0
// for real backends.
func (f *Fleet) adapterLoads() int64 {
	if f.watch != nil {
		return 0
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var n int64
	for i, srv := range f.Servers {
		n += srv.Stats().LoRALoads + f.retired[i].loraLoads
	}
	return n
}
