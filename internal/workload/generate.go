package workload

import (
	"bufio"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Workload is a stream of sessions to play against an endpoint. A request
// is one turn of a session; single-request workloads have one turn each.
type Workload struct {
	// Name is the spec it was made from.
	Name string
	// Description says in a sentence what it is and at what load.
	Description string
	// Sessions in order of start time.
	Sessions []Session
	// Spread, when not nil, says how a trace's quantized arrivals were
	// spread (Options.SpreadArrivals).
	Spread *Spread
}

// Requests returns the number of requests (turns) in w.
func (w *Workload) Requests() int {
	n := 0
	for _, s := range w.Sessions {
		n += len(s.Turns)
	}
	return n
}

// Options shape a workload. Zero values take each workload's defaults.
type Options struct {
	// Rate is the arrival rate of sessions (of requests, for single-request
	// workloads) per second of model time, Poisson; for traces it replaces
	// the timestamps.
	Rate float64
	// Duration is the span over which sessions arrive (for traces: the
	// part of the trace replayed, in trace time before compression).
	Duration time.Duration
	// Compress divides a trace's timestamps: 4 replays it four times faster.
	Compress float64
	// Seed makes the workload reproducible.
	Seed uint64
	// SpreadArrivals, for a trace, spreads the requests whose timestamps
	// round to the same multiple of it over the interval that follows,
	// at random from Seed, in their order (spread.go): for traces logged
	// at a coarse resolution, whose requests would otherwise arrive in
	// bursts at one instant. In trace time, before Compress. Zero: the
	// timestamps as they are.
	SpreadArrivals time.Duration
}

// Specs lists the workload specs Load understands.
func Specs() []string {
	return []string{"chat", "chat-long", "small-chat", "multiturn[:PATH]", "shared-prefix", "agentic", "long-gen", "mixed", "mooncake[:PATH]", "azure[:PATH]", "lora[:ADAPTERS]"}
}

// dataSetName names a workload for reports: name alone, or with the file
// name of the data set it was read from, so that a report carries no path
// of the machine that produced it.
func dataSetName(name, path string) string {
	if path == "" {
		return name
	}
	return name + ":" + filepath.Base(path)
}

// DefaultMTBench is where multiturn looks for MT-Bench questions, relative
// to the shared data directory.
const DefaultMTBench = "chat/mt_bench_question.jsonl"

// Load makes the workload named by spec: a name, or a name and a path
// ("mooncake:../shared/data/mooncake/conversation_trace.jsonl"). The
// workload's Name is the name and the data set's file name
// ("mooncake:conversation_trace.jsonl"), never where the file is kept.
func Load(spec string, opts Options) (Workload, error) {
	name, path, _ := strings.Cut(spec, ":")
	if opts.SpreadArrivals < 0 {
		return Workload{}, fmt.Errorf("workload %s: negative arrival spread %v", spec, opts.SpreadArrivals)
	}
	if opts.SpreadArrivals > 0 && (name != "mooncake" && name != "azure" || opts.Rate > 0) {
		return Workload{}, fmt.Errorf("workload %s: spreading arrivals is for a trace's own timestamps (mooncake, azure, without a rate)", spec)
	}
	rng := rand.New(rand.NewPCG(opts.Seed, 0x776f726b6c6f6164))
	var (
		w   Workload
		err error
	)
	switch name {
	case "chat":
		w = chatWorkload(DemoChat(), opts)
	case "chat-long":
		w = chatWorkload(LongChat(), opts)
	case "small-chat":
		w = chatWorkload(SmallChat(), opts)
	case "multiturn":
		w, err = multiturn(path, opts, rng)
	case "shared-prefix":
		w = sharedPrefix(opts, rng)
	case "agentic":
		w = agentic(opts, rng)
	case "long-gen":
		w = longGen(opts, rng)
	case "mixed":
		w = mixed(opts, rng)
	case "mooncake":
		w, err = mooncake(path, opts)
	case "azure":
		w, err = azure(path, opts, rng)
	case "lora":
		w, err = lora(path, opts, rng)
	default:
		return Workload{}, fmt.Errorf("unknown workload %q (have %s)", spec, strings.Join(Specs(), ", "))
	}
	if err != nil {
		return Workload{}, fmt.Errorf("workload %s: %w", spec, err)
	}
	if len(w.Sessions) == 0 {
		return Workload{}, fmt.Errorf("workload %s: no requests (duration or rate too small?)", spec)
	}
	w.Name = dataSetName(name, path)
	if w.Spread == nil {
		sort.SliceStable(w.Sessions, func(a, b int) bool { return w.Sessions[a].Start < w.Sessions[b].Start })
		return w, nil
	}
	perm := make([]int, len(w.Sessions))
	for i := range perm {
		perm[i] = i
	}
	sort.SliceStable(perm, func(a, b int) bool { return w.Sessions[perm[a]].Start < w.Sessions[perm[b]].Start })
	sorted := make([]Session, len(perm))
	for j, old := range perm {
		sorted[j] = w.Sessions[old]
	}
	w.Sessions = sorted
	w.Spread.reorder(perm)
	if w.Description != "" {
		w.Description += fmt.Sprintf("; arrivals sharing a %v timestamp spread over it", opts.SpreadArrivals)
	}
	return w, nil
}

// arrivals returns Poisson arrival times at rate per second over span.
func arrivals(rng *rand.Rand, rate float64, span time.Duration) []time.Duration {
	var out []time.Duration
	for t := time.Duration(0); ; {
		t += time.Duration(rng.ExpFloat64() / rate * float64(time.Second))
		if t >= span {
			return out
		}
		out = append(out, t)
	}
}

func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// between returns a uniform integer in [lo, hi].
func between(rng *rand.Rand, lo, hi int) int { return lo + rng.IntN(hi-lo+1) }

// zipf draws k in [0, n) with probability proportional to 1/(k+1)^s.
func zipf(rng *rand.Rand, n int, s float64) int {
	var sum float64
	for k := range n {
		sum += 1 / math.Pow(float64(k+1), s)
	}
	x := rng.Float64() * sum
	for k := range n {
		x -= 1 / math.Pow(float64(k+1), s)
		if x < 0 {
			return k
		}
	}
	return n - 1
}

// chatWorkload is the demo's chat workload (DemoChat) with the rate and
// duration options applied.
func chatWorkload(cfg ChatConfig, opts Options) Workload {
	if opts.Duration > 0 {
		cfg.Span = opts.Duration
	}
	if opts.Rate > 0 {
		cfg.Sessions = max(1, int(opts.Rate*cfg.Span.Seconds()))
	}
	desc := fmt.Sprintf("%d chats of %d turns starting over %v under %d shared system prompts", cfg.Sessions, cfg.Turns, cfg.Span, cfg.SystemPrompts)
	if cfg.HeavyFraction > 0 {
		desc += fmt.Sprintf("; 1 turn in %.0f carries a %d KB document", 1/cfg.HeavyFraction, cfg.DocumentBytes/1000)
	}
	if cfg.LongFraction > 0 {
		desc += fmt.Sprintf("; 1 user in %.0f asks for %d-token replies", 1/cfg.LongFraction, cfg.LongTokens)
	}
	return Workload{Description: desc, Sessions: Chat(cfg, opts.Seed)}
}

// multiturn plays MT-Bench's real two-turn questions, three per
// conversation (six turns), each conversation under one of four shared
// system prompts, with think time between turns.
func multiturn(path string, opts Options, rng *rand.Rand) (Workload, error) {
	if path == "" {
		return Workload{}, errors.New("needs the MT-Bench questions: multiturn:PATH (" + DefaultMTBench + " in the shared data)")
	}
	qs, err := readMTBench(path)
	if err != nil {
		return Workload{}, err
	}
	rate, span := orDefault(opts.Rate, 1.0), orDefault(opts.Duration, 2*time.Minute)
	systems := make([]string, 4)
	for i := range systems {
		systems[i] = "You are a helpful, knowledgeable assistant. " + Text(rng, 2000+2000*i)
	}
	var w Workload
	for i, start := range arrivals(rng, rate, span) {
		s := Session{ID: fmt.Sprintf("mt-%05d", i), Start: start, System: systems[zipf(rng, len(systems), 1)]}
		for q := range 3 {
			question := qs[rng.IntN(len(qs))]
			for j, text := range question {
				think := time.Duration(rng.ExpFloat64() * float64(10*time.Second))
				if q == 0 && j == 0 {
					think = 0
				}
				s.Turns = append(s.Turns, Turn{Think: think, User: text, MaxTokens: between(rng, 128, 384)})
			}
		}
		w.Sessions = append(w.Sessions, s)
	}
	w.Description = fmt.Sprintf("%d conversations (%.2g/s over %v) of 6 MT-Bench turns each under 4 shared system prompts, 10 s mean think time", len(w.Sessions), rate, span)
	return w, nil
}

func readMTBench(path string) ([][]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var qs [][]string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<16), 1<<22)
	for line := 1; sc.Scan(); line++ {
		var q struct {
			Turns []string `json:"turns"`
		}
		if err := json.Unmarshal(sc.Bytes(), &q); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", filepath.Base(path), line, err)
		}
		if len(q.Turns) > 0 {
			qs = append(qs, q.Turns)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(qs) == 0 {
		return nil, fmt.Errorf("%s: no questions", path)
	}
	return qs, nil
}

