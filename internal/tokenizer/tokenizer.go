// Package tokenizer is the deterministic stand-in for a Llama-3 tokenizer and
// chat template used by the vLLM emulator.
//
// There is no vocabulary. Text is split into pieces the way the GPT-2 and
// Llama-3 pre-tokenizer regexes split it, each piece is cut into tokens of at
// most six bytes, and each token's id is a hash of its bytes. That gives the
// properties the emulator needs from a real tokenizer: about four bytes of
// English per token, equal text gives equal ids, and a chat conversation's
// next turn starts with exactly the tokens of the previous turn, so prefix
// caching behaves as it does in vLLM. Every function in the package is pure
// and safe for concurrent use.
package tokenizer

import (
	"slices"
	"unicode"
	"unicode/utf8"

	"github.com/cespare/xxhash/v2"
)

// Llama-3 special token ids (facts of the Llama 3 tokenizer). Ordinary text
// never encodes to any of them: hashed ids are all below BOS.
const (
	// VocabSize is the number of token ids in the Llama 3 vocabulary,
	// special tokens included; every id is in [0, VocabSize).
	VocabSize = 128256
	// BOS is <|begin_of_text|>, the first token of every chat prompt.
	BOS int32 = 128000
	// StartHeader is <|start_header_id|>, which opens a message's role.
	StartHeader int32 = 128006
	// EndHeader is <|end_header_id|>, which closes a message's role.
	EndHeader int32 = 128007
	// EOT is <|eot_id|>, which ends every message, including an
	// assistant reply.
	EOT int32 = 128009
)

// textIDs is how many ids hashed text can map to. Keeping it at BOS leaves
// the whole special-token range to the template.
const textIDs = uint64(BOS)

// chunkBytes is the most bytes a token covers, unless a single rune is
// longer (which valid UTF-8 never is). Real BPE vocabularies hold most
// common words whole, space included, so a token averages about four bytes
// of English while covering up to a dozen. A cap of 6 reproduces that
// average (about 4.1 bytes per token on prose); a cap of 4 would give about
// 3.1, since a typical piece like " water" is six bytes.
const chunkBytes = 6

// class is the pre-tokenizer's view of a rune.
type class uint8

const (
	classPunct class = iota // neither space, letter nor number; also invalid bytes
	classSpace
	classLetter
	classNumber
	classMulti // in byteClass only: a non-ASCII byte, to be decoded
)

// byteClass classifies ASCII bytes without the unicode tables, and marks
// every other byte classMulti so that the inner loops need a single
// comparison per byte.
var byteClass = func() (t [256]class) {
	for b := range t {
		if b < utf8.RuneSelf {
			t[b] = classOfRune(rune(b))
		} else {
			t[b] = classMulti
		}
	}
	return t
}()

func classOfRune(r rune) class {
	switch {
	case unicode.IsSpace(r):
		return classSpace
	case unicode.IsLetter(r):
		return classLetter
	case unicode.IsNumber(r):
		return classNumber
	}
	return classPunct
}

// classAt returns the class and byte length of the rune at s[i]. An invalid
// byte is a one-byte punctuation rune, so malformed input still tokenizes.
func classAt(s string, i int) (class, int) {
	if c := byteClass[s[i]]; c != classMulti {
		return c, 1
	}
	r, size := utf8.DecodeRuneInString(s[i:])
	if r == utf8.RuneError && size == 1 {
		return classPunct, 1
	}
	return classOfRune(r), size
}

// span returns the end of the run of class c that starts at i, and whether
// the run is pure ASCII.
func span(s string, i int, c class) (end int, ascii bool) {
	ascii = true
	for {
		for i < len(s) && byteClass[s[i]] == c {
			i++
		}
		if i == len(s) || s[i] < utf8.RuneSelf {
			return i, ascii
		}
		rc, size := classAt(s, i)
		if rc != c {
			return i, ascii
		}
		ascii = false
		i += size
	}
}

