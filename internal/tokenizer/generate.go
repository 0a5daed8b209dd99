package tokenizer

import (
	"encoding/binary"
	"math/bits"
	"math/rand/v2"
	"strings"

	"github.com/cespare/xxhash/v2"
)

// genWords are the words Generate writes. Each has at most three ASCII
// letters, so with its leading space it is a single four-byte piece and
// therefore exactly one token, and the text Generate returns encodes back to
// the ids it returns. The first commonWords are function words, drawn more
// often so the output reads a little like English.
var genWords = [...]string{
	"the", "of", "and", "to", "a", "in", "is", "it", "you", "for",
	"was", "on", "are", "as", "his", "at", "be", "by", "we", "or",
	"one", "had", "not", "but", "all", "can", "her", "she", "him", "has",
	"how", "its", "may", "new", "now", "old", "our", "out", "see", "two",
	"way", "who", "did", "get", "let", "man", "put", "say", "too", "use",
	"an", "if", "do", "so", "up", "no", "my", "me", "he", "go",
	"us", "am", "day", "any", "few", "big", "end", "far", "got", "own",
	"set", "yes", "yet", "why", "try", "ask", "run", "men", "off", "oh",
	"air", "age", "ago", "act", "add", "arm", "art", "bad", "bag", "bar",
	"bed", "bit", "box", "boy", "bus", "buy", "car", "cat", "cup", "cut",
	"dog", "dry", "due", "ear", "eat", "egg", "eye", "fan", "fat", "fee",
	"fit", "fix", "fly", "fun", "gas", "guy", "hat", "hit", "hot", "ice",
	"ill", "job", "joy", "key", "kid", "law", "lay", "leg", "lie", "lip",
	"log", "lot", "low", "map", "mix", "mud", "net", "nod", "nor", "odd",
	"oil", "pay", "pen", "per", "pet", "pie", "pin", "pop", "pot", "raw",
	"red", "rid", "row", "sad", "sat", "saw", "sea", "sit", "six", "sky",
	"son", "sun", "tax", "tea", "ten", "tie", "tip", "top", "toy", "via",
	"war", "wet", "win", "won", "ran", "led", "met", "aim", "sum", "fed",
}

// commonWords is how many of genWords, from the front, are function words.
const commonWords = 60

// genPiece is one piece Generate can emit, with its id computed once.
type genPiece struct {
	text string
	id   int32
}

// genForms holds, per word, the forms Generate emits so that it neither
// formats nor hashes per token.
type genForms struct {
	first   genPiece // "The": the opening word, capitalised, no space
	mid     genPiece // " the": a word inside a sentence
	capital genPiece // " The": a word after a full stop
}

var (
	genTable  = buildGenTable()
	genPeriod = genPiece{".", tokenID(".")}
	genComma  = genPiece{",", tokenID(",")}
)

func buildGenTable() [len(genWords)]genForms {
	var t [len(genWords)]genForms
	for i, w := range genWords {
		c := strings.ToUpper(w[:1]) + w[1:]
		t[i] = genForms{
			first:   genPiece{c, tokenID(c)},
			mid:     genPiece{" " + w, tokenID(" " + w)},
			capital: genPiece{" " + c, tokenID(" " + c)},
		}
	}
	return t
}

// genStream is the second PCG seed word. It is fixed so that Generate's
// output is a function of seed alone; changing it changes every answer.
const genStream = 0x6b76726f75746531 // "kvroute1"

// ReplySeed is the seed of the reply a server with seed serverSeed gives to
// prompt: Generate(ReplySeed(seed, prompt), n) is its reply of n tokens, so
// an equal prompt gets an equal reply. The emulator seeds its replies with
// it, and the fleet simulator uses it to give the replies an emulator would.
// It is safe for concurrent use.
func ReplySeed(serverSeed uint64, prompt []int32) uint64 {
	var d xxhash.Digest
	var buf [4 * 256]byte
	binary.LittleEndian.PutUint64(buf[:8], serverSeed)
	_, _ = d.Write(buf[:8])
	for len(prompt) > 0 {
		n := min(len(prompt), len(buf)/4)
		for i, t := range prompt[:n] {
			binary.LittleEndian.PutUint32(buf[4*i:], uint32(t))
		}
		_, _ = d.Write(buf[:4*n])
		prompt = prompt[n:]
	}
	return d.Sum64()
}