// sharedPrefix sends short questions under long shared system prompts:
// 16 groups of 4k–8k tokens, Zipf-popular, 64-token answers.
func sharedPrefix(opts Options, rng *rand.Rand) Workload {
	rate, span := orDefault(opts.Rate, 6.0), orDefault(opts.Duration, 2*time.Minute)
	const groups = 16
	systems := make([]string, groups)
	for i := range systems {
		systems[i] = fmt.Sprintf("Group %d instructions. ", i) + Text(rng, between(rng, 16_000, 32_000))
	}
	var w Workload
	for i, start := range arrivals(rng, rate, span) {
		w.Sessions = append(w.Sessions, Session{
			ID: fmt.Sprintf("sp-%06d", i), Start: start, System: systems[zipf(rng, groups, 1.1)],
			Turns: []Turn{{User: Text(rng, between(rng, 80, 320)), MaxTokens: 64}},
		})
	}
	w.Description = fmt.Sprintf("%d questions (%.2g/s over %v) under 16 shared system prompts of 4k–8k tokens (Zipf 1.1 popularity), 64-token answers", len(w.Sessions), rate, span)
	return w
}

// agentic runs tool-use loops: each step sends the previous tool's result
// (100–400 tokens) and gets a short answer, so the context grows by a few
// hundred tokens per step.
func agentic(opts Options, rng *rand.Rand) Workload {
	rate, span := orDefault(opts.Rate, 0.5), orDefault(opts.Duration, 2*time.Minute)
	tools := []string{
		"You are an agent. You can call these tools: " + Text(rng, 8000),
		"You are a coding agent with a shell, an editor and a test runner. " + Text(rng, 12000),
	}
	var w Workload
	for i, start := range arrivals(rng, rate, span) {
		s := Session{ID: fmt.Sprintf("agent-%05d", i), Start: start, System: tools[rng.IntN(len(tools))]}
		s.Turns = append(s.Turns, Turn{User: "Task: " + Text(rng, between(rng, 400, 1200)), MaxTokens: 48})
		for range between(rng, 8, 16) {
			s.Turns = append(s.Turns, Turn{
				Think: time.Duration((0.3 + 1.7*rng.Float64()) * float64(time.Second)), // the tool runs
				Role:  "tool", User: Text(rng, between(rng, 400, 1600)), MaxTokens: between(rng, 24, 64),
			})
		}
		w.Sessions = append(w.Sessions, s)
	}
	w.Description = fmt.Sprintf("%d agent sessions (%.2g/s over %v) of 9–17 tool-use steps; each step adds 100–400 tokens of tool output, 24–64-token answers", len(w.Sessions), rate, span)
	return w
}

