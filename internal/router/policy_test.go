package router

import (
	"encoding/json"
	"math"
	"testing"
	"time"
)

// A Score's terms add a JSON object of the terms by name; a Score without
// them keeps the shape it had.
func TestScoreJSON(t *testing.T) {
	tests := []struct {
		name  string
		score Score
		want  string
	}{
		{name: "no terms", score: Score{Backend: "b0", Cost: 1.5, TTFT: time.Second, Cached: 16},
			want: `{"Backend":"b0","Cost":1.5,"TTFT":1000000000,"Cached":16}`},
		{name: "terms in order", score: Score{Backend: "b1", Cost: 0.75, Terms: Terms{
			Names: []string{"queued", "compute", "miss"}, Seconds: [MaxTerms]float64{0.25, 0.5, 0}}},
			want: `{"Backend":"b1","Cost":0.75,"TTFT":0,"Cached":0,"Terms":{"queued":0.25,"compute":0.5,"miss":0}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := json.Marshal(tt.score)
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != tt.want {
				t.Errorf("JSON = %s, want %s", b, tt.want)
			}
			if got := tt.score.Terms.Sum(); tt.score.Terms.Len() > 0 && got != tt.score.Cost {
				t.Errorf("Sum = %v, want the cost %v", got, tt.score.Cost)
			}
		})
	}
	inf := Terms{Names: []string{"stream"}, Seconds: [MaxTerms]float64{math.Inf(1)}}
	if b, err := json.Marshal(inf); err != nil || string(b) != `{"stream":"+Inf"}` {
		t.Errorf("JSON of an infinite term = %s, %v", b, err)
	}
}
