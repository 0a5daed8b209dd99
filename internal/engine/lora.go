package engine

import (
	"fmt"
	"slices"
	"time"

	"github.com/cespare/xxhash/v2"
)

// LoRA models vLLM's multi-adapter serving (--enable-lora): at most
// MaxLoRAs distinct adapters in one batch, each in a GPU slot; adapters
// loaded once stay in a CPU cache of MaxCPULoRAs (least recently used out).
// A waiting request whose adapter is not in the step's batch while MaxLoRAs
// adapters are is skipped, as vLLM's scheduler skips it, until a slot frees:
// an adapter's slot frees when no scheduled request uses it. A step whose
// batch holds an adapter not in a GPU slot first loads it: LoadCPU from the
// CPU cache, LoadDisk from storage (docs/engine-model.md, LoRA adapters).
type LoRA struct {
	// MaxLoRAs is vLLM's --max-loras: adapters in one batch and GPU slots.
	MaxLoRAs int
	// MaxCPULoRAs is vLLM's --max-cpu-loras: adapters kept in CPU memory;
	// below MaxLoRAs it is MaxLoRAs (vLLM's default).
	MaxCPULoRAs int
	// LoadDisk is the time to load an adapter from storage into a GPU slot;
	// LoadCPU from the CPU cache.
	LoadDisk, LoadCPU time.Duration
}

// The default LoRA adapter: rank 16 on every linear layer of the model, in
// the model's dtype. Its load from storage reads it at loraDiskBandwidth
// after loraOpenOverhead (opening and parsing the safetensors file and its
// PEFT config); from CPU memory it crosses PCIe at loraPCIeBandwidth.
const (
	DefaultLoRARank   = 16
	loraDiskBandwidth = 1.5e9 // bytes/s: an NVMe read of one file, parsed
	loraPCIeBandwidth = 25e9  // bytes/s: PCIe 5.0 x16, host to device, pinned
	loraOpenOverhead  = 20 * time.Millisecond
)

// LoRABytes is the size of a rank-rank adapter on every linear layer of
// p's model: rank × (inputs + outputs) weights for the q, k, v and o
// projections and the three MLP matrices of every layer. The MLP's width is
// what the parameter count leaves after attention (embeddings neglected).
func (p Profile) LoRABytes(rank int) float64 {
	h := float64(p.Hidden)
	kv := float64(p.KVHeads * p.HeadDim)
	perLayer := p.Params / float64(p.Layers)
	attn := 2*h*h + 2*h*kv
	inter := max(h, (perLayer-attn)/(3*h))
	dims := 2*(h+h) + 2*(h+kv) + 3*(h+inter)
	return float64(rank) * dims * float64(p.Layers) * float64(p.DtypeBytes)
}

// DefaultLoRA returns vLLM's LoRA limits (max_loras 1, max_cpu_loras
// max_loras) with load times derived for a rank-16 adapter of p's model.
func DefaultLoRA(p Profile) LoRA {
	bytes := p.LoRABytes(DefaultLoRARank)
	return LoRA{
		MaxLoRAs:    1,
		MaxCPULoRAs: 1,
		LoadDisk:    loraOpenOverhead + time.Duration(bytes/loraDiskBandwidth*float64(time.Second)),
		LoadCPU:     time.Duration(bytes / loraPCIeBandwidth * float64(time.Second)),
	}
}

// Validate reports what is wrong with l, if anything.
func (l LoRA) Validate() error {
	switch {
	case l.MaxLoRAs < 1:
		return fmt.Errorf("lora: max_loras %d must be at least 1", l.MaxLoRAs)
	case l.LoadDisk < 0 || l.LoadCPU < 0:
		return fmt.Errorf("lora: negative load time")
	}
	return nil
}

// AdapterSeed is the seed of the block hashes of requests for the adapter
// called name; 0 for the base model (""). vLLM keys a block's hash with its
// adapter's name, so KV computed under one adapter is never reused under
// another or the base model.
func AdapterSeed(name string) uint64 {
	if name == "" {
		return 0
	}
	return xxhash.Sum64String(name) | 1
}

// SeedHashes mixes seed (AdapterSeed) into every hash of a chain, in place:
// equal prefixes under one adapter still hash equal, and under two
// adapters never. Seed 0 leaves the chain as it is.
func SeedHashes(hashes []uint64, seed uint64) {
	if seed == 0 {
		return
	}
	for i, h := range hashes {
		hashes[i] = sum16(h, seed)
	}
}

// loraState is an engine's adapters: the GPU slots and the CPU cache, each
// least recently used first, and the counters.
type loraState struct {
	cfg   LoRA
	gpu   []int32 // adapters in GPU slots, least recently used first
	cpu   []int32 // adapters in CPU memory, least recently used first
	batch []int32 // the adapters of the step being scheduled (scratch)
}

// SetLoRA turns multi-adapter serving on with l's limits. Requests with an
// Adapter other than 0 may then be added; without it they are refused.
func (e *Engine) SetLoRA(l LoRA) error {
	if err := l.Validate(); err != nil {
		return err
	}
	l.MaxCPULoRAs = max(l.MaxCPULoRAs, l.MaxLoRAs)
	e.lora = &loraState{cfg: l}
	return nil
}

