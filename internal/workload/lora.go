package workload

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"
)

// DefaultAdapters is how many LoRA adapters the lora workload spreads its
// sessions over.
const DefaultAdapters = 50

// AdapterName is the name of adapter i of the lora workload: the model a
// request for it names.
func AdapterName(i int) string { return fmt.Sprintf("lora-%02d", i) }

// lora sends short chats to many LoRA adapters of one base model: each
// session names one of adapters adapters (Zipf 1.0 popularity: the first is
// the most requested) as its model, under that adapter's own system prompt
// of 250–750 tokens, for 1–3 turns of 50–200 tokens with 3 s mean think
// time, each answered in 32–256 tokens.
func lora(spec string, opts Options, rng *rand.Rand) (Workload, error) {
	n := DefaultAdapters
	if spec != "" {
		v, err := strconv.Atoi(spec)
		if err != nil || v < 1 || v > 10_000 {
			return Workload{}, fmt.Errorf("lora:N wants a number of adapters in [1, 10000], not %q", spec)
		}
		n = v
	}
	rate, span := orDefault(opts.Rate, 4.0), orDefault(opts.Duration, 2*time.Minute)
	systems := make([]string, n)
	for i := range systems {
		systems[i] = fmt.Sprintf("You are the %s assistant. ", AdapterName(i)) + Text(rng, between(rng, 1_000, 3_000))
	}
	var w Workload
	for i, start := range arrivals(rng, rate, span) {
		a := zipf(rng, n, 1.0)
		s := Session{ID: fmt.Sprintf("lora-%06d", i), Start: start, Adapter: AdapterName(a), System: systems[a]}
		for t := range between(rng, 1, 3) {
			turn := Turn{User: Text(rng, between(rng, 200, 800)), MaxTokens: between(rng, 32, 256)}
			if t > 0 {
				turn.Think = time.Duration(rng.ExpFloat64() * float64(3*time.Second))
			}
			s.Turns = append(s.Turns, turn)
		}
		w.Sessions = append(w.Sessions, s)
	}
	w.Description = fmt.Sprintf("%d chats (%.2g/s over %v) of 1–3 turns, each to one of %d LoRA adapters (Zipf 1.0 popularity) under its own system prompt, 32–256-token answers",
		len(w.Sessions), rate, span, n)
	return w, nil
}

// Adapters lists the distinct LoRA adapters w's sessions name, in order of
// first appearance; empty when every session is for a base model.
func (w *Workload) Adapters() []string {
	var out []string
	seen := map[string]bool{}
	for i := range w.Sessions {
		if m := w.Sessions[i].Adapter; m != "" && !seen[m] {
			seen[m] = true
			out = append(out, m)
		}
	}
	return out
}
