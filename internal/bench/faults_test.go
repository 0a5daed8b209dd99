package bench

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/emulator"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/results"
	"github.com/kvroute/kvroute/internal/workload"
)

func TestParseFaults(t *testing.T) {
	tests := []struct {
		name    string
		text    string
		want    []FaultWindow
		wantErr string
	}{
		{name: "yaml percentages and fractions",
			text: "- {at: 20%, until: 50%, backend: 0, fault: kill}\n- {at: 0.3, until: 0.6, backend: 1, fault: \"500\", rate: 0.5}\n",
			want: []FaultWindow{{At: 0.2, Until: 0.5, Backend: 0, Fault: FaultKill}, {At: 0.3, Until: 0.6, Backend: 1, Fault: Fault500, Rate: 0.5}}},
		{name: "json",
			text: `[{"at": 0.6, "until": "80%", "backend": 3, "fault": "429", "retry_after": 2}]`,
			want: []FaultWindow{{At: 0.6, Until: 0.8, Backend: 3, Fault: Fault429, RetryAfter: 2}}},
		{name: "unknown fault", text: "- {at: 0, until: 1, backend: 0, fault: melt}", wantErr: "unknown fault"},
		{name: "unknown field", text: "- {at: 0, until: 1, backend: 0, fault: hang, when: 3}", wantErr: "when"},
		{name: "empty window", text: "- {at: 50%, until: 50%, backend: 0, fault: hang}", wantErr: "at < until"},
		{name: "past the end", text: "- {at: 0.5, until: 1.5, backend: 0, fault: hang}", wantErr: "until ≤ 1"},
		{name: "not a fraction", text: "- {at: soon, until: 1, backend: 0, fault: hang}", wantErr: "not a fraction"},
		{name: "rates overlap past 1", text: "- {at: 0, until: 0.5, backend: 0, fault: \"500\"}\n- {at: 0.2, until: 0.6, backend: 0, fault: \"429\"}", wantErr: "exceed 1"},
		{name: "no windows", text: "[]", wantErr: "no windows"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := ParseFaults([]byte(tt.text))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want one with %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(s.Windows) != len(tt.want) {
				t.Fatalf("windows %+v, want %+v", s.Windows, tt.want)
			}
			for i := range tt.want {
				if s.Windows[i] != tt.want[i] {
					t.Errorf("window %d = %+v, want %+v", i, s.Windows[i], tt.want[i])
				}
			}
		})
	}
}

func TestDefaultFaults(t *testing.T) {
	s, err := LoadFaults("default")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Validate(3); err == nil || !strings.Contains(err.Error(), "at least 4 backends") {
		t.Errorf("default on 3 backends: %v, want an error asking for 4", err)
	}
	if err := s.Validate(4); err != nil {
		t.Error(err)
	}
	for _, tt := range []struct {
		at      float64
		backend int
		killed  bool
		rate500 float64
		hang    bool
		rate429 float64
		slow    float64
	}{
		{at: 0.1, backend: 0},
		{at: 0.2, backend: 0, killed: true},
		{at: 0.5, backend: 0},
		{at: 0.45, backend: 1, rate500: 1},
		{at: 0.65, backend: 2, hang: true},
		{at: 0.7, backend: 2},
		{at: 0.7, backend: 3, rate429: 1},
		{at: 0.75, backend: 1, slow: 4},
		{at: 0.95, backend: 1},
	} {
		f, killed := s.at(tt.at, tt.backend)
		if killed != tt.killed || f.Rate500 != tt.rate500 || f.Hang != tt.hang || f.Rate429 != tt.rate429 || f.Slow != tt.slow {
			t.Errorf("at %v backend %d: %+v killed %v", tt.at, tt.backend, f, killed)
		}
	}
	if s.Active(0.1) || !s.Active(0.2) || !s.Active(0.89) || s.Active(0.9) {
		t.Error("Active wrong at the edges of [0.2, 0.9)")
	}
}

