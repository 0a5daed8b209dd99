package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/kvroute/kvroute/internal/emulator"
	"github.com/kvroute/kvroute/internal/results"
	"github.com/kvroute/kvroute/internal/workload"
)

// Fault kinds of a FaultWindow.
const (
	// FaultKill kills the backend at the window's start (listener closed,
	// connections dropped, engine and cache gone, as SIGKILL would) and
	// restarts it, empty, on the same port at its end.
	FaultKill = "kill"
	// Fault500 and Fault429 answer a fraction Rate of requests (default 1)
	// at once with a 500, or a 429 with Retry-After: RetryAfter seconds
	// (default 1).
	Fault500 = "500"
	Fault429 = "429"
	// FaultHang holds every request before the response headers, the
	// connection open, /health still 200.
	FaultHang = "hang"
	// FaultHangAfterFirst sends the first token, then stalls.
	FaultHangAfterFirst = "hang-after-first"
	// FaultDie cuts every stream after Tokens tokens (default 16) with no
	// terminating chunk, as a crash would.
	FaultDie = "die"
	// FaultSlow multiplies every engine step by Factor (default 4).
	FaultSlow = "slow"
	// FaultHealth makes /health answer 503.
	FaultHealth = "health-fail"
)

var faultKinds = []string{FaultKill, Fault500, Fault429, FaultHang, FaultHangAfterFirst, FaultDie, FaultSlow, FaultHealth}

// Fraction is a point in a run, from 0 (its first arrival) to 1 (its last).
// In a schedule file it is a number from 0 to 1 or a percentage ("20%").
type Fraction float64

// UnmarshalYAML reads 0.2 or "20%".
func (f *Fraction) UnmarshalYAML(n *yaml.Node) error {
	text := strings.TrimSpace(n.Value)
	scale := 1.0
	if p, ok := strings.CutSuffix(text, "%"); ok {
		text, scale = strings.TrimSpace(p), 100
	}
	v, err := strconv.ParseFloat(text, 64)
	if err != nil || n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: %q is not a fraction (0.2) or a percentage (20%%)", n.Line, n.Value)
	}
	*f = Fraction(v / scale)
	return nil
}

// FaultWindow is one fault on one backend from At to Until.
type FaultWindow struct {
	// At and Until bound the window, as fractions of the run's arrival
	// span; At < Until.
	At    Fraction `yaml:"at" json:"at"`
	Until Fraction `yaml:"until" json:"until"`
	// Backend is the backend's index, from 0.
	Backend int `yaml:"backend" json:"backend"`
	// Fault is one of the Fault... kinds.
	Fault string `yaml:"fault" json:"fault"`
	// Rate is the fraction of requests a 500 or 429 fault answers (0: 1).
	Rate float64 `yaml:"rate,omitempty" json:"rate,omitempty"`
	// RetryAfter is a 429's Retry-After, in seconds (0: 1).
	RetryAfter int `yaml:"retry_after,omitempty" json:"retry_after,omitempty"`
	// Factor is a slow fault's slowdown (0: 4).
	Factor float64 `yaml:"factor,omitempty" json:"factor,omitempty"`
	// Tokens is where a die fault cuts streams (0: 16).
	Tokens int `yaml:"tokens,omitempty" json:"tokens,omitempty"`
}

// FaultSchedule is what `kvroute bench --faults` does to the fleet during
// each run: the same windows, at the same points of the workload, for
// every policy.
type FaultSchedule struct {
	// Name is the built-in name or the file it was read from.
	Name    string        `json:"name"`
	Windows []FaultWindow `json:"windows"`
}

// builtinFaults are the schedules --faults knows by name.
var builtinFaults = map[string][]FaultWindow{
	// default: one of each failure a fleet meets, overlapping so that at
	// times two or three backends misbehave at once.
	"default": {
		{At: 0.2, Until: 0.5, Backend: 0, Fault: FaultKill},
		{At: 0.3, Until: 0.6, Backend: 1, Fault: Fault500, Rate: 1},
		{At: 0.4, Until: 0.7, Backend: 2, Fault: FaultHang},
		{At: 0.6, Until: 0.8, Backend: 3, Fault: Fault429, Rate: 1, RetryAfter: 1},
		{At: 0.7, Until: 0.9, Backend: 1, Fault: FaultSlow, Factor: 4},
	},
	// streams: the faults that cut a stream after its first token, one at
	// a time but for a short overlap, so that each cut has a healthy
	// backend to continue on.
	"streams": {
		{At: 0.2, Until: 0.5, Backend: 0, Fault: FaultKill},
		{At: 0.4, Until: 0.6, Backend: 1, Fault: FaultHangAfterFirst},
		{At: 0.7, Until: 0.9, Backend: 2, Fault: FaultDie, Tokens: 8},
	},
}

