package report

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/results"
)

// sampleReport builds a plausible three-policy run: kvroute fast with a high
// hit rate, round-robin slow with a long tail, least-request in between.
func sampleReport() *results.Report {
	rng := rand.New(rand.NewPCG(1, 2))
	r := &results.Report{
		Workload:           "mooncake:conversation_trace.jsonl",
		Description:        "Multi-turn conversations sharing long system prompts, replayed at 6 requests/s.",
		Backends:           4,
		Profile:            "h100-llama3-8b",
		KVTokensPerBackend: 200_000,
		TimeScale:          0.1,
		Seed:               42,
		Created:            time.Date(2025, 3, 14, 9, 26, 53, 0, time.UTC),
		Bounds:             results.Bounds{Unlimited: 0.834, Ideal: 0.712},
	}
	type shape struct {
		policy       string
		ttftMedian   time.Duration
		spread, hit  float64
		skew         float64 // how much more backend 0 gets
		errorPercent int
	}
	for _, sh := range []shape{
		{"round-robin", 900 * time.Millisecond, 1.1, 0.31, 0.1, 2},
		{"least-request", 500 * time.Millisecond, 0.9, 0.38, 0.05, 0},
		{"kvroute", 120 * time.Millisecond, 0.8, 0.66, 0.25, 0},
	} {
		var reqs []results.Result
		for i := range 400 {
			sent := time.Duration(float64(300*time.Second) * float64(i) / 400)
			ttft := time.Duration(float64(sh.ttftMedian) * math.Exp(sh.spread*rng.NormFloat64()))
			prompt := 2000 + rng.IntN(6000)
			res := results.Result{
				Session: i / 5, Turn: i % 5, Backend: fmt.Sprintf("gpu%d", i%4), Route: "prefix",
				Status: 200, Sent: sent, TTFT: ttft, E2E: ttft + 4*time.Second, ITL: 20*time.Millisecond + time.Duration(rng.IntN(10))*time.Millisecond,
				PromptTokens: prompt, CachedTokens: int(sh.hit * float64(prompt)), CompletionTokens: 200,
			}
			if rng.IntN(100) < sh.errorPercent {
				res.Status, res.Error = 503, "no backend available"
			}
			reqs = append(reqs, res)
		}
		run := results.Run{Policy: sh.policy, Requests: reqs}
		var busy []time.Duration
		for b := range 4 {
			share := 1.0
			if b == 0 {
				share += sh.skew
			}
			bs := results.BackendSeries{
				Name: fmt.Sprintf("gpu%d", b), Busy: time.Duration(share * float64(200*time.Second)),
				PromptTokens: 1_000_000, CachedTokens: int64(sh.hit * 1_000_000),
			}
			for k := range 620 { // more than the chart keeps
				at := time.Duration(k) * 500 * time.Millisecond
				wave := 6 + 4*math.Sin(float64(k)/40+float64(b))
				bs.Samples = append(bs.Samples, results.LoadSample{
					At: at, Running: int(wave * share), Waiting: rng.IntN(3) + int(sh.skew*10)*boolInt(b == 0), KVUsage: 0.5,
				})
			}
			busy = append(busy, bs.Busy)
			run.Backends = append(run.Backends, bs)
		}
		run.Summary = results.Summarize(sh.policy, reqs)
		run.Summary.Imbalance = results.Imbalance(busy)
		if sh.policy == "kvroute" {
			run.Goodput = &results.Goodput{SLO: 2 * time.Second, Rate: 8, Points: []results.GoodputPoint{
				{Rate: 4, TTFTP99: 600 * time.Millisecond, Met: true},
				{Rate: 8, TTFTP99: 1800 * time.Millisecond, Met: true},
				{Rate: 16, TTFTP99: 9 * time.Second, Errors: 3},
				{Rate: 12, TTFTP99: 3 * time.Second},
			}}
		}
		r.Runs = append(r.Runs, run)
	}
	return r
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func render(t *testing.T, r *results.Report) string {
	t.Helper()
	var buf bytes.Buffer
	if err := Render(&buf, r); err != nil {
		t.Fatalf("RenderHTML: %v", err)
	}
	return buf.String()
}

// svgBlocks returns every <svg>…</svg> element of page.
func svgBlocks(t *testing.T, page string) []string {
	t.Helper()
	var blocks []string
	for rest := page; ; {
		i := strings.Index(rest, "<svg")
		if i < 0 {
			return blocks
		}
		j := strings.Index(rest[i:], "</svg>")
		if j < 0 {
			t.Fatalf("unterminated <svg> at %q", rest[i:min(i+80, len(rest))])
		}
		blocks = append(blocks, rest[i:i+j+len("</svg>")])
		rest = rest[i+j:]
	}
}

// checkPage asserts what must hold of any rendered report.
func checkPage(t *testing.T, page string) {
	t.Helper()
	for i, block := range svgBlocks(t, page) {
		d := xml.NewDecoder(strings.NewReader(block))
		for {
			_, err := d.Token()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("svg %d is not well-formed XML: %v\n%s", i, err, block)
			}
		}
	}
	if m := regexp.MustCompile(`NaN|[-+]?\bInf\b`).FindString(page); m != "" {
		t.Errorf("page contains %q", m)
	}
	withoutNS := strings.ReplaceAll(page, `xmlns="http://www.w3.org/2000/svg"`, "")
	for _, bad := range []string{"http://", "https://", "<script", "<link", "<img", "<iframe", "url(", "@import", "src="} {
		if strings.Contains(withoutNS, bad) {
			t.Errorf("page contains %q: it must not reference anything outside itself", bad)
		}
	}
}