// nextPiece returns the end of the pre-tokenizer piece that starts at i (which
// must be < len(s)) and whether every rune of the piece is one byte long, in
// which case it can be cut into tokens without decoding. It follows the
// Llama-3 regex closely enough to give real-looking piece boundaries:
// contractions, an optional ' ' and a run of letters, up to three numbers, an
// optional ' ' and a run of punctuation, or a run of whitespace.
func nextPiece(s string, i int) (end int, ascii bool) {
	// " word" is most pieces of English; skip the general case for it.
	if s[i] == ' ' && i+1 < len(s) && byteClass[s[i+1]] == classLetter {
		return span(s, i+1, classLetter)
	}
	c, size := classAt(s, i)
	switch c {
	case classLetter:
		return span(s, i, classLetter)
	case classNumber:
		// Numbers go in threes, as in Llama 3, so long numbers cost
		// more tokens than words of the same length.
		end, ascii = i, true
		for n := 0; n < 3 && end < len(s); n++ {
			nc, nsize := classAt(s, end)
			if nc != classNumber {
				break
			}
			if nsize > 1 {
				ascii = false
			}
			end += nsize
		}
		return end, ascii
	case classPunct:
		if s[i] == '\'' {
			if n := contraction(s[i+1:]); n > 0 {
				return i + 1 + n, true
			}
		}
		end, ascii = span(s, i+size, classPunct)
		return end, ascii && s[i] < utf8.RuneSelf
	}

	end, ascii = span(s, i, classSpace)
	if end == len(s) || s[end-1] != ' ' {
		return end, ascii
	}
	next, _ := classAt(s, end)
	if next != classLetter && next != classPunct {
		return end, ascii
	}
	// Like GPT-2's `\s+(?!\S)`, the run leaves its last space to the word
	// or punctuation after it, so " the" is one piece wherever it occurs.
	if end-1 > i {
		return end - 1, ascii
	}
	return span(s, end, next)
}

// contraction returns the length of the English contraction suffix ("s",
// "t", "re", "ve", "m", "ll", "d", any case) at the start of s, or 0.
func contraction(s string) int {
	if len(s) == 0 {
		return 0
	}
	switch s[0] | 0x20 {
	case 's', 't', 'm', 'd':
		return 1
	case 'r', 'v':
		if len(s) > 1 && s[1]|0x20 == 'e' {
			return 2
		}
	case 'l':
		if len(s) > 1 && s[1]|0x20 == 'l' {
			return 2
		}
	}
	return 0
}

// chunkLen returns the length of the first token of piece p (non-empty): the
// longest run of whole runes that fits in chunkBytes, but at least one rune.
func chunkLen(p string) int {
	n := 0
	for n < len(p) {
		size := 1
		if p[n] >= utf8.RuneSelf {
			_, size = utf8.DecodeRuneInString(p[n:])
		}
		if n > 0 && n+size > chunkBytes {
			break
		}
		n += size
	}
	return n
}

// tokenID is the id of one chunk of text. Hashing rather than a vocabulary
// makes equal text give equal ids and unequal text almost always differ.
func tokenID(chunk string) int32 {
	return int32(xxhash.Sum64String(chunk) % textIDs)
}

// Encode appends the token ids of text to dst, one per token, and returns the
// extended slice. The ids depend only on text, the same in every process, and
// are all below BOS, so text never yields a special token. Any byte string is
// accepted; invalid UTF-8 bytes are treated as one-byte punctuation. Encode
// allocates only to grow dst, and is safe for concurrent use.
func Encode(dst []int32, text string) []int32 {
	// Every token covers at most chunkBytes bytes, so this is a lower bound
	// on the ids to come and never over-allocates.
	dst = slices.Grow(dst, (len(text)+chunkBytes-1)/chunkBytes)
	for i := 0; i < len(text); {
		end, ascii := nextPiece(text, i)
		p := text[i:end]
		i = end
		if ascii {
			for len(p) > chunkBytes {
				dst = append(dst, tokenID(p[:chunkBytes]))
				p = p[chunkBytes:]
			}
			dst = append(dst, tokenID(p))
			continue
		}
		for len(p) > 0 {
			n := chunkLen(p)
			dst = append(dst, tokenID(p[:n]))
			p = p[n:]
		}
	}
	return dst
}

// Count returns len(Encode(nil, text)) without allocating or hashing. It is
// safe for concurrent use.
func Count(text string) int {
	n := 0
	for i := 0; i < len(text); {
		end, ascii := nextPiece(text, i)
		p := text[i:end]
		i = end
		if ascii {
			n += (len(p) + chunkBytes - 1) / chunkBytes
			continue
		}
		for len(p) > 0 {
			p = p[chunkLen(p):]
			n++
		}
	}
	return n
}