// FaultNames lists the built-in schedules.
func FaultNames() []string {
	names := make([]string, 0, len(builtinFaults))
	for n := range builtinFaults {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// LoadFaults returns the built-in schedule spec names or, failing that,
// reads the file at path spec (see ParseFaults).
func LoadFaults(spec string) (*FaultSchedule, error) {
	if w, ok := builtinFaults[spec]; ok {
		s := &FaultSchedule{Name: spec, Windows: slices.Clone(w)}
		return s, s.Validate(-1)
	}
	data, err := os.ReadFile(spec)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("faults %q: neither a built-in schedule (%s) nor a file", spec, strings.Join(FaultNames(), ", "))
		}
		return nil, fmt.Errorf("faults: %w", err)
	}
	s, err := ParseFaults(data)
	if err != nil {
		return nil, fmt.Errorf("faults %s: %w", spec, err)
	}
	s.Name = spec
	return s, nil
}

// ParseFaults reads a schedule: a YAML or JSON list of windows
// (FaultWindow), e.g.
//
//	# at, until: fractions (0.3) or percentages (30%) of the arrival span
//	- {at: 20%, until: 50%, backend: 0, fault: kill}
//	- {at: 0.3, until: 0.6, backend: 1, fault: "500", rate: 0.5}
//	- {at: 60%, until: 80%, backend: 3, fault: "429", retry_after: 2}
//	- {at: 70%, until: 90%, backend: 1, fault: slow, factor: 4}
func ParseFaults(data []byte) (*FaultSchedule, error) {
	var w []FaultWindow
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	dec.KnownFields(true)
	if err := dec.Decode(&w); err != nil {
		return nil, fmt.Errorf("parse: %w", err)
	}
	s := &FaultSchedule{Windows: w}
	return s, s.Validate(-1)
}

// Validate checks every window and, if backends is not negative, that the
// fleet has every backend the schedule names.
func (s *FaultSchedule) Validate(backends int) error {
	if len(s.Windows) == 0 {
		return errors.New("faults: the schedule has no windows")
	}
	for i, w := range s.Windows {
		where := fmt.Sprintf("faults: window %d (%s on backend %d)", i+1, w.Fault, w.Backend)
		switch {
		case !slices.Contains(faultKinds, w.Fault):
			return fmt.Errorf("faults: window %d: unknown fault %q (want one of %s)", i+1, w.Fault, strings.Join(faultKinds, ", "))
		case !(w.At >= 0 && w.At < w.Until && w.Until <= 1):
			return fmt.Errorf("%s: want 0 ≤ at < until ≤ 1, got at %v until %v", where, w.At, w.Until)
		case w.Backend < 0:
			return fmt.Errorf("%s: negative backend", where)
		case w.Rate < 0 || w.Rate > 1 || w.RetryAfter < 0 || w.Factor < 0 || w.Tokens < 0:
			return fmt.Errorf("%s: rate must be in [0, 1], retry_after, factor and tokens not negative", where)
		}
	}
	if need := s.Backends(); backends >= 0 && need > backends {
		return fmt.Errorf("faults %s names backend %d: it needs at least %d backends, the fleet has %d (--backends)", s.Name, need-1, need, backends)
	}
	// Overlapping windows on one backend add up; their sum must still be
	// a valid emulator fault (e.g. 500 and 429 rates not above 1).
	for _, at := range s.edges() {
		for b := range s.Backends() {
			if f, _ := s.at(at, b); f.Validate() != nil {
				return fmt.Errorf("faults: at %v on backend %d: %w", at, b, f.Validate())
			}
		}
	}
	return nil
}

// Backends returns the number of backends the schedule needs: its highest
// backend index plus one.
func (s *FaultSchedule) Backends() int {
	n := 0
	for _, w := range s.Windows {
		n = max(n, w.Backend+1)
	}
	return n
}

// Active reports whether any window is in force at point at of the run.
func (s *FaultSchedule) Active(at float64) bool {
	for _, w := range s.Windows {
		if float64(w.At) <= at && at < float64(w.Until) {
			return true
		}
	}
	return false
}

// edges returns the points where some window starts or ends, in order.
func (s *FaultSchedule) edges() []float64 {
	var e []float64
	for _, w := range s.Windows {
		e = append(e, float64(w.At), float64(w.Until))
	}
	slices.Sort(e)
	return slices.Compact(e)
}

