// Package workload generates and reads the request streams that kvroute is
// measured with.
package workload

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"
)

// MooncakeBlockTokens is the number of prompt tokens one hash id of a
// Mooncake trace stands for.
const MooncakeBlockTokens = 512

// TraceRequest is one request of a trace.
type TraceRequest struct {
	// Arrival is the time since the start of the trace.
	Arrival time.Duration
	// InputTokens and OutputTokens are the prompt and generation lengths.
	InputTokens, OutputTokens int
	// HashIDs name the prompt's 512-token blocks: equal ids mean equal
	// content and an equal prefix before it. Nil in traces without prefix
	// information.
	HashIDs []uint64
}

// ReadMooncake reads a trace in the Mooncake format: one JSON object per
// line with timestamp (milliseconds), input_length, output_length and
// hash_ids.
func ReadMooncake(r io.Reader) ([]TraceRequest, error) {
	var out []TraceRequest
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for line := 1; sc.Scan(); line++ {
		if len(sc.Bytes()) == 0 {
			continue
		}
		var rec struct {
			Timestamp    *float64 `json:"timestamp"`
			InputLength  *int     `json:"input_length"`
			OutputLength *int     `json:"output_length"`
			HashIDs      []uint64 `json:"hash_ids"`
		}
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			return nil, fmt.Errorf("mooncake trace line %d: %w", line, err)
		}
		if rec.Timestamp == nil || rec.InputLength == nil || rec.OutputLength == nil {
			return nil, fmt.Errorf("mooncake trace line %d: timestamp, input_length and output_length are required", line)
		}
		if *rec.InputLength < 1 || *rec.OutputLength < 0 || *rec.Timestamp < 0 {
			return nil, fmt.Errorf("mooncake trace line %d: negative or empty lengths", line)
		}
		if want := (*rec.InputLength + MooncakeBlockTokens - 1) / MooncakeBlockTokens; len(rec.HashIDs) > want {
			return nil, fmt.Errorf("mooncake trace line %d: %d hash ids for %d tokens", line, len(rec.HashIDs), *rec.InputLength)
		}
		out = append(out, TraceRequest{
			Arrival:      time.Duration(*rec.Timestamp * float64(time.Millisecond)),
			InputTokens:  *rec.InputLength,
			OutputTokens: *rec.OutputLength,
			HashIDs:      rec.HashIDs,
		})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("mooncake trace: %w", err)
	}
	return out, nil
}

// LoadMooncake reads the Mooncake-format trace at path.
func LoadMooncake(path string) ([]TraceRequest, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ReadMooncake(f)
}