// Kill drops the backend's port; Restart brings a fresh server back on the
// same one.
func TestFleetKillRestart(t *testing.T) {
	f := startFleet(t, "round-robin", 1, 0.01)
	addr := f.emu[0].addr
	get := func() error {
		c := &http.Client{Timeout: 5 * time.Second}
		resp, err := c.Get("http://" + addr + "/health")
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	if err := get(); err != nil {
		t.Fatal(err)
	}
	old := f.Server(0)
	if err := f.Kill(0); err != nil {
		t.Fatal(err)
	}
	if err := get(); err == nil {
		t.Fatal("a killed backend still answers")
	}
	if err := f.Restart(0); err != nil {
		t.Fatal(err)
	}
	if err := get(); err != nil {
		t.Fatalf("restarted backend: %v", err)
	}
	if f.Server(0) == old {
		t.Error("the restarted backend is the old server, with its cache")
	}
}

// The default schedule against kvroute and round robin on four emulated
// backends: every failure is classified, and the fault columns are filled.
// Which policy does better is measured (docs/BENCHMARKS.md, Faults), not asserted.
func TestBenchFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("plays a 10 s workload twice, with hung backends")
	}
	p, err := engine.LookupProfile(engine.DefaultProfile)
	if err != nil {
		t.Fatal(err)
	}
	w, err := workload.Load("mixed", workload.Options{Duration: 10 * time.Second, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	sched, err := LoadFaults("default")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	rep, err := RunBench(ctx, Config{Workload: w, Backends: 4, Profile: p, Policies: []string{"kvroute", "round-robin"},
		TimeScale: 0.05, Seed: 1, Faults: sched})
	if err != nil {
		t.Fatal(err)
	}
	for _, run := range rep.Runs {
		s := run.Summary
		t.Logf("%s: %d requests, %d errors: %d lost, %d cut with an event, %d cut silently; %d during faults, TTFT p99 %v",
			s.Name, s.Requests, s.Errors, s.Lost, s.CutWithEvent, s.CutSilent, s.FaultRequests, s.FaultTTFTP99)
		if s.Requests != w.Requests() {
			t.Errorf("%s: %d requests, want %d", s.Name, s.Requests, w.Requests())
		}
		if s.Lost+s.CutWithEvent+s.CutSilent != s.Errors || s.Errors > s.Requests {
			t.Errorf("%s: lost %d + cut %d + cut silently %d != %d errors of %d", s.Name, s.Lost, s.CutWithEvent, s.CutSilent, s.Errors, s.Requests)
		}
		if s.FaultRequests == 0 || s.FaultRequests >= s.Requests || s.FaultTTFTP99 <= 0 {
			t.Errorf("%s: %d of %d requests during faults, TTFT p99 %v", s.Name, s.FaultRequests, s.Requests, s.FaultTTFTP99)
		}
		for _, r := range run.Requests {
			failed := r.Error != ""
			kinds := 0
			for _, k := range []bool{r.Lost, r.CutWithEvent, r.CutSilent} {
				if k {
					kinds++
				}
			}
			if failed && kinds != 1 || !failed && kinds != 0 {
				t.Errorf("%s: request %d/%d (error %q) is lost %v, cut %v, cut silently %v",
					s.Name, r.Session, r.Turn, r.Error, r.Lost, r.CutWithEvent, r.CutSilent)
			}
		}
	}
	var buf bytes.Buffer
	if err := rep.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	for _, row := range []string{"requests lost", "streams cut with an error event", "streams cut silently", "TTFT p99 during faults"} {
		if !strings.Contains(buf.String(), row) {
			t.Errorf("table lacks %q:\n%s", row, buf.String())
		}
	}
}

// A stream is flagged migrated when the backend that began it was killed
// while it streamed, or began it while stalling or cutting streams, and
// never when it failed or came through a balancer (no backend header).
func TestMarkMigrated(t *testing.T) {
	s := time.Second
	log := faultLog{
		{at: 10 * s, backend: 0, killed: true},
		{at: 20 * s, backend: 1, faults: emulator.Faults{HangAfterFirst: true}},
		{at: 20 * s, backend: 2, faults: emulator.Faults{DieAfterTokens: 8}},
		{at: 30 * s, backend: 0},
		{at: 30 * s, backend: 1},
		{at: 30 * s, backend: 2},
	}
	names := []string{"gpu0", "gpu1", "gpu2"}
	tests := []struct {
		name string
		r    results.Result
		want string // CutBy; "": not migrated
	}{
		{"in flight at the kill", results.Result{Backend: "gpu0", Sent: 5 * s, E2E: 10 * s, CompletionTokens: 100}, "kill"},
		{"ended before the kill", results.Result{Backend: "gpu0", Sent: 1 * s, E2E: 5 * s, CompletionTokens: 100}, ""},
		{"after the restart", results.Result{Backend: "gpu0", Sent: 31 * s, E2E: 5 * s, CompletionTokens: 100}, ""},
		{"sent to a stalling backend", results.Result{Backend: "gpu1", Sent: 25 * s, E2E: 70 * s, CompletionTokens: 100}, "stall"},
		{"sent before it stalled", results.Result{Backend: "gpu1", Sent: 15 * s, E2E: 10 * s, CompletionTokens: 100}, ""},
		{"longer than the cut", results.Result{Backend: "gpu2", Sent: 25 * s, E2E: 5 * s, CompletionTokens: 9}, "die"},
		{"within the cut", results.Result{Backend: "gpu2", Sent: 25 * s, E2E: 5 * s, CompletionTokens: 8}, ""},
		{"failed", results.Result{Backend: "gpu0", Sent: 5 * s, E2E: 10 * s, Err: errors.New("cut"), Error: "cut"}, ""},
		{"through a balancer", results.Result{Sent: 5 * s, E2E: 10 * s, CompletionTokens: 100}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := []results.Result{tt.r}
			markMigrated(log, names, res)
			if res[0].Migrated != (tt.want != "") || res[0].CutBy != tt.want {
				t.Errorf("migrated %v, cut by %q; want %q", res[0].Migrated, res[0].CutBy, tt.want)
			}
		})
	}
}

