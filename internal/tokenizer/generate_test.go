package tokenizer

import (
	"slices"
	"strings"
	"testing"
	"unicode"
)

func TestGenWords(t *testing.T) {
	if n := len(genWords); n < 150 || n > 250 {
		t.Errorf("len(genWords) = %d, want 150..250", n)
	}
	seen := map[string]bool{}
	for _, w := range genWords {
		if seen[w] {
			t.Errorf("duplicate word %q", w)
		}
		seen[w] = true
		if len(w) == 0 || len(w) > 3 {
			t.Errorf("word %q is not 1..3 letters", w)
		}
		for _, r := range w {
			if r < 'a' || r > 'z' {
				t.Errorf("word %q is not lower-case ASCII", w)
			}
		}
	}
}

func TestGenerate(t *testing.T) {
	tests := []struct {
		name string
		seed uint64
		n    int
	}{
		{"zero", 1, 0},
		{"negative", 1, -5},
		{"one", 1, 1},
		{"two", 2, 2},
		{"short", 3, 16},
		{"medium", 4, 500},
		{"long", 5, 5000},
		{"max seed", ^uint64(0), 1000},
	}
	for seed := uint64(100); seed < 140; seed++ {
		tests = append(tests, struct {
			name string
			seed uint64
			n    int
		}{"many seeds", seed, int(seed * 37 % 5001)})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ids, pieces := Generate(tt.seed, tt.n)
			if want := max(tt.n, 0); len(ids) != want || len(pieces) != want {
				t.Fatalf("Generate(%d, %d) returned %d ids and %d pieces", tt.seed, tt.n, len(ids), len(pieces))
			}
			if tt.n <= 0 {
				return
			}
			text := strings.Join(pieces, "")
			if got := Encode(nil, text); !slices.Equal(got, ids) {
				t.Fatalf("Encode(join(pieces)) differs from ids for seed %d, n %d", tt.seed, tt.n)
			}
			if strings.HasPrefix(text, " ") {
				t.Errorf("first piece %q starts with a space", pieces[0])
			}
			for i, p := range pieces {
				if len(p) > 4 {
					t.Fatalf("piece %d %q is longer than one token", i, p)
				}
				punct := p == "." || p == ","
				if punct && i == 0 {
					t.Fatalf("first piece is %q", p)
				}
				if punct && (pieces[i-1] == "." || pieces[i-1] == ",") {
					t.Fatalf("pieces %d,%d are %q%q: two punctuation marks in a row", i-1, i, pieces[i-1], p)
				}
				if !punct && i > 0 && p[0] != ' ' {
					t.Fatalf("word piece %d %q has no leading space", i, p)
				}
				if i > 0 && pieces[i-1] == "." && !unicode.IsUpper(rune(p[1])) {
					t.Errorf("piece %q after a full stop is not capitalised", p)
				}
			}
		})
	}
}

func TestGeneratePrefixStable(t *testing.T) {
	for seed := range uint64(20) {
		longIDs, longPieces := Generate(seed, 5000)
		for _, k := range []int{1, 2, 3, 10, 99, 1000, 4999, 5000} {
			ids, pieces := Generate(seed, k)
			if !slices.Equal(ids, longIDs[:k]) || !slices.Equal(pieces, longPieces[:k]) {
				t.Fatalf("Generate(%d, %d) is not a prefix of Generate(%d, 5000)", seed, k, seed)
			}
		}
	}
}

func TestGenerateDeterministic(t *testing.T) {
	a, ap := Generate(42, 300)
	b, bp := Generate(42, 300)
	if !slices.Equal(a, b) || !slices.Equal(ap, bp) {
		t.Fatal("Generate(42, 300) differs between calls")
	}
	c, _ := Generate(43, 300)
	if slices.Equal(a, c) {
		t.Fatal("Generate gives the same output for seeds 42 and 43")
	}
}

func TestReplyStart(t *testing.T) {
	prompt := Encode([]int32{BOS}, "Once upon a time.\n")
	reply, _ := Generate(ReplySeed(7, prompt), 20)
	tests := []struct {
		name   string
		prompt []int32
		want   int
	}{
		{"no reply", prompt, 0},
		{"one token", append(prompt[:len(prompt):len(prompt)], reply[:1]...), 1},
		{"twenty tokens", append(prompt[:len(prompt):len(prompt)], reply...), 20},
		{"another server's reply", append(prompt[:len(prompt):len(prompt)], reply[:5]...), 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			seed := uint64(7)
			if tt.name == "another server's reply" {
				seed = 8
				tt.want = 0
			}
			if got := ReplyStart(seed, tt.prompt); got != tt.want {
				t.Errorf("ReplyStart = %d, want %d", got, tt.want)
			}
		})
	}
}
