package engine

import (
	_ "embed"
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// DefaultProfile is the name of the profile used when none is chosen.
const DefaultProfile = "h100-llama3-8b"

//go:embed profiles.yaml
var builtinProfiles []byte

// Profile describes one inference server: the model's shape, the hardware it
// runs on and the scheduler's limits. The step-time model and the KV capacity
// are derived from these facts (see docs/engine-model.md).
type Profile struct {
	// Name identifies the profile (for example "h100-llama3-8b").
	Name string `yaml:"name"`
	// Description says in a sentence what is modelled.
	Description string `yaml:"description"`
	// Model is the model name served by default.
	Model string `yaml:"model"`

	// Params is the number of model parameters.
	Params float64 `yaml:"params"`
	// Layers is the number of transformer layers.
	Layers int `yaml:"layers"`
	// Hidden is the model (residual stream) width.
	Hidden int `yaml:"hidden"`
	// KVHeads is the number of key/value heads (grouped-query attention).
	KVHeads int `yaml:"kv_heads"`
	// HeadDim is the width of one attention head.
	HeadDim int `yaml:"head_dim"`
	// DtypeBytes is the size of one weight or KV element in bytes.
	DtypeBytes int `yaml:"dtype_bytes"`
	// MaxModelLen is the longest sequence (prompt plus output) in tokens.
	MaxModelLen int `yaml:"max_model_len"`

	// GPUs is the tensor-parallel degree: weights, KV and work split evenly.
	GPUs int `yaml:"gpus"`
	// GPUMemory is the memory of one GPU in bytes.
	GPUMemory float64 `yaml:"gpu_memory"`
	// GPUMemoryUtilization is the fraction of GPU memory vLLM may use.
	GPUMemoryUtilization float64 `yaml:"gpu_memory_utilization"`
	// ActivationMemory is the memory per GPU in bytes not available to weights or KV.
	ActivationMemory float64 `yaml:"activation_memory"`
	// PeakFLOPS is the dense bf16 peak of one GPU in FLOP/s.
	PeakFLOPS float64 `yaml:"peak_flops"`
	// MemBandwidth is the memory bandwidth of one GPU in bytes/s.
	MemBandwidth float64 `yaml:"mem_bandwidth"`
	// MFU is the fraction of PeakFLOPS reached by compute-bound work.
	MFU float64 `yaml:"mfu"`
	// MBU is the fraction of MemBandwidth reached by memory-bound work.
	MBU float64 `yaml:"mbu"`
	// StepOverhead is the fixed cost of one scheduler step.
	StepOverhead time.Duration `yaml:"step_overhead"`
	// TPOverhead is the extra cost per step of tensor-parallel communication.
	TPOverhead time.Duration `yaml:"tp_overhead"`

	// BlockSize is the number of tokens in one KV block.
	BlockSize int `yaml:"block_size"`
	// NumGPUBlocks is the KV capacity in blocks; 0 derives it from memory.
	NumGPUBlocks int `yaml:"num_gpu_blocks"`
	// MaxNumSeqs is the most requests that run in one batch.
	MaxNumSeqs int `yaml:"max_num_seqs"`
	// MaxNumBatchedTokens is the token budget of one step.
	MaxNumBatchedTokens int `yaml:"max_num_batched_tokens"`

	// The behaviours below are not vLLM's; each is off at its zero value,
	// so a profile that does not set them is the vLLM model unchanged. They
	// let tests and benchmarks face engines whose latency responds to load
	// in ways the router's built-in model does not assume
	// (docs/engine-model.md, "Engines of other shapes").

	// BatchSlowdown is k in a step time multiplied by 1 + k·(n−1), n the
	// requests in the step, as third-party vLLM simulators scale latency
	// with load; 0 (the default) multiplies by 1.
	BatchSlowdown float64 `yaml:"batch_slowdown"`
	// RequestOverhead is a fixed delay between a request's arrival and the
	// first step that may schedule it (tokenisation, scheduling), paid once
	// per request, off the GPU: other requests' steps go on meanwhile. 0
	// (the default): none.
	RequestOverhead time.Duration `yaml:"request_overhead"`
	// Slots, when positive, makes the engine llama.cpp-like: that many
	// slots, each running one sequence in its own share of the KV cache
	// (Blocks()/Slots blocks), and a prompt reuses only what the slot it
	// lands in holds from its previous sequence; blocks are never shared
	// between slots (slots.go). It must equal MaxNumSeqs. 0 (the default):
	// vLLM's shared prefix cache.
	Slots int `yaml:"slots"`
	// NoPrefixCaching turns prefix caching off, as vLLM's
	// --no-enable-prefix-caching: every prompt is computed whole, whatever
	// earlier requests left in the cache. For testing a router against an
	// engine whose cache signal it cannot use.
	NoPrefixCaching bool `yaml:"no_prefix_caching"`
	// GPUName is the GPU's name as NVML reports it, the modelName label of
	// the emulator's DCGM metrics; empty means DefaultGPUName. The engine
	// model does not read it.
	GPUName string `yaml:"gpu_name"`
}

// DefaultGPUName is the GPU name of a profile that does not set one.
const DefaultGPUName = "NVIDIA H100 80GB HBM3"

// GPU returns the profile's GPU name, DefaultGPUName when unset.
func (p Profile) GPU() string {
	if p.GPUName != "" {
		return p.GPUName
	}
	return DefaultGPUName
}

// KVBytesPerToken is the KV cache size of one token over all GPUs: K and V of
// every layer and KV head.
func (p Profile) KVBytesPerToken() float64 {
	return float64(2 * p.Layers * p.KVHeads * p.HeadDim * p.DtypeBytes)
}

// WeightBytes is the size of the weights over all GPUs.
func (p Profile) WeightBytes() float64 { return p.Params * float64(p.DtypeBytes) }

// DerivedBlocks is the KV capacity in blocks that vLLM would find in memory:
// what remains of the usable memory after weights and activations.
func (p Profile) DerivedBlocks() int {
	gpus := float64(p.GPUs)
	free := gpus*(p.GPUMemory*p.GPUMemoryUtilization-p.ActivationMemory) - p.WeightBytes()
	if free <= 0 || p.BlockSize <= 0 {
		return 0
	}
	return int(free / (p.KVBytesPerToken() * float64(p.BlockSize)))
}

// Blocks is the KV capacity in blocks: NumGPUBlocks when set, else derived.
func (p Profile) Blocks() int {
	if p.NumGPUBlocks > 0 {
		return p.NumGPUBlocks
	}
	return p.DerivedBlocks()
}

// WithBlockSize returns p with KV blocks of n tokens and, rounded down, the
// same KV capacity in tokens. Coarser blocks model the same cache with
// fewer, cheaper operations (a fleet simulation does one per block of
// every prompt), at the price of sharing prefixes only in whole blocks.
func (p Profile) WithBlockSize(n int) Profile {
	if n <= 0 || n == p.BlockSize {
		return p
	}
	tokens := p.Blocks() * p.BlockSize
	p.BlockSize, p.NumGPUBlocks = n, tokens/n
	return p
}

// Validate reports the first field that makes the profile unusable.
func (p Profile) Validate() error {
	checks := []struct {
		ok   bool
		what string
	}{
		{p.Params > 0, "params must be positive"},
		{p.Layers > 0 && p.Hidden > 0 && p.KVHeads > 0 && p.HeadDim > 0, "layers, hidden, kv_heads and head_dim must be positive"},
		{p.DtypeBytes > 0, "dtype_bytes must be positive"},
		{p.MaxModelLen > 0, "max_model_len must be positive"},
		{p.GPUs > 0, "gpus must be positive"},
		{p.PeakFLOPS > 0 && p.MemBandwidth > 0, "peak_flops and mem_bandwidth must be positive"},
		{p.MFU > 0 && p.MFU <= 1 && p.MBU > 0 && p.MBU <= 1, "mfu and mbu must be in (0, 1]"},
		{p.StepOverhead >= 0 && p.TPOverhead >= 0, "overheads must not be negative"},
		{p.BlockSize > 0, "block_size must be positive"},
		{p.NumGPUBlocks >= 0, "num_gpu_blocks must not be negative"},
		{p.Blocks() > 0, "no KV blocks: set num_gpu_blocks or give the GPUs more memory than the weights"},
		{p.MaxNumSeqs > 0, "max_num_seqs must be positive"},
		{p.MaxNumBatchedTokens > 0, "max_num_batched_tokens must be positive"},
		{p.BatchSlowdown >= 0 && !math.IsInf(p.BatchSlowdown, 0), "batch_slowdown must be a finite number, not negative"},
		{p.RequestOverhead >= 0, "request_overhead must not be negative"},
		{p.Slots >= 0, "slots must not be negative"},
		{p.Slots == 0 || p.Slots == p.MaxNumSeqs, "slots must equal max_num_seqs: one running sequence per slot"},
		{p.Slots == 0 || p.Blocks() >= p.Slots, "slots: fewer KV blocks than slots"},
	}
	for _, c := range checks {
		if !c.ok {
			return fmt.Errorf("profile %q: %s", p.Name, c.what)
		}
	}
	return nil
}

// ParseProfiles reads profiles from YAML of the form {profiles: [...]}.
func ParseProfiles(data []byte) ([]Profile, error) {
	var doc struct {
		Profiles []Profile `yaml:"profiles"`
	}
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("parse profiles: %w", err)
	}
	if len(doc.Profiles) == 0 {
		return nil, errors.New("parse profiles: no profiles")
	}
	for _, p := range doc.Profiles {
		if err := p.Validate(); err != nil {
			return nil, err
		}
	}
	return doc.Profiles, nil
}