func TestReportHTML(t *testing.T) {
	r := sampleReport()
	page := render(t, r)
	checkPage(t, page)
	if got := len(svgBlocks(t, page)); got != 1+1+3+1 { // CDF, hit rate, 3 loads, goodput
		t.Errorf("got %d charts, want 6", got)
	}
	for _, want := range []string{
		"round-robin", "least-request", "kvroute", r.Workload, r.Description,
		"ideal-router bound 71.2 %", "unlimited-cache bound 83.4 %", // the bounds, labelled on the chart
		"4 backends × h100-llama3-8b, 200,000 KV tokens each", "2025-03-14",
		`<tr class="kvroute">`, `class="best"`, "Goodput", "✗ missed",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	if path := os.Getenv("KVROUTE_REPORT_SAMPLE"); path != "" {
		if err := os.WriteFile(path, []byte(page), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s (%d bytes)", path, len(page))
	}
}

// A fault run (bench --faults) adds its columns to the summary table.
func TestReportHTMLFaults(t *testing.T) {
	r := sampleReport()
	if page := render(t, r); strings.Contains(page, "in faults") {
		t.Error("fault columns without faults")
	}
	for i := range r.Runs {
		s := &r.Runs[i].Summary
		s.FaultRequests, s.Lost, s.CutWithEvent, s.CutSilent, s.FaultTTFTP99 = 10, i, 2*i, 3*i, time.Duration(i+1)*time.Second
	}
	page := render(t, r)
	checkPage(t, page)
	for _, want := range []string{"requests lost", "cut, error event", "cut, silent", "TTFT p99 in faults"} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q", want)
		}
	}
}

func TestReportHTMLDownsamples(t *testing.T) {
	page := render(t, sampleReport())
	for _, m := range regexp.MustCompile(`points="([^"]*)"`).FindAllStringSubmatch(page, -1) {
		if n := strings.Count(m[1], ","); n > 300 {
			t.Errorf("a line has %d points, want at most 300", n)
		}
	}
	if len(page) > 300_000 {
		t.Errorf("page is %d bytes, want it small", len(page))
	}
}

func TestReportHTMLBestValues(t *testing.T) {
	page := render(t, sampleReport())
	// kvroute has the lowest TTFT p50 and the highest hit rate in the sample.
	row := page[strings.Index(page, `<tr class="kvroute">`):]
	row = row[:strings.Index(row, "</tr>")]
	cells := regexp.MustCompile(`<td( class="best")?>`).FindAllStringSubmatch(row, -1)
	// cells: policy, requests, errors, TTFT p50, …, hit rate (index 10).
	if len(cells) < 11 {
		t.Fatalf("kvroute row has %d cells: %s", len(cells), row)
	}
	for _, c := range []struct {
		name string
		i    int
	}{{"TTFT p50", 3}, {"hit rate", 10}} {
		if cells[c.i][1] == "" {
			t.Errorf("kvroute's %s is not highlighted: %s", c.name, row)
		}
	}
	if cells[1][1] != "" {
		t.Errorf("requests (equal, no better direction) highlighted: %s", row)
	}
}

