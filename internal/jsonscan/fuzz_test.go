package jsonscan

import (
	"bytes"
	"encoding/json"
	"testing"
)

// The fuzz target's seed corpus is under testdata/fuzz/FuzzJSONScan; CI
// runs it for a few seconds (.ci/run).

// FuzzJSONScan checks the JSON scanner against encoding/json: on any input
// it stays in bounds and does not panic, and on a valid object every member
// it finds is a valid JSON value, found in the order and number
// encoding/json finds them.
func FuzzJSONScan(f *testing.F) {
	f.Add([]byte(`{"a":1,"b":[true,null,{"c":"\u0065"}],"d":"x\"y"}`))
	f.Add([]byte(` [1, "two", {"three": 3}] `))
	f.Fuzz(func(t *testing.T, data []byte) {
		n := 0
		for m := range Members(data) {
			if m.Key < 0 || m.Val <= m.Key || m.End < m.Val || m.End > len(data) {
				t.Fatalf("member %+v out of bounds of %d bytes", m, len(data))
			}
			if json.Valid(data) && !json.Valid(data[m.Val:m.End]) {
				t.Fatalf("member %q of valid %q is not valid JSON", data[m.Val:m.End], data)
			}
			_ = m.Is("model")
			n++
		}
		for e := range Elems(data) {
			_ = StringValue(e)
			_ = IntValue(e)
			_ = AppendCompact(nil, e)
			_ = AppendString(nil, e)
		}
		_ = Field(data, "usage")
		if !json.Valid(data) {
			return
		}
		var obj map[string]json.RawMessage
		if json.Unmarshal(data, &obj) == nil {
			dec := json.NewDecoder(bytes.NewReader(data))
			_, _ = dec.Token() // {
			want := 0
			for dec.More() {
				if _, err := dec.Token(); err != nil { // the key
					return
				}
				var v json.RawMessage
				if err := dec.Decode(&v); err != nil {
					return
				}
				want++
			}
			if n != want {
				t.Fatalf("found %d members in %q, encoding/json %d", n, data, want)
			}
		}
		if c := AppendCompact(nil, data); !json.Valid(c) {
			t.Fatalf("AppendCompact(%q) = %q, not JSON", data, c)
		}
	})
}
