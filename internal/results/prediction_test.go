package results

import (
	"math"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestTTFTPredictionError(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name         string
		results      func() []Result
		wantError    float64
		wantCoverage float64
	}{
		{
			name: "no prediction",
			results: func() []Result {
				return []Result{{Status: 200, TTFT: 100 * ms}}
			},
		},
		{
			name: "warm-up left out",
			results: func() []Result {
				// The first PredictionWarmUp are 100 % off, the rest 10 %:
				// half of them inside their interval.
				var rs []Result
				for i := range PredictionWarmUp + 100 {
					r := Result{Status: 200, TTFT: 100 * ms, PredictedTTFT: 200 * ms}
					if i >= PredictionWarmUp {
						r.PredictedTTFT = 110 * ms
						r.PredictedTTFTLow, r.PredictedTTFTHigh = 105*ms, 200*ms
						if i%2 == 0 {
							r.PredictedTTFTLow = 90 * ms
						}
					}
					rs = append(rs, r)
				}
				// Failures count for nothing.
				return append(rs, Result{Status: 500, TTFT: ms, PredictedTTFT: time.Second})
			},
			wantError:    0.1,
			wantCoverage: 0.5,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := Summarize("p", tt.results())
			if math.Abs(s.TTFTError-tt.wantError) > 0.01*tt.wantError+1e-9 {
				t.Errorf("TTFTError = %v, want %v", s.TTFTError, tt.wantError)
			}
			if math.Abs(s.TTFTCoverage-tt.wantCoverage) > 1e-9 {
				t.Errorf("TTFTCoverage = %v, want %v", s.TTFTCoverage, tt.wantCoverage)
			}
			var b strings.Builder
			if err := WriteTable(&b, []Summary{s, Summarize("q", nil)}, Bounds{}); err != nil {
				t.Fatal(err)
			}
			if got := strings.Contains(b.String(), "TTFT prediction error"); got != (tt.wantError > 0) {
				t.Errorf("table shows the prediction error: %v, want %v:\n%s", got, tt.wantError > 0, b.String())
			}
		})
	}
}

// The time between tokens is scored like the TTFT, with no interval: past
// the warm-up, predictions 20 % high give a 20 % error, and streams of one
// token (no ITL) and failures count for nothing.
func TestITLPredictionError(t *testing.T) {
	ms := time.Millisecond
	var rs []Result
	for i := range PredictionWarmUp + 50 {
		r := Result{Status: 200, TTFT: 100 * ms, ITL: 10 * ms, PredictedITL: 30 * ms}
		if i >= PredictionWarmUp {
			r.PredictedITL = 12 * ms
		}
		rs = append(rs, r)
	}
	rs = append(rs, Result{Status: 200, TTFT: ms, PredictedITL: time.Second}, Result{Status: 500, ITL: ms, PredictedITL: time.Second})
	s := Summarize("p", rs)
	if math.Abs(s.ITLError-0.2) > 0.01*0.2 {
		t.Errorf("ITLError = %v, want 0.2", s.ITLError)
	}
	if s.TTFTCoverage != 0 || s.TTFTError != 0 {
		t.Errorf("TTFT scores %v, %v from ITL predictions alone, want none", s.TTFTError, s.TTFTCoverage)
	}
	var b strings.Builder
	if err := WriteTable(&b, []Summary{s, Summarize("q", nil)}, Bounds{}); err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`time between tokens, prediction error \(median\) +20\.0 % +-\n`).MatchString(b.String()) {
		t.Errorf("table without the ITL prediction error:\n%s", b.String())
	}
}
