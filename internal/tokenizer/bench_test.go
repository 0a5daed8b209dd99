package tokenizer

import (
	"fmt"
	"strings"
	"testing"
)

// Sinks keep the compiler from discarding the benchmarked work.
var (
	sinkIDs []int32
	sinkInt int
)

// benchText returns about size bytes of prose.
func benchText(size int) string {
	return strings.Repeat(prose+"\n\n", size/len(prose)+1)[:size]
}

func BenchmarkEncode(b *testing.B) {
	// 400 KB is about the 100k-token prompts the emulator must handle.
	for _, size := range []int{1 << 10, 50 << 10, 400 << 10} {
		text := benchText(size)
		b.Run(fmt.Sprintf("bytes=%d", size), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(text)))
			dst := make([]int32, 0, len(text))
			for b.Loop() {
				dst = Encode(dst[:0], text)
			}
			sinkIDs = dst
		})
	}
	b.Run("bytes=51200/nil-dst", func(b *testing.B) {
		text := benchText(50 << 10)
		b.ReportAllocs()
		b.SetBytes(int64(len(text)))
		for b.Loop() {
			sinkIDs = Encode(nil, text)
		}
	})
}

func BenchmarkCount(b *testing.B) {
	text := benchText(50 << 10)
	b.ReportAllocs()
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		sinkInt = Count(text)
	}
}

func BenchmarkEncodeChat(b *testing.B) {
	for _, turns := range []int{1, 8} {
		msgs := []Message{{"system", "You are a helpful assistant."}}
		size := 0
		for i := range turns {
			msgs = append(msgs, Message{"user", benchText(2 << 10)})
			_, ps := Generate(uint64(i), 300)
			msgs = append(msgs, Message{"assistant", strings.Join(ps, "")})
		}
		for _, m := range msgs {
			size += len(m.Content)
		}
		b.Run(fmt.Sprintf("turns=%d", turns), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(size))
			dst := make([]int32, 0, size)
			for b.Loop() {
				dst = EncodeChat(dst[:0], msgs, true)
			}
			sinkIDs = dst
		})
	}
}

func BenchmarkGenerate(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		sinkIDs, _ = Generate(7, 1000)
	}
}
