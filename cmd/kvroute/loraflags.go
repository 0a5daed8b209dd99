package main

import (
	"flag"
	"fmt"
	"time"

	"github.com/kvroute/kvroute/internal/engine"
)

// loraFlags are the LoRA limits of emulated or simulated servers, named as
// vLLM's own flags (--max-loras, --max-cpu-loras).
type loraFlags struct {
	maxLoRAs, maxCPULoRAs int
	loadTime, cpuLoadTime time.Duration
}

func addLoRAFlags(fs *flag.FlagSet, what string) *loraFlags {
	lf := &loraFlags{}
	fs.IntVar(&lf.maxLoRAs, "max-loras", 1, what+": LoRA adapters in one batch, as vLLM's --max-loras (a request for one more waits for a slot)")
	fs.IntVar(&lf.maxCPULoRAs, "max-cpu-loras", 0, what+": LoRA adapters kept in CPU memory, as vLLM's --max-cpu-loras (0: --max-loras)")
	fs.DurationVar(&lf.loadTime, "lora-load-time", 0, what+": time to load a LoRA adapter from storage (0: derived for a rank-16 adapter of the profile's model)")
	fs.DurationVar(&lf.cpuLoadTime, "lora-cpu-load-time", 0, what+": time to load a LoRA adapter from CPU memory into a GPU slot (0: derived likewise)")
	return lf
}

// lora returns the limits for profile p's servers.
func (lf *loraFlags) lora(p engine.Profile) (engine.LoRA, error) {
	if lf.maxLoRAs < 1 || lf.maxCPULoRAs < 0 || lf.loadTime < 0 || lf.cpuLoadTime < 0 {
		return engine.LoRA{}, fmt.Errorf("--max-loras must be at least 1; --max-cpu-loras, --lora-load-time and --lora-cpu-load-time must not be negative")
	}
	l := engine.DefaultLoRA(p)
	l.MaxLoRAs, l.MaxCPULoRAs = lf.maxLoRAs, max(lf.maxCPULoRAs, lf.maxLoRAs)
	if lf.loadTime > 0 {
		l.LoadDisk = lf.loadTime
	}
	if lf.cpuLoadTime > 0 {
		l.LoadCPU = lf.cpuLoadTime
	}
	return l, l.Validate()
}