func TestReportHTMLEdgeCases(t *testing.T) {
	nan := math.NaN()
	tests := []struct {
		name   string
		report *results.Report
		want   []string
	}{
		{"empty", &results.Report{}, []string{"No runs were recorded."}},
		{"one policy, no requests", &results.Report{Runs: []results.Run{{Policy: "kvroute"}}}, []string{"No successful requests to plot.", "No load samples."}},
		{"zeros", &results.Report{Backends: 2, Runs: []results.Run{{
			Policy:   "round-robin",
			Requests: []results.Result{{TTFT: 0}, {TTFT: 0}},
			Summary:  results.Summary{Requests: 2},
			Backends: []results.BackendSeries{{Name: "a", Samples: []results.LoadSample{{}, {}}}, {Name: "b"}},
			Goodput:  &results.Goodput{},
		}}}, []string{"round-robin", "no rate tried met the SLO"}},
		{"all failed", &results.Report{Runs: []results.Run{{
			Policy:   "p2c",
			Requests: []results.Result{{Error: "boom", TTFT: time.Second}},
			Summary:  results.Summary{Requests: 1, Errors: 1},
		}}}, []string{"No successful requests to plot."}},
		{"non-finite values", &results.Report{
			TimeScale: math.Inf(1),
			Bounds:    results.Bounds{Ideal: nan, Unlimited: math.Inf(1)},
			Runs: []results.Run{{
				Policy:   "kvroute",
				Requests: []results.Result{{TTFT: time.Millisecond}, {TTFT: 3 * time.Millisecond}},
				Summary:  results.Summary{Requests: 2, HitRate: nan, PromptTokens: 10, Imbalance: math.Inf(1), OutputTokensPerSec: nan, Span: time.Second},
				Backends: []results.BackendSeries{{Name: "a", Busy: time.Second, Samples: []results.LoadSample{{At: time.Second, Running: 1}}}},
				Goodput:  &results.Goodput{Rate: nan, SLO: time.Second, Points: []results.GoodputPoint{{Rate: nan}}},
			}, {
				Policy:  "round-robin",
				Summary: results.Summary{Requests: 2, HitRate: math.Inf(-1), PromptTokens: 10},
				Goodput: &results.Goodput{Rate: math.Inf(1)},
			}},
		}, []string{"kvroute", "round-robin"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			page := render(t, tt.report)
			checkPage(t, page)
			for _, want := range tt.want {
				if !strings.Contains(page, want) {
					t.Errorf("page lacks %q", want)
				}
			}
		})
	}
}

func TestReportHTMLEscapes(t *testing.T) {
	const evil = `<script>alert("x")</script>&`
	r := sampleReport()
	r.Workload, r.Description = evil, evil
	r.Runs[0].Policy = evil
	r.Runs[1].Backends[0].Name = evil
	page := render(t, r)
	checkPage(t, page)
	if strings.Contains(page, "<script") {
		t.Error("an unescaped <script> made it into the page")
	}
	if !strings.Contains(page, "&lt;script&gt;") {
		t.Error("the escaped name is missing")
	}
}

func TestReportWriteHTML(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "out")
	r := sampleReport()
	if err := WriteHTML(dir, r); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "report.html"))
	if err != nil {
		t.Fatal(err)
	}
	if want := render(t, r); string(data) != want {
		t.Error("report.html differs from RenderHTML's output")
	}
}

func TestReportNiceTicks(t *testing.T) {
	tests := []struct {
		max  float64
		n    int
		want []float64
	}{
		{0, 4, []float64{0, 0.5, 1}},
		{math.NaN(), 4, []float64{0, 0.5, 1}},
		{17, 4, []float64{0, 5, 10, 15, 20}},
		{300, 5, []float64{0, 100, 200, 300}},
		{0.3, 5, []float64{0, 0.1, 0.2, 0.3}},
		{1, 4, []float64{0, 0.5, 1}},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.max), func(t *testing.T) {
			got := niceTicks(tt.max, tt.n)
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("niceTicks(%v, %d) = %v, want %v", tt.max, tt.n, got, tt.want)
			}
		})
	}
}
