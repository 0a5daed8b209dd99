package workload

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// Long generations: coding and agentic sessions, where most turns get a
// short answer or a tool call, and some ask for a whole file, a refactor or
// a long explanation: thousands of tokens. Such a stream holds a batch slot
// and KV for tens of seconds, and a router that prices only the time to
// first token makes hot spots of decode: it is the workload that tells a
// cost for the whole request from one for the first token.
//
// The shape, per session (a coding assistant or agent at work):
//   - a system prompt shared by its kind (3 kinds: 2k–4k tokens each,
//     Zipf-popular, as coding tools ship a long fixed preamble);
//   - a first request of 100–300 tokens of task, then 5–12 more turns;
//   - each turn is a question (55 %: 50–300 tokens, answered in 100–500),
//     a tool result (30 %: 100–1,000 tokens of output, answered by the next
//     call in 20–120), or a request for a long generation (15 %: a file,
//     a patch, a document: 1,500–6,000 tokens, the range coding assistants'
//     max_tokens allow);
//   - think time 3–15 s before a question or a long request, 0.3–2 s before
//     a tool result (the tool runs).
//
// The question answers follow the Azure conversation trace's output
// lengths (p50 129, p90 424); the long requests are the trace's tail made
// common: the Azure code trace's longest replies are 1.9k tokens, and the
// agents that run for minutes ask for more.
func longGen(opts Options, rng *rand.Rand) Workload {
	rate, span := orDefault(opts.Rate, 0.5), orDefault(opts.Duration, 2*time.Minute)
	kinds := []string{
		"You are a coding assistant in the user's editor. Follow the repository's style. " + Text(rng, 16_000),
		"You are an autonomous software agent with a shell, an editor and a test runner. " + Text(rng, 12_000),
		"You are a senior engineer reviewing and writing code. Explain briefly, then give complete files. " + Text(rng, 8_000),
	}
	var w Workload
	long := 0
	for i, start := range arrivals(rng, rate, span) {
		s := Session{ID: fmt.Sprintf("lg-%05d", i), Start: start, System: kinds[zipf(rng, len(kinds), 1)]}
		s.Turns = append(s.Turns, Turn{User: "Task: " + Text(rng, between(rng, 400, 1200)), MaxTokens: between(rng, 100, 500)})
		for range between(rng, 5, 12) {
			var t Turn
			switch x := rng.Float64(); {
			case x < 0.15:
				long++
				t = Turn{Think: seconds(rng, 3, 15), User: "Write it out in full. " + Text(rng, between(rng, 200, 800)), MaxTokens: between(rng, 1500, 6000)}
			case x < 0.45:
				t = Turn{Think: seconds(rng, 0.3, 2), Role: "tool", User: Text(rng, between(rng, 400, 4000)), MaxTokens: between(rng, 20, 120)}
			default:
				t = Turn{Think: seconds(rng, 3, 15), User: Text(rng, between(rng, 200, 1200)), MaxTokens: between(rng, 100, 500)}
			}
			s.Turns = append(s.Turns, t)
		}
		w.Sessions = append(w.Sessions, s)
	}
	w.Description = fmt.Sprintf("%d coding/agent sessions (%.2g/s over %v) of 6–13 turns under 3 shared system prompts of 2k–4k tokens; %d turns ask for 1,500–6,000 tokens, the rest for 20–500",
		len(w.Sessions), rate, span, long)
	return w
}

// seconds returns a uniform duration in [lo, hi] seconds.
func seconds(rng *rand.Rand, lo, hi float64) time.Duration {
	return time.Duration((lo + (hi-lo)*rng.Float64()) * float64(time.Second))
}