// LoRA returns the engine's adapter limits and whether LoRA is on.
func (e *Engine) LoRA() (LoRA, bool) {
	if e.lora == nil {
		return LoRA{}, false
	}
	return e.lora.cfg, true
}

// LoadAdapter puts adapter id in the CPU cache, as vLLM's
// /v1/load_lora_adapter loads it; it evicts the least recently used one
// when the cache is full.
func (e *Engine) LoadAdapter(id int32) {
	if e.lora == nil || id == 0 {
		return
	}
	if !slices.Contains(e.lora.cpu, id) {
		e.lora.cpu = touch(e.lora.cpu, id, e.lora.cfg.MaxCPULoRAs, nil)
		e.stats.LoRALoads++
	}
}

// UnloadAdapter drops adapter id from the GPU slots and the CPU cache.
// Requests for it in flight go on; the next one loads it again.
func (e *Engine) UnloadAdapter(id int32) {
	if e.lora == nil {
		return
	}
	e.lora.gpu = slices.DeleteFunc(e.lora.gpu, func(a int32) bool { return a == id })
	e.lora.cpu = slices.DeleteFunc(e.lora.cpu, func(a int32) bool { return a == id })
}

// Adapters appends to running the adapters of the running requests and to
// waiting those of the waiting ones, each once, in order of first
// appearance: what vLLM reports in vllm:lora_requests_info.
func (e *Engine) Adapters(running, waiting []int32) ([]int32, []int32) {
	for _, r := range e.running {
		if r.Adapter != 0 && !slices.Contains(running, r.Adapter) {
			running = append(running, r.Adapter)
		}
	}
	for _, q := range [2]*queue{&e.pending, &e.waiting} {
		for _, r := range q.items[q.head:] {
			if r.Adapter != 0 && !slices.Contains(waiting, r.Adapter) {
				waiting = append(waiting, r.Adapter)
			}
		}
	}
	return running, waiting
}

// ResidentAdapters appends the adapters in GPU slots, least recently used
// first.
func (e *Engine) ResidentAdapters(dst []int32) []int32 {
	if e.lora == nil {
		return dst
	}
	return append(dst, e.lora.gpu...)
}

// admitLoRA is Step's admission of waiting requests when LoRA is on: in
// FCFS order, skipping (and keeping in place) those whose adapter would be
// one more than MaxLoRAs in the step's batch, as vLLM's scheduler does. It
// returns the budget left.
func (e *Engine) admitLoRA(budget int) int {
	l := e.lora
	l.batch = l.batch[:0]
	for _, r := range e.sched {
		if r.Adapter != 0 && !slices.Contains(l.batch, r.Adapter) {
			l.batch = append(l.batch, r.Adapter)
		}
	}
	q := &e.waiting
	for i := q.head; i < len(q.items) && budget > 0 && len(e.running) < e.p.MaxNumSeqs; {
		r := q.items[i]
		if a := r.Adapter; a != 0 && !slices.Contains(l.batch, a) {
			if len(l.batch) >= l.cfg.MaxLoRAs {
				i++
				continue
			}
			if !e.admit(r, budget) {
				break
			}
			l.batch = append(l.batch, a)
		} else if !e.admit(r, budget) {
			break
		}
		i = q.removeAt(i)
		budget -= r.scheduled
	}
	return budget
}

// loadAdapters returns the time the step spends loading the adapters of its
// batch that are not in a GPU slot, and makes them resident: each takes the
// slot of the least recently used adapter not in the batch.
func (e *Engine) loadAdapters() time.Duration {
	l := e.lora
	if l == nil {
		return 0
	}
	var load time.Duration
	l.batch = l.batch[:0]
	for _, r := range e.sched {
		if r.Adapter != 0 && !slices.Contains(l.batch, r.Adapter) {
			l.batch = append(l.batch, r.Adapter)
		}
	}
	for _, a := range l.batch {
		if !slices.Contains(l.gpu, a) {
			if slices.Contains(l.cpu, a) {
				load += l.cfg.LoadCPU
			} else {
				load += l.cfg.LoadDisk
				e.stats.LoRALoads++
			}
			e.stats.LoRAActivations++
		}
		l.cpu = touch(l.cpu, a, l.cfg.MaxCPULoRAs, nil)
		l.gpu = touch(l.gpu, a, l.cfg.MaxLoRAs, l.batch)
	}
	return load
}

// touch moves a to the most recently used end of lru, adding it if absent
// and, beyond capacity, dropping the least recently used adapter not in
// keep.
func touch(lru []int32, a int32, capacity int, keep []int32) []int32 {
	if i := slices.Index(lru, a); i >= 0 {
		lru = append(lru[:i], lru[i+1:]...)
	}
	lru = append(lru, a)
	for len(lru) > capacity {
		i := slices.IndexFunc(lru, func(x int32) bool { return !slices.Contains(keep, x) })
		if i < 0 {
			break
		}
		lru = append(lru[:i], lru[i+1:]...)
	}
	return lru
}

// removeAt takes out the request at items[i], keeping the others' order,
// and returns the index of the one that followed it.
func (q *queue) removeAt(i int) int {
	if i == q.head {
		q.popFront() // which may move the items: the next is at the new head
		return q.head
	}
	copy(q.items[i:], q.items[i+1:])
	q.items[len(q.items)-1] = nil
	q.items = q.items[:len(q.items)-1]
	return i
}