// mixed sends many cheap requests and a few very heavy ones: 95 % of 10–50
// prompt tokens and 10–40 output tokens, 5 % of 20k–60k prompt tokens and
// 500–1,500 output tokens.
func mixed(opts Options, rng *rand.Rand) Workload {
	rate, span := orDefault(opts.Rate, 10.0), orDefault(opts.Duration, 2*time.Minute)
	var w Workload
	heavy := 0
	for i, start := range arrivals(rng, rate, span) {
		t := Turn{Blocks: []uint64{rng.Uint64()}, BlockTokens: 1 << 20, Tokens: between(rng, 10, 50), MaxTokens: between(rng, 10, 40)}
		if rng.Float64() < 0.05 {
			heavy++
			n := between(rng, 20_000, 60_000)
			t = Turn{Blocks: uniqueBlocks(rng, n, 512), BlockTokens: 512, Tokens: n, MaxTokens: between(rng, 500, 1500), Heavy: true}
		}
		w.Sessions = append(w.Sessions, Session{ID: fmt.Sprintf("mixed-%06d", i), Start: start, Turns: []Turn{t}})
	}
	w.Description = fmt.Sprintf("%d requests (%.2g/s over %v): %d light (10–50 prompt, 10–40 output tokens) and %d heavy (20k–60k prompt, 500–1,500 output tokens), no shared prefixes",
		len(w.Sessions), rate, span, len(w.Sessions)-heavy, heavy)
	return w
}

// uniqueBlocks returns fresh random block ids for a prompt of tokens tokens.
func uniqueBlocks(rng *rand.Rand, tokens, blockTokens int) []uint64 {
	ids := make([]uint64, (tokens+blockTokens-1)/blockTokens)
	for i := range ids {
		ids[i] = rng.Uint64()
	}
	return ids
}

