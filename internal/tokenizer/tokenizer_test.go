package tokenizer

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// prose is ordinary English, written for these tests, to check that the
// tokenizer's density is in the range of real BPE vocabularies.
const prose = `The harbour was quiet in the early morning, and the fishing boats sat low in the water while their crews checked nets and coiled ropes on the wet planks. A few gulls circled overhead, waiting for the first catch to be sorted, and the smell of diesel mixed with salt and seaweed. Nobody spoke much at that hour; there was work to do, and the tide would not wait for anyone who lingered over coffee.

Margaret had run the small bakery on the corner for almost thirty years. She opened at six, long before the office workers arrived, because the fishermen liked their bread warm and their pastries sweet. Her recipes were not written down anywhere. When her nephew asked how much flour went into the rye loaves, she simply laughed and told him to watch her hands until he understood.

Computers are very good at doing exactly what they are told, which is both their greatest strength and their most frustrating weakness. A program that works perfectly on one machine can fail in strange ways on another, simply because a file is missing or a clock is set to the wrong time zone. Experienced engineers learn to distrust their assumptions, to write tests for the cases they think cannot happen, and to read error messages carefully instead of guessing.

In the autumn the trees along the river turned yellow and red, and families came out on the weekends to walk along the old towpath. Children collected conkers and compared them with great seriousness, while their parents talked about schools, holidays, and the rising price of everything. By November the leaves had fallen, the path was muddy, and only the most determined dog walkers still went out before breakfast.

It's easy to underestimate how much planning goes into a successful journey. You need to know where you're going, how long it will take, what the weather might do, and what you'll do if something goes wrong. The best travellers I've met don't plan every minute, but they always have a rough idea of the next step and a little money set aside for surprises.`

func ids(chunks ...string) []int32 {
	var out []int32
	for _, c := range chunks {
		out = append(out, tokenID(c))
	}
	return out
}

func pieces(s string) []string {
	var out []string
	for i := 0; i < len(s); {
		end, _ := nextPiece(s, i)
		out = append(out, s[i:end])
		i = end
	}
	return out
}

