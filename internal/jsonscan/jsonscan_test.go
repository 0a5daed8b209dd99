package jsonscan

import (
	"encoding/json"
	"testing"
)

func TestAppendStringMatchesEncodingJSON(t *testing.T) {
	for _, raw := range []string{
		`""`,
		`"plain"`,
		`"tab\tnew\nline\r\"quoted\" back\\slash \/ \b\f"`,
		`"\u00e9\u4e2d\ud83d\ude00"`,
		`"lone surrogate \ud83d then text"`,
		`"lone low \ude00"`,
		`"surrogate then escape \ud83d\n"`,
		`"UTF-8 as is: é 中 😀"`,
	} {
		var want string
		if err := json.Unmarshal([]byte(raw), &want); err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		if got := string(AppendString(nil, []byte(raw))); got != want {
			t.Errorf("AppendString(%s) = %q, want %q", raw, got, want)
		}
	}
}

func TestLookup(t *testing.T) {
	obj := []byte(` { "a" : 1, "b":{"c":[1,{"d":"}"}]}, "e\u0066":"x", "a":"last" } `)
	tests := []struct{ name, want string }{
		{"a", `"last"`},
		{"b", `{"c":[1,{"d":"}"}]}`},
		{"ef", `"x"`},
		{"c", ``},
	}
	for _, tt := range tests {
		if got := string(Field(obj, tt.name)); got != tt.want {
			t.Errorf("Field(%q) = %s, want %s", tt.name, got, tt.want)
		}
	}
	var got []string
	for e := range Elems([]byte(`[ 1 , "two", [3], {"4":4} ]`)) {
		got = append(got, string(e))
	}
	if want := []string{"1", `"two"`, "[3]", `{"4":4}`}; len(got) != 4 || got[3] != want[3] || got[1] != want[1] {
		t.Errorf("Elems = %q, want %q", got, want)
	}
}

func TestIntValue(t *testing.T) {
	for in, want := range map[string]int{
		"0": 0, "42": 42, "42.0": 42, "42.5": -1, "-1": -1, "1e3": -1, `"4"`: -1, "null": -1, "": -1,
		"99999999999999999999999": -1,
	} {
		if got := IntValue([]byte(in)); got != want {
			t.Errorf("IntValue(%s) = %d, want %d", in, got, want)
		}
	}
}

// FuzzMembers walks arbitrary bytes as objects and arrays: no panics, no
// loops, and values always inside the input.
func FuzzMembers(f *testing.F) {
	for _, s := range []string{`{"a":1}`, `{"a":`, `{"a":"\"}`, `[1,[2,{"x":[]}]]`, `{"a"1}`, `{,}`, `[`, `"\\"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for m := range Members(b) {
			if m.Key < 0 || m.Val < m.Key || m.End > len(b) || m.End < m.Val {
				t.Fatalf("member %+v outside %d bytes", m, len(b))
			}
			_ = AppendString(nil, b[m.Val:m.End])
			_ = AppendCompact(nil, b[m.Val:m.End])
		}
		for e := range Elems(b) {
			_ = NonEmpty(e)
			_ = IntValue(e)
		}
	})
}
