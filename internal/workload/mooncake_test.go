package workload

import (
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/shareddata/sharedtest"
)

func TestReadMooncake(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    int
		wantErr string
	}{
		{"two lines", `{"timestamp": 0, "input_length": 600, "output_length": 10, "hash_ids": [1, 2]}` + "\n\n" +
			`{"timestamp": 1500.5, "input_length": 100, "output_length": 1, "hash_ids": [1]}`, 2, ""},
		{"not json", "{", 0, "line 1"},
		{"missing field", `{"timestamp": 0, "input_length": 10}`, 0, "required"},
		{"too many ids", `{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1, 2]}`, 0, "hash ids"},
		{"empty prompt", `{"timestamp": 0, "input_length": 0, "output_length": 1}`, 0, "empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ReadMooncake(strings.NewReader(tt.in))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || len(got) != tt.want {
				t.Fatalf("got %d requests, %v; want %d", len(got), err, tt.want)
			}
			if got[1].Arrival != 1500500*time.Microsecond || got[0].HashIDs[1] != 2 {
				t.Errorf("parsed %+v", got)
			}
		})
	}
}

// The real trace matches the facts its README states.
func TestMooncakeConversationTrace(t *testing.T) {
	reqs, err := LoadMooncake(sharedtest.Require(t, "mooncake/conversation_trace.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 12031 {
		t.Fatalf("%d requests, want 12,031", len(reqs))
	}
	var in int
	for _, r := range reqs {
		in += r.InputTokens
	}
	if mean := in / len(reqs); mean < 12000 || mean > 12070 {
		t.Errorf("mean input %d tokens, want about 12,035", mean)
	}
}