func TestEncode(t *testing.T) {
	tests := []struct {
		name   string
		in     string
		pieces []string // pre-tokenizer output
		chunks []string // token texts
	}{
		{name: "empty", in: "", pieces: nil, chunks: nil},
		{name: "word", in: "hello", pieces: []string{"hello"}, chunks: []string{"hello"}},
		{name: "long word", in: "internationalization", pieces: []string{"internationalization"}, chunks: []string{"intern", "ationa", "lizati", "on"}},
		{name: "short word", in: "the", pieces: []string{"the"}, chunks: []string{"the"}},
		{name: "words", in: "hello world", pieces: []string{"hello", " world"}, chunks: []string{"hello", " world"}},
		{name: "long words", in: "quiet harbour", pieces: []string{"quiet", " harbour"}, chunks: []string{"quiet", " harbo", "ur"}},
		{name: "spaces only", in: "   ", pieces: []string{"   "}, chunks: []string{"   "}},
		{name: "long spaces", in: "         ", pieces: []string{"         "}, chunks: []string{"      ", "   "}},
		{name: "spaces before word", in: "  hi", pieces: []string{" ", " hi"}, chunks: []string{" ", " hi"}},
		{name: "spaces before punct", in: "a   !", pieces: []string{"a", "  ", " !"}, chunks: []string{"a", "  ", " !"}},
		{name: "trailing spaces", in: "hi  ", pieces: []string{"hi", "  "}, chunks: []string{"hi", "  "}},
		{name: "newlines", in: "\n\nHello", pieces: []string{"\n\n", "Hello"}, chunks: []string{"\n\n", "Hello"}},
		{name: "newline then space", in: "a\n b", pieces: []string{"a", "\n", " b"}, chunks: []string{"a", "\n", " b"}},
		{name: "tab is not a leading space", in: "a\tb", pieces: []string{"a", "\t", "b"}, chunks: []string{"a", "\t", "b"}},
		{name: "mixed whitespace", in: "x \t y", pieces: []string{"x", " \t", " y"}, chunks: []string{"x", " \t", " y"}},
		{name: "digits", in: "12345", pieces: []string{"123", "45"}, chunks: []string{"123", "45"}},
		{name: "space before digits", in: "a 2024", pieces: []string{"a", " ", "202", "4"}, chunks: []string{"a", " ", "202", "4"}},
		{name: "letters and digits", in: "abc123def", pieces: []string{"abc", "123", "def"}, chunks: []string{"abc", "123", "def"}},
		{name: "punctuation", in: "Hello, world!", pieces: []string{"Hello", ",", " world", "!"}, chunks: []string{"Hello", ",", " world", "!"}},
		{name: "punct run", in: "a ...!?;:", pieces: []string{"a", " ...!?;:"}, chunks: []string{"a", " ...!?", ";:"}},
		{name: "contraction", in: "don't", pieces: []string{"don", "'t"}, chunks: []string{"don", "'t"}},
		{name: "contraction ll", in: "we'll", pieces: []string{"we", "'ll"}, chunks: []string{"we", "'ll"}},
		{name: "quote is not contraction", in: "'x'", pieces: []string{"'", "x", "'"}, chunks: []string{"'", "x", "'"}},
		{name: "accented", in: "héllo wörld", pieces: []string{"héllo", " wörld"}, chunks: []string{"héllo", " wörl", "d"}},
		{name: "cjk", in: "日本語", pieces: []string{"日本語"}, chunks: []string{"日本", "語"}},
		{name: "space before cjk", in: "a 日本", pieces: []string{"a", " 日本"}, chunks: []string{"a", " 日", "本"}},
		{name: "emoji is punct", in: "hi 👋👋", pieces: []string{"hi", " 👋👋"}, chunks: []string{"hi", " 👋", "👋"}},
		{name: "nbsp is space", in: "a\u00a0b", pieces: []string{"a", "\u00a0", "b"}, chunks: []string{"a", "\u00a0", "b"}},
		{name: "invalid utf8", in: "\xff\xfe", pieces: []string{"\xff\xfe"}, chunks: []string{"\xff\xfe"}},
		{name: "invalid inside word", in: "ab\xffcd", pieces: []string{"ab", "\xff", "cd"}, chunks: []string{"ab", "\xff", "cd"}},
		{name: "truncated rune", in: "a \xe6\x97", pieces: []string{"a", " \xe6\x97"}, chunks: []string{"a", " \xe6\x97"}},
		{name: "invalid and valid punct", in: "\xff€€", pieces: []string{"\xff€€"}, chunks: []string{"\xff€", "€"}},
		{name: "invalid bytes chunk like runes", in: "!\xff\xfe\xfd\xfc\xfb\xfa\xf9", pieces: []string{"!\xff\xfe\xfd\xfc\xfb\xfa\xf9"}, chunks: []string{"!\xff\xfe\xfd\xfc\xfb", "\xfa\xf9"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := pieces(tt.in); !slices.Equal(got, tt.pieces) {
				t.Errorf("pieces(%q) = %q, want %q", tt.in, got, tt.pieces)
			}
			want := ids(tt.chunks...)
			got := Encode(nil, tt.in)
			if !slices.Equal(got, want) {
				t.Errorf("Encode(%q) = %v, want ids of %q = %v", tt.in, got, tt.chunks, want)
			}
			if n := Count(tt.in); n != len(want) {
				t.Errorf("Count(%q) = %d, want %d", tt.in, n, len(want))
			}
			if got := Encode([]int32{7}, tt.in); !slices.Equal(got, append([]int32{7}, want...)) {
				t.Errorf("Encode with non-empty dst = %v, want 7 then %v", got, want)
			}
		})
	}
}

// randomText mixes the kinds of input the pre-tokenizer treats differently,
// including invalid UTF-8.
func randomText(rng *rand.Rand, n int) string {
	alphabet := []string{
		"a", "b", "z", "Q", " ", " ", " ", "  ", "\n", "\t", "\r\n", "0", "7", ".", ",", "'", "'s", "'ll",
		"!", "é", "ß", "日", "本", "👋", "\u00a0", "\u3000", "½", "\xff", "\xe6\x97", "\x80", "-", "\"",
	}
	var b strings.Builder
	for range n {
		b.WriteString(alphabet[rng.IntN(len(alphabet))])
	}
	return b.String()
}