// The reply the bench expects is the one an emulator streams: the check
// that catches a token lost or doubled in a splice must pass on an
// uninterrupted stream.
func TestEmulatorReply(t *testing.T) {
	f := startFleet(t, "round-robin", 1, 0.01)
	msgs := []message{{Role: "system", Content: "You are terse."}, {Role: "user", Content: "tell me a story"},
		{Role: "assistant", Content: "Once."}, {Role: "tool", Content: "42"}}
	c := &Client{BaseURL: f.URL, Model: f.Model, TimeScale: 0.01}
	res, reply := c.chat(t.Context(), time.Now(), f.Model, "s", msgs, 40)
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	if want := emulatorReply(1, msgs, 40); reply != want {
		t.Errorf("reply\n%q\nwant\n%q", reply, want)
	}
	if emulatorReply(2, msgs, 40) == reply {
		t.Error("another seed gives the same reply: the check cannot fail")
	}
}

// The streams schedule through kvroute's proxy (round robin, so that every
// faulted backend gets streams): no request fails, the streams the faults
// cut continue elsewhere with the text the emulators give, and the router
// counts them too.
func TestBenchStreamFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("plays a 20 s workload with a killed, a stalling and a cutting backend")
	}
	p, err := engine.LookupProfile(engine.DefaultProfile)
	if err != nil {
		t.Fatal(err)
	}
	w, err := workload.Load("long-gen", workload.Options{Duration: 20 * time.Second, Rate: 1, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	sched, err := LoadFaults("streams")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	rep, err := RunBench(ctx, Config{Workload: w, Backends: 3, Profile: p, Policies: []string{"round-robin"},
		TimeScale: 0.05, Seed: 1, Faults: sched})
	if err != nil {
		t.Fatal(err)
	}
	s := rep.Runs[0].Summary
	t.Logf("%d requests, %d errors; %d migrated, %d after a stall (router: %v), gap p50 %v p99 %v; %d of %d replies not the emulators' text",
		s.Requests, s.Errors, s.Migrated, s.MigratedStalled, s.RouterMigrations, s.MigrationGapP50, s.MigrationGapP99, s.TextWrong, s.TextChecked)
	if s.Errors != 0 || s.Requests != w.Requests() {
		t.Errorf("%d of %d requests failed (%d lost, %d cut with an event, %d silently); want all %d answered",
			s.Errors, s.Requests, s.Lost, s.CutWithEvent, s.CutSilent, w.Requests())
	}
	if s.Migrated == 0 {
		t.Fatal("no stream was cut by a fault: the test proves nothing")
	}
	if s.TextWrong != 0 || s.TextChecked != s.Requests {
		t.Errorf("%d of %d replies checked are not the emulators' text", s.TextWrong, s.TextChecked)
	}
	// The counts need not be equal: a stream may move twice, and one sent
	// at a window's edge may reach the emulator on the other side of it.
	if s.RouterMigrations["continued"] == 0 {
		t.Errorf("the client saw %d streams continued, the router counts none (%v)", s.Migrated, s.RouterMigrations)
	}
}
