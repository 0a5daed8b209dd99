package fleet

import (
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Package-level sinks keep the compiler from optimising benchmarks away.
var (
	sinkBackends []*Backend
	sinkMetrics  *Metrics
)

// benchFleet is a fleet of n backends serving one of four models each,
// every fifth one down.
func benchFleet(n int) *Fleet {
	bs := make([]*Backend, n)
	for i := range bs {
		bs[i] = NewBackend(i, fmt.Sprintf("b%d", i), &url.URL{Scheme: "http", Host: fmt.Sprintf("10.0.%d.%d:8000", i/256, i%256)})
		bs[i].SetInfo(&Info{Models: []string{fmt.Sprintf("model-%d", i%4), "shared"}, BlockSize: 16, KVBlocks: 25000})
		bs[i].SetHealthy(i%5 != 0)
	}
	return New(bs, Options{})
}

func BenchmarkCandidates(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		f := benchFleet(n)
		b.Run(fmt.Sprintf("backends=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			dst := make([]*Backend, 0, n)
			for b.Loop() {
				dst = f.Candidates(dst[:0], "model-3")
			}
			sinkBackends = dst
		})
	}
	b.Run("backends=1000/parallel", func(b *testing.B) {
		f := benchFleet(1000)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			dst := make([]*Backend, 0, 1000)
			for pb.Next() {
				dst = f.Candidates(dst[:0], "shared")
			}
			sinkBackends = dst
		})
	})
}

// bigVLLMMetrics is vllmMetrics with as many histograms as a real vLLM
// exposes (about twenty, for TTFT, ITL, e2e, queue, prefill, decode,
// prompt and generation lengths...).
var bigVLLMMetrics = func() string {
	var sb strings.Builder
	sb.WriteString(vllmMetrics)
	for i := range 20 {
		sb.WriteString(strings.ReplaceAll(vllmTTFTHistogram, "time_to_first_token", fmt.Sprintf("histogram_%d", i)))
	}
	return sb.String()
}()

// BenchmarkScrapeParse measures parsing one vLLM /metrics: as the fleet does
// it (only the lines it reads reach expfmt) and, for comparison, the whole
// text through expfmt.
func BenchmarkScrapeParse(b *testing.B) {
	b.Run("filtered", func(b *testing.B) {
		var s scraper
		b.ReportAllocs()
		b.SetBytes(int64(len(bigVLLMMetrics)))
		for b.Loop() {
			m, _, err := s.parse(strings.NewReader(bigVLLMMetrics))
			if err != nil {
				b.Fatal(err)
			}
			sinkMetrics = m
		}
	})
	b.Run("whole", func(b *testing.B) {
		p := expfmt.NewTextParser(model.UTF8Validation)
		b.ReportAllocs()
		b.SetBytes(int64(len(bigVLLMMetrics)))
		for b.Loop() {
			if _, err := p.TextToMetricFamilies(strings.NewReader(bigVLLMMetrics)); err != nil {
				b.Fatal(err)
			}
		}
	})
}
