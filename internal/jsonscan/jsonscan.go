// Package jsonscan holds the small amount of JSON navigation the request
// parser and the proxy's stream scanner need: find a member of an object,
// walk an array, unescape a string, compact a value. It works on the bytes
// in place, without decoding whole documents and without allocating,
// because it runs on every request body and on every streamed chunk. It
// checks structure (strings and brackets), not the full grammar: request
// bodies are checked with json.Valid first, and on backend output a
// malformed value simply reads as absent. No input makes it panic or loop.
package jsonscan

import (
	"bytes"
	"encoding/json"
	"iter"
	"unicode/utf16"
	"unicode/utf8"
)

// SkipSpace returns the index of the first byte of b at or after i that is
// not JSON whitespace.
func SkipSpace(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// stringEnd returns the index just past the JSON string whose opening quote
// is b[i], or -1 if it is not terminated.
func stringEnd(b []byte, i int) int {
	j := i + 1
	for j <= len(b) {
		k := bytes.IndexByte(b[j:], '"')
		if k < 0 {
			return -1
		}
		q := j + k
		// The quote is escaped if an odd number of backslashes precede it.
		n := 0
		for p := q - 1; p > i && b[p] == '\\'; p-- {
			n++
		}
		if n%2 == 0 {
			return q + 1
		}
		j = q + 1
	}
	return -1
}

// valueEnd returns the index just past the JSON value that starts at b[i],
// or -1 if there is no complete value there.
func valueEnd(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch c := b[i]; c {
	case '"':
		return stringEnd(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				e := stringEnd(b, i)
				if e < 0 {
					return -1
				}
				i = e
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return -1
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 't', 'f', 'n':
		j := i + 1
		for j < len(b) {
			switch b[j] {
			case ',', '}', ']', ' ', '\t', '\n', '\r':
				return j
			}
			j++
		}
		return j
	}
	return -1
}

// Member is one name/value pair of a JSON object, located in the object's
// text.
type Member struct {
	// name is the key as written, without its quotes (it may hold escapes).
	name []byte
	// Key is the index of the key's opening quote; Val and End delimit
	// the value.
	Key, Val, End int
	// escaped is set when name holds a backslash: looked for once, not at
	// every comparison, which run for every member of every streamed chunk.
	escaped bool
}

// Is reports whether the member's key is name.
func (m Member) Is(name string) bool {
	if !m.escaped {
		return string(m.name) == name // compiles to a comparison, no allocation
	}
	// A key spelled with escapes ("model" as "mod\u0065l") is legal JSON;
	// it is rare enough to decode the slow way.
	var s string
	q := make([]byte, 0, len(m.name)+2)
	q = append(append(append(q, '"'), m.name...), '"')
	return json.Unmarshal(q, &s) == nil && s == name
}

// Members yields the members of the JSON object obj (which may be surrounded
// by whitespace) in order. It stops early at malformed input, and yields
// nothing if obj is not an object.
func Members(obj []byte) iter.Seq[Member] {
	return func(yield func(Member) bool) {
		i := SkipSpace(obj, 0)
		if i >= len(obj) || obj[i] != '{' {
			return
		}
		i = SkipSpace(obj, i+1)
		for i < len(obj) && obj[i] == '"' {
			ke := stringEnd(obj, i)
			if ke < 0 {
				return
			}
			c := SkipSpace(obj, ke)
			if c >= len(obj) || obj[c] != ':' {
				return
			}
			v := SkipSpace(obj, c+1)
			e := valueEnd(obj, v)
			if e < 0 {
				return
			}
			name := obj[i+1 : ke-1]
			if !yield(Member{name: name, Key: i, Val: v, End: e, escaped: bytes.IndexByte(name, '\\') >= 0}) {
				return
			}
			i = SkipSpace(obj, e)
			if i >= len(obj) || obj[i] != ',' {
				return
			}
			i = SkipSpace(obj, i+1)
		}
	}
}

// Lookup returns the member called name of the object obj. Like Go's and
// Python's JSON decoders, it takes the last of duplicate keys, so the proxy
// reads the same value the backend will.
func Lookup(obj []byte, name string) (m Member, ok bool) {
	for x := range Members(obj) {
		if x.Is(name) {
			m, ok = x, true
		}
	}
	return m, ok
}

// Field returns the value of the member called name of the object obj, or
// nil if there is none.
func Field(obj []byte, name string) []byte {
	if m, ok := Lookup(obj, name); ok {
		return obj[m.Val:m.End]
	}
	return nil
}

// Elems yields the elements of the JSON array arr (which may be surrounded by
// whitespace) in order. It stops early at malformed input, and yields nothing
// if arr is not an array.
func Elems(arr []byte) iter.Seq[[]byte] {
	return func(yield func([]byte) bool) {
		i := SkipSpace(arr, 0)
		if i >= len(arr) || arr[i] != '[' {
			return
		}
		i = SkipSpace(arr, i+1)
		for i < len(arr) && arr[i] != ']' {
			e := valueEnd(arr, i)
			if e < 0 || !yield(arr[i:e]) {
				return
			}
			i = SkipSpace(arr, e)
			if i >= len(arr) || arr[i] != ',' {
				return
			}
			i = SkipSpace(arr, i+1)
		}
	}
}

// IsObject reports whether v is a JSON object.
func IsObject(v []byte) bool { return len(v) > 0 && v[0] == '{' }

// IsString reports whether v is a JSON string.
func IsString(v []byte) bool { return len(v) > 1 && v[0] == '"' }

// IsNull reports whether v is JSON null.
func IsNull(v []byte) bool { return string(v) == "null" }

// IsEmptyArray reports whether v is an array without elements.
func IsEmptyArray(v []byte) bool {
	if len(v) == 0 || v[0] != '[' {
		return false
	}
	for range Elems(v) {
		return false
	}
	return true
}

// NonEmpty reports whether v carries something: a string other than "", an
// array or object with members, a number or true.
func NonEmpty(v []byte) bool {
	switch {
	case len(v) == 0, IsNull(v), string(v) == "false", string(v) == `""`:
		return false
	case v[0] == '[':
		return !IsEmptyArray(v)
	case v[0] == '{':
		for range Members(v) {
			return true
		}
		return false
	}
	return true
}

// IntValue returns the non-negative integer v, or -1 if v is not one. A
// number with a zero fraction ("12.0") counts, as Python clients send them.
func IntValue(v []byte) int {
	if len(v) == 0 {
		return -1
	}
	n := 0
	for i, c := range v {
		switch {
		case c >= '0' && c <= '9':
			if n > (1<<53)/10 {
				return -1
			}
			n = n*10 + int(c-'0')
		case c == '.' && i > 0:
			for _, d := range v[i+1:] {
				if d != '0' {
					return -1
				}
			}
			return n
		default:
			return -1
		}
	}
	return n
}

// AppendString appends the text of the JSON string raw (with its quotes) to
// dst, unescaped. Invalid escapes become U+FFFD, as encoding/json does.
func AppendString(dst, raw []byte) []byte {
	if len(raw) < 2 {
		return dst
	}
	s := raw[1 : len(raw)-1]
	for len(s) > 0 {
		i := bytes.IndexByte(s, '\\')
		if i < 0 {
			return append(dst, s...)
		}
		dst = append(dst, s[:i]...)
		if i+1 >= len(s) {
			return dst
		}
		c := s[i+1]
		s = s[i+2:]
		switch c {
		case 'n':
			dst = append(dst, '\n')
		case 't':
			dst = append(dst, '\t')
		case 'r':
			dst = append(dst, '\r')
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'u':
			r, ok := hex4(s)
			if !ok {
				dst = utf8.AppendRune(dst, utf8.RuneError)
				continue
			}
			s = s[4:]
			if utf16.IsSurrogate(r) {
				r2, ok := rune(-1), false
				if len(s) >= 6 && s[0] == '\\' && s[1] == 'u' {
					r2, ok = hex4(s[2:])
				}
				if dec := utf16.DecodeRune(r, r2); ok && dec != utf8.RuneError {
					r, s = dec, s[6:]
				} else {
					r = utf8.RuneError
				}
			}
			dst = utf8.AppendRune(dst, r)
		default: // '"', '\\', '/' and anything else stand for themselves
			dst = append(dst, c)
		}
	}
	return dst
}

// hex4 decodes the four hex digits at the start of s.
func hex4(s []byte) (rune, bool) {
	if len(s) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range s[:4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			c = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// StringValue returns the text of v if it is a JSON string, else "".
func StringValue(v []byte) string {
	if !IsString(v) {
		return ""
	}
	if bytes.IndexByte(v, '\\') < 0 {
		return string(v[1 : len(v)-1])
	}
	return string(AppendString(nil, v))
}

// AppendCompact appends the JSON value raw to dst without the whitespace
// outside its strings, so that equal values written with different spacing
// render equally.
func AppendCompact(dst, raw []byte) []byte {
	for i := 0; i < len(raw); {
		switch c := raw[i]; c {
		case ' ', '\t', '\n', '\r':
			i++
		case '"':
			e := stringEnd(raw, i)
			if e < 0 {
				return append(dst, raw[i:]...)
			}
			dst = append(dst, raw[i:e]...)
			i = e
		default:
			dst = append(dst, c)
			i++
		}
	}
	return dst
}