var builtins = func() []Profile {
	ps, err := ParseProfiles(builtinProfiles)
	if err != nil {
		panic(err) // the embedded file is part of the program
	}
	return ps
}()

// ProfileNames lists the built-in profiles, sorted.
func ProfileNames() []string {
	names := make([]string, len(builtins))
	for i, p := range builtins {
		names[i] = p.Name
	}
	sort.Strings(names)
	return names
}

// LookupProfile returns the built-in profile with the given name.
func LookupProfile(name string) (Profile, error) {
	for _, p := range builtins {
		if p.Name == name {
			return p, nil
		}
	}
	return Profile{}, fmt.Errorf("unknown profile %q (have %s)", name, strings.Join(ProfileNames(), ", "))
}

// Work is what one step computes, summed over the requests in the batch.
type Work struct {
	// Tokens is the number of tokens computed (prefill chunk tokens plus one
	// per decoding request).
	Tokens int
	// AttendedPositions is the sum, over every computed token, of the number
	// of earlier tokens it attends to.
	AttendedPositions float64
	// ContextTokens is the number of tokens whose KV is read from memory
	// (for every request in the batch, its context up to the end of the step).
	ContextTokens int
	// Requests is the number of requests in the step; only
	// Profile.BatchSlowdown reads it.
	Requests int
}