// mooncake replays a Mooncake-format trace: each hash id becomes a
// deterministic 512-token text block, so the trace's prefix sharing reaches
// the router and the backends exactly; timestamps (divided by Compress, or
// replaced by Poisson arrivals at Rate) give the arrivals.
func mooncake(path string, opts Options) (Workload, error) {
	if path == "" {
		return Workload{}, errors.New("needs a trace: mooncake:PATH")
	}
	trace, err := LoadMooncake(path)
	if err != nil {
		return Workload{}, err
	}
	compress := orDefault(opts.Compress, 1.0)
	rng := rand.New(rand.NewPCG(opts.Seed, 0x6d6f6f6e))
	var (
		w   Workload
		t   time.Duration
		raw []time.Duration
	)
	for i, tr := range trace {
		if opts.Duration > 0 && tr.Arrival >= opts.Duration {
			break
		}
		raw = append(raw, tr.Arrival)
		start := time.Duration(float64(tr.Arrival) / compress)
		if opts.Rate > 0 {
			t += time.Duration(rng.ExpFloat64() / opts.Rate * float64(time.Second))
			start = t
		}
		// Hash ids count from 0 in every trace; offset them so that they
		// cannot meet another workload's block ids.
		ids := make([]uint64, len(tr.HashIDs))
		for j, h := range tr.HashIDs {
			ids[j] = h + 0x6d6f6f6e00000000
		}
		w.Sessions = append(w.Sessions, Session{ID: fmt.Sprintf("mc-%06d", i), Start: start, Turns: []Turn{{
			Blocks: ids, BlockTokens: MooncakeBlockTokens, Tokens: tr.InputTokens, MaxTokens: max(tr.OutputTokens, 1),
		}}})
	}
	if len(w.Sessions) == 0 {
		return w, nil
	}
	if opts.SpreadArrivals > 0 {
		w.Spread = spreadTrace(w.Sessions, raw, opts.SpreadArrivals, compress, opts.Seed)
	}
	last := w.Sessions[len(w.Sessions)-1].Start
	w.Description = fmt.Sprintf("Mooncake trace %s: %d requests over %v of model time (%.1f requests/s; trace time compressed %g×)",
		filepath.Base(path), len(w.Sessions), last.Round(time.Second), float64(len(w.Sessions))/max(last.Seconds(), 1e-9), compress)
	return w, nil
}

// azure replays the Azure LLM inference trace (TIMESTAMP, ContextTokens,
// GeneratedTokens): arrival times and sizes, with prompts that share
// nothing (the trace has no prefix information).
func azure(path string, opts Options, rng *rand.Rand) (Workload, error) {
	if path == "" {
		return Workload{}, errors.New("needs a trace: azure:PATH")
	}
	f, err := os.Open(path)
	if err != nil {
		return Workload{}, err
	}
	defer f.Close()
	r := csv.NewReader(bufio.NewReader(f))
	header, err := r.Read()
	if err != nil {
		return Workload{}, fmt.Errorf("%s: %w", path, err)
	}
	if len(header) < 3 || header[0] != "TIMESTAMP" || header[1] != "ContextTokens" || header[2] != "GeneratedTokens" {
		return Workload{}, fmt.Errorf("%s: header %q, want TIMESTAMP,ContextTokens,GeneratedTokens", path, header)
	}
	compress := orDefault(opts.Compress, 1.0)
	var (
		w     Workload
		first time.Time
		t     time.Duration
		raw   []time.Duration
	)
	for line := 2; ; line++ {
		rec, err := r.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return Workload{}, fmt.Errorf("%s:%d: %w", path, line, err)
		}
		ts, err1 := time.Parse("2006-01-02 15:04:05.999999999", rec[0])
		in, err2 := strconv.Atoi(rec[1])
		out, err3 := strconv.Atoi(rec[2])
		if err := errors.Join(err1, err2, err3); err != nil || in < 1 || out < 0 {
			return Workload{}, fmt.Errorf("%s:%d: bad record %q", path, line, rec)
		}
		if first.IsZero() {
			first = ts
		}
		at := ts.Sub(first)
		if opts.Duration > 0 && at >= opts.Duration {
			break
		}
		raw = append(raw, at)
		start := time.Duration(float64(at) / compress)
		if opts.Rate > 0 {
			t += time.Duration(rng.ExpFloat64() / opts.Rate * float64(time.Second))
			start = t
		}
		in = min(in, 120_000)
		w.Sessions = append(w.Sessions, Session{ID: fmt.Sprintf("az-%06d", line-2), Start: start, Turns: []Turn{{
			Blocks: uniqueBlocks(rng, in, 512), BlockTokens: 512, Tokens: in, MaxTokens: max(out, 1),
		}}})
	}
	if len(w.Sessions) == 0 {
		return w, nil
	}
	if opts.SpreadArrivals > 0 {
		w.Spread = spreadTrace(w.Sessions, raw, opts.SpreadArrivals, compress, opts.Seed)
	}
	last := w.Sessions[len(w.Sessions)-1].Start
	w.Description = fmt.Sprintf("Azure trace %s: %d requests over %v of model time (%.1f requests/s; compressed %g×), no shared prefixes",
		filepath.Base(path), len(w.Sessions), last.Round(time.Second), float64(len(w.Sessions))/max(last.Seconds(), 1e-9), compress)
	return w, nil
}