// Generate returns n deterministic output tokens for seed: ids[i] is the id
// of pieces[i], the piece's text. The text is English-looking words with an
// occasional "." or ",", and each piece is exactly one token, so
// Encode(nil, strings.Join(pieces, "")) equals ids. The output depends only on
// seed and is prefix-stable: Generate(seed, k) is the first k tokens of
// Generate(seed, n) for any k <= n, as a shorter max_tokens cuts a real
// model's answer short. It returns nil slices for n <= 0. The pieces share
// precomputed strings; Generate allocates only the two result slices and is
// safe for concurrent use.
func Generate(seed uint64, n int) (ids []int32, pieces []string) {
	if n <= 0 {
		return nil, nil
	}
	var g generator
	g.init(seed)
	ids = make([]int32, n)
	pieces = make([]string, n)
	for i := range n {
		p := g.next()
		ids[i], pieces[i] = p.id, p.text
	}
	return ids, pieces
}

// generator emits Generate's pieces one at a time. Its output never depends
// on how many are asked for, which is what makes Generate prefix-stable.
type generator struct {
	rng  rand.PCG
	prev genState
}

func (g *generator) init(seed uint64) {
	g.rng.Seed(seed, genStream)
	g.prev = afterNothing
}

// next returns the next piece.
func (g *generator) next() genPiece {
	if g.prev == afterWord && intN(&g.rng, 10) == 0 {
		if intN(&g.rng, 2) == 0 {
			g.prev = afterPeriod
			return genPeriod
		}
		g.prev = afterComma
		return genComma
	}
	f := &genTable[pickWord(&g.rng)]
	prev := g.prev
	g.prev = afterWord
	switch prev {
	case afterNothing:
		return f.first
	case afterPeriod:
		return f.capital
	}
	return f.mid
}

// ReplyStart finds a reply already under way at the end of prompt, as a
// completion request that continues a cut one carries it (the original
// prompt and the text generated so far): it returns the smallest k >= 1
// such that prompt's last k tokens are the first k tokens of the reply to
// the rest, Generate(ReplySeed(serverSeed, prompt[:len(prompt)-k]), k), or
// 0 when there is none. Only positions whose token can open a reply are
// checked in full, so it costs about one ReplySeed of prompt. It is safe
// for concurrent use.
func ReplyStart(serverSeed uint64, prompt []int32) int {
	var d xxhash.Digest
	var buf [8]byte
	binary.LittleEndian.PutUint64(buf[:], serverSeed)
	_, _ = d.Write(buf[:])
	for j, t := range prompt {
		if openers[t] && continues(d.Sum64(), prompt[j:]) {
			return len(prompt) - j
		}
		binary.LittleEndian.PutUint32(buf[:4], uint32(t))
		_, _ = d.Write(buf[:4])
	}
	return 0
}

// continues reports whether tail is the start of the reply seeded seed.
func continues(seed uint64, tail []int32) bool {
	var g generator
	g.init(seed)
	for _, t := range tail {
		if g.next().id != t {
			return false
		}
	}
	return true
}

// openers are the ids of the pieces a reply can open with.
var openers = func() map[int32]bool {
	m := make(map[int32]bool, len(genWords))
	for _, f := range genTable {
		m[f.first.id] = true
	}
	return m
}()

// genState is what Generate emitted last, which decides what may follow.
type genState uint8

const (
	afterNothing genState = iota
	afterWord
	afterPeriod
	afterComma
)

// pickWord returns an index into genWords, favouring function words half of
// the time.
func pickWord(rng *rand.PCG) int {
	if intN(rng, 2) == 0 {
		return intN(rng, commonWords)
	}
	return intN(rng, len(genWords))
}

// intN returns a number in [0, n) from the top of one PCG output. Unlike
// rand.Rand's methods it is defined here, so Generate's output cannot change
// with the Go release; its bias, below n/2^64, does not matter for n this
// small.
func intN(rng *rand.PCG, n int) int {
	hi, _ := bits.Mul64(rng.Uint64(), uint64(n))
	return int(hi)
}