// AddChunk adds a request that computes tokens [from, to) of its sequence.
func (w *Work) AddChunk(from, to int) {
	if to <= from {
		return
	}
	w.Tokens += to - from
	// Σ_{i=from}^{to-1} i: each token attends to every token before it.
	w.AttendedPositions += (float64(to)*float64(to-1) - float64(from)*float64(from-1)) / 2
	w.ContextTokens += to
	w.Requests++
}

// StepTime is the duration of one step computing w: the slower of the
// compute-bound and the memory-bound time (a roofline), plus fixed overheads.
// An empty step costs nothing.
func (p Profile) StepTime(w Work) time.Duration {
	r := p.roofline()
	return r.stepTime(w)
}

// roofline is StepTime's model with the profile's constants worked out
// once: an engine computes it for every step.
type roofline struct {
	linear  float64 // FLOPs per token of the linear layers
	attend  float64 // FLOPs per attended position
	flops   float64 // FLOP/s reached
	weights float64 // bytes of weights read per step
	kv      float64 // bytes of KV per context token
	bytes   float64 // bytes/s reached
	fixed   time.Duration
	// slowdown is Profile.BatchSlowdown.
	slowdown float64
}

func (p Profile) roofline() roofline {
	gpus := float64(p.GPUs)
	return roofline{
		// Linear layers: 2 FLOPs per parameter per token. Attention: QKᵀ
		// and AV each cost 2·hidden FLOPs per layer per attended position.
		linear: 2 * p.Params,
		attend: 4 * float64(p.Layers) * float64(p.Hidden),
		flops:  gpus * p.PeakFLOPS * p.MFU,
		// Every step reads all weights once and the KV of every context
		// token.
		weights:  p.WeightBytes(),
		kv:       p.KVBytesPerToken(),
		bytes:    gpus * p.MemBandwidth * p.MBU,
		fixed:    p.StepOverhead + p.TPOverhead,
		slowdown: p.BatchSlowdown,
	}
}

func (r *roofline) stepTime(w Work) time.Duration {
	if w.Tokens == 0 {
		return 0
	}
	compute, memory := r.times(w)
	d := r.fixed + seconds(math.Max(compute, memory))
	if r.slowdown > 0 && w.Requests > 1 {
		d = time.Duration(float64(d) * (1 + r.slowdown*float64(w.Requests-1)))
	}
	return d
}

// terms is times as durations.
func (r *roofline) terms(w Work) (compute, memory time.Duration) {
	c, m := r.times(w)
	return seconds(c), seconds(m)
}

// times returns the roofline's two terms for w, in seconds: the time the
// step's FLOPs take at the reached FLOP rate, and the time its bytes take
// at the reached bandwidth.
func (r *roofline) times(w Work) (compute, memory float64) {
	compute = (r.linear*float64(w.Tokens) + r.attend*w.AttendedPositions) / r.flops
	memory = (r.weights + r.kv*float64(w.ContextTokens)) / r.bytes
	return compute, memory
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