func TestCountMatchesEncode(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	inputs := []string{"", prose, strings.Repeat("x", 1000), strings.Repeat(" ", 1000), strings.Repeat("9", 1000)}
	for range 2000 {
		inputs = append(inputs, randomText(rng, rng.IntN(64)))
	}
	for _, in := range inputs {
		got := Encode(nil, in)
		if n := Count(in); n != len(got) {
			t.Fatalf("Count(%q) = %d, len(Encode) = %d", in, n, len(got))
		}
		checkTokens(t, in, got)
	}
}

// checkTokens checks the invariants every encoding must hold: pieces tile
// the input, there are at least as many tokens as the byte cap implies, and
// no text id collides with a special token.
func checkTokens(t *testing.T, in string, got []int32) {
	t.Helper()
	if strings.Join(pieces(in), "") != in {
		t.Fatalf("pieces of %q do not tile it: %q", in, pieces(in))
	}
	if min := (len(in) + chunkBytes - 1) / chunkBytes; len(got) < min {
		t.Fatalf("Encode(%q) gave %d tokens, fewer than %d bytes allow", in, len(got), min)
	}
	for _, id := range got {
		if id < 0 || id >= BOS {
			t.Fatalf("Encode(%q) produced id %d outside [0, BOS)", in, id)
		}
	}
}

func TestEncodeDeterministic(t *testing.T) {
	a := Encode(nil, prose)
	b := Encode(make([]int32, 0, 10), prose)
	if !slices.Equal(a, b) {
		t.Fatal("Encode of the same text differs between calls")
	}
	// The ids are part of the emulator's observable behaviour (prefix
	// cache keys); pin one so that a change to the hashing is noticed.
	if got, want := Encode(nil, "hello world"), []int32{tokenID("hello"), tokenID(" world")}; !slices.Equal(got, want) {
		t.Fatalf("Encode(hello world) = %v, want %v", got, want)
	}
}

// TestEncodeConcatenatesAtPieceBoundaries checks the property that makes
// prefix caching work inside a single text: appending text that starts a new
// piece leaves the earlier tokens untouched.
func TestEncodeConcatenatesAtPieceBoundaries(t *testing.T) {
	tests := []struct{ name, a, b string }{
		{"sentence then newline", "The end.", "\n\nNext paragraph."},
		{"word then punct", "hello", ", world"},
		{"text then digits", "page ", "42"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			whole := Encode(nil, tt.a+tt.b)
			parts := Encode(Encode(nil, tt.a), tt.b)
			if !slices.Equal(whole, parts) {
				t.Fatalf("Encode(%q) = %v, want Encode(%q)+Encode(%q) = %v", tt.a+tt.b, whole, tt.a, tt.b, parts)
			}
		})
	}
}

func TestProseDensity(t *testing.T) {
	n := Count(prose)
	perToken := float64(len(prose)) / float64(n)
	t.Logf("%d bytes, %d tokens, %.2f bytes/token", len(prose), n, perToken)
	if perToken < 3.5 || perToken > 4.8 {
		t.Fatalf("prose is %.2f bytes/token, want 3.5..4.8 like a real BPE tokenizer", perToken)
	}
}

func TestEncodeDoesNotAllocate(t *testing.T) {
	dst := make([]int32, 0, len(prose))
	allocs := testing.AllocsPerRun(20, func() {
		dst = Encode(dst[:0], prose)
	})
	if allocs != 0 {
		t.Errorf("Encode into a large enough dst allocates %v times per run", allocs)
	}
	allocs = testing.AllocsPerRun(20, func() {
		sinkInt = Count(prose)
	})
	if allocs != 0 {
		t.Errorf("Count allocates %v times per run", allocs)
	}
}

func FuzzEncode(f *testing.F) {
	for _, s := range []string{"", "hello world", "12345", "don't", "\xff\xfe", "日本語 text", "  \n\t x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		got := Encode(nil, in)
		if n := Count(in); n != len(got) {
			t.Fatalf("Count(%q) = %d, len(Encode) = %d", in, n, len(got))
		}
		checkTokens(t, in, got)
		if utf8.ValidString(in) {
			for _, p := range pieces(in) {
				if !utf8.ValidString(p) {
					t.Fatalf("piece %q of valid %q splits a rune", p, in)
				}
			}
		}
	})
}