// at returns backend b's faults at point at of the run and whether it is
// killed then.
func (s *FaultSchedule) at(at float64, b int) (f emulator.Faults, killed bool) {
	or := func(v, def float64) float64 {
		if v == 0 {
			return def
		}
		return v
	}
	for _, w := range s.Windows {
		if w.Backend != b || at < float64(w.At) || at >= float64(w.Until) {
			continue
		}
		switch w.Fault {
		case FaultKill:
			killed = true
		case Fault500:
			f.Rate500 += or(w.Rate, 1)
		case Fault429:
			f.Rate429 += or(w.Rate, 1)
			f.RetryAfter = max(f.RetryAfter, int(or(float64(w.RetryAfter), 1)))
		case FaultHang:
			f.Hang = true
		case FaultHangAfterFirst:
			f.HangAfterFirst = true
		case FaultDie:
			n := int(or(float64(w.Tokens), 16))
			if f.DieAfterTokens == 0 || n < f.DieAfterTokens {
				f.DieAfterTokens = n
			}
		case FaultSlow:
			f.Slow = or(f.Slow, 1) * or(w.Factor, 4)
		case FaultHealth:
			f.HealthFail = true
		}
	}
	return f, killed
}

// faultSpan is the span of a run's arrivals, in model time, that a
// schedule's fractions are of.
func faultSpan(sessions []workload.Session) (time.Duration, error) {
	var span time.Duration
	for _, s := range sessions {
		span = max(span, s.Start)
	}
	if span <= 0 {
		return 0, errors.New("faults: the workload's arrivals span no time; a fault schedule needs open-loop arrivals (not --users)")
	}
	return span, nil
}

// faultClientTimeout bounds each bench request, in wall time, during a
// fault run: far beyond every proxy's own timeouts (kvroute's first-token
// deadline, nginx's and HAProxy's 60 s), so it only ends requests that
// nobody would ever answer.
const faultClientTimeout = 3 * time.Minute

// faultEvent is one backend's faults as set at one point of a run.
type faultEvent struct {
	// at is when they were in force, in model time from the run's start.
	at      time.Duration
	backend int
	faults  emulator.Faults
	killed  bool
}

// faultLog is what driveFaults did, in order; read it after its stop.
type faultLog []faultEvent

// driveFaults applies s to f's emulated backends, the run's arrival span
// being span of model time from start, until every window has passed or
// ctx is done, and records each change in log. The returned stop ends it
// early and waits for it; it leaves the backends as they are (Fleet.Close
// stops them all).
func driveFaults(ctx context.Context, f *Fleet, s *FaultSchedule, start time.Time, span time.Duration, scale float64, log *faultLog, logger *slog.Logger) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		killed := make([]bool, len(f.Names))
		for _, at := range s.edges() {
			wall := time.Duration(at * float64(span) * scale)
			t := time.NewTimer(time.Until(start.Add(wall)))
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			for b := range s.Backends() {
				faults, kill := s.at(at, b)
				if kill != killed[b] {
					var err error
					if kill {
						err = f.Kill(b)
					} else {
						err = f.Restart(b)
					}
					if err != nil {
						logger.Error("fault schedule", "backend", b, "kill", kill, "err", err)
					}
					killed[b] = kill
				}
				// A killed backend's faults go to the server that replaces
				// it, so set them after a restart.
				if err := f.Server(b).SetFaults(faults); err != nil {
					logger.Error("fault schedule", "backend", b, "err", err)
				}
				*log = append(*log, faultEvent{at: time.Duration(float64(time.Since(start)) / scale), backend: b, faults: faults, killed: kill})
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

// markFaults flags the results sent while a window of s was in force.
func markFaults(s *FaultSchedule, span time.Duration, res []results.Result) {
	for i := range res {
		res[i].InFault = s.Active(float64(res[i].Sent) / float64(span))
	}
}

// markMigrated flags the completed streams that a fault in log cut on the
// backend that began them (names[i] is backend i's X-Kvroute-Backend):
// those in flight when it was killed, and those sent to it while it
// stalled streams after their first token or cut them before the tokens
// they had. Without the header (a balancer) nothing is flagged: a
// balancer has no migration.
func markMigrated(log faultLog, names []string, res []results.Result) {
	for i := range res {
		r := &res[i]
		b := slices.Index(names, r.Backend)
		if r.Err != nil || b < 0 {
			continue
		}
		var now emulator.Faults // the backend's faults when r was sent
		for _, e := range log {
			if e.backend != b {
				continue
			}
			if e.at <= r.Sent {
				now = e.faults
			}
			if e.killed && r.Sent < e.at && e.at < r.Sent+r.E2E {
				r.Migrated = true
			}
		}
		switch {
		case r.Migrated:
			r.CutBy = FaultKill
		case now.HangAfterFirst:
			r.Migrated, r.CutBy = true, "stall"
		case now.DieAfterTokens > 0 && r.CompletionTokens > now.DieAfterTokens:
			r.Migrated, r.CutBy = true, FaultDie
		}
	}
}
