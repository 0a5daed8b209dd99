package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/workload"
)

// What `kvroute sim --find-backends` writes and says beyond sim's table.

// findFile is find.json: the search's answer and every fleet size tried.
type findFile struct {
	Workload    string       `json:"workload"`
	Description string       `json:"description"`
	Profile     string       `json:"profile"`
	Routers     int          `json:"routers"`
	Tile        int          `json:"tile,omitempty"`
	Seed        uint64       `json:"seed"`
	SLOMillis   float64      `json:"slo_ttft_p99_ms"`
	Created     time.Time    `json:"created"`
	Policies    []findPolicy `json:"policies"`
}

// findPolicy is one policy's answer: Backends 0 when no fleet met the
// objective.
type findPolicy struct {
	Policy      string      `json:"policy"`
	Backends    int         `json:"backends"`
	TTFTP99ms   float64     `json:"ttft_p99_ms"`
	HitRate     float64     `json:"hit_rate"`
	Floor       bool        `json:"floor,omitempty"`
	Explanation string      `json:"explanation,omitempty"`
	Trials      []findTrial `json:"trials"`
}

// findTrial is one fleet size tried, with its p99 TTFT in milliseconds.
type findTrial struct {
	Backends  int     `json:"backends"`
	TTFTP99ms float64 `json:"ttft_p99_ms"`
	Errors    int     `json:"errors"`
	Met       bool    `json:"met"`
}

func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// writeFindResults prints why each policy that met no fleet failed and
// what is reachable, and writes find.json into dir.
func writeFindResults(w io.Writer, cfg sim.Config, found []sim.Found, slo time.Duration, dir string) error {
	out := findFile{Workload: cfg.Workload.Name, Description: tiledDescription(cfg), Profile: cfg.Profile.Name,
		Routers: cfg.Routers, Tile: cfg.Tile, Seed: cfg.Seed, SLOMillis: millis(slo), Created: time.Now().UTC()}
	for _, f := range found {
		p := findPolicy{Policy: f.Policy, Backends: f.Backends, TTFTP99ms: millis(f.TTFTP99), HitRate: f.HitRate, Floor: f.Floor}
		for _, tr := range f.Trials {
			p.Trials = append(p.Trials, findTrial{tr.Backends, millis(tr.TTFTP99), tr.Errors, tr.Met})
		}
		if f.Backends == 0 {
			p.Explanation = unreachable(f, slo, &cfg.Workload)
			fmt.Fprintf(w, "\n%s: %s", f.Policy, p.Explanation)
		}
		out.Policies = append(out.Policies, p)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	data, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	path := filepath.Join(dir, "find.json")
	if err := os.WriteFile(path, append(data, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nwrote %s\n", path)
	return nil
}

// unreachable says why no fleet met slo for f and which objective the
// fleet sizes tried do meet: the lowest p99 seen, rounded up.
func unreachable(f sim.Found, slo time.Duration, wl *workload.Workload) string {
	best := -1
	for i, tr := range f.Trials {
		if tr.Errors == 0 && (best < 0 || tr.TTFTP99 < f.Trials[best].TTFTP99) {
			best = i
		}
	}
	if best < 0 {
		return fmt.Sprintf("every fleet size tried had errors; none meets p99 TTFT ≤ %v.\n", slo)
	}
	b := f.Trials[best]
	reach := fmt.Sprintf("  Reachable: p99 TTFT ≤ %v (%.0f ms with %d servers; try --slo-ttft-p99 %v).\n",
		roundUp(b.TTFTP99), millis(b.TTFTP99), b.Backends, roundUp(b.TTFTP99))
	if !f.Floor {
		return fmt.Sprintf("no fleet of up to %d servers meets p99 TTFT ≤ %v (raise --max-backends).\n%s",
			f.Trials[len(f.Trials)-1].Backends, slo, reach)
	}
	longest := "the workload's longest prompts"
	if p99 := promptTokensP99(wl); p99 > 0 {
		longest += fmt.Sprintf(" (p99 %d tokens)", p99)
	}
	return fmt.Sprintf("no fleet meets p99 TTFT ≤ %v. p99 stopped falling as the fleet grew, at about %.0f ms:\n"+
		"  the prefill of %s, which more servers do not shorten.\n%s", slo, millis(b.TTFTP99), longest, reach)
}

// roundUp rounds d up to a round objective: 100 ms under a second, half
// seconds under ten, whole seconds beyond.
func roundUp(d time.Duration) time.Duration {
	step := time.Second
	switch {
	case d < time.Second:
		step = 100 * time.Millisecond
	case d < 10*time.Second:
		step = 500 * time.Millisecond
	}
	return time.Duration(math.Ceil(float64(d)/float64(step))) * step
}

// promptTokensP99 returns the 99th percentile of the workload's prompt
// lengths in tokens, or 0 when its prompts are text without counts.
func promptTokensP99(wl *workload.Workload) int {
	var tokens []int
	for _, s := range wl.Sessions {
		for _, t := range s.Turns {
			if t.Tokens > 0 {
				tokens = append(tokens, t.Tokens)
			}
		}
	}
	if len(tokens) == 0 {
		return 0
	}
	slices.Sort(tokens)
	return tokens[(len(tokens)-1)*99/100]
}
