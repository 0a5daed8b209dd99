package request

import (
	"fmt"
	"strings"
	"testing"
)

// sink keeps the benchmarks' results alive.
var sink any

// BenchmarkParseChat is the parse of a chat body into the request facts,
// over conversation length.
func BenchmarkParseChat(b *testing.B) {
	turn := `{"role":"user","content":"` + strings.Repeat(`Tell me more about caching.\n`, 20) + `"},` +
		`{"role":"assistant","content":"` + strings.Repeat(`Prefix caches keep KV blocks.\n`, 40) + `"}`
	for _, turns := range []int{1, 8, 64} {
		body := []byte(`{"model":"m","messages":[{"role":"system","content":"Be brief."},` +
			strings.Repeat(turn+",", turns) + `{"role":"user","content":"Go on."}],"stream":true,"user":"u"}`)
		b.Run(fmt.Sprintf("turns=%d", turns), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				g, e := Parse(Chat, body, "")
				if e != nil {
					b.Fatal(e)
				}
				sink = g
			}
		})
	}
}

// BenchmarkParseMessages is BenchmarkParseChat's conversation as an
// Anthropic Messages API body, its turns as content blocks, beside chat's
// for comparison.
func BenchmarkParseMessages(b *testing.B) {
	turn := `{"role":"user","content":[{"type":"text","text":"` + strings.Repeat(`Tell me more about caching.\n`, 20) + `"}]},` +
		`{"role":"assistant","content":[{"type":"text","text":"` + strings.Repeat(`Prefix caches keep KV blocks.\n`, 40) + `"}]}`
	for _, turns := range []int{1, 8, 64} {
		body := []byte(`{"model":"m","max_tokens":512,"system":[{"type":"text","text":"Be brief."}],"messages":[` +
			strings.Repeat(turn+",", turns) + `{"role":"user","content":"Go on."}],"stream":true,"metadata":{"user_id":"u"}}`)
		b.Run(fmt.Sprintf("turns=%d", turns), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				g, e := Parse(Messages, body, "")
				if e != nil {
					b.Fatal(e)
				}
				sink = g
			}
		})
	}
}
