package emulator

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"testing"
)

var sinkBytes []byte

// BenchmarkChunkerToken measures the cost of one streamed token's event.
func BenchmarkChunkerToken(b *testing.B) {
	k := newChunker("chatcmpl-0123456789abcdef0123456789abcdef", "chat.completion.chunk", 1700000000, testModel, true, false)
	buf := make([]byte, 0, 512)
	b.ReportAllocs()
	for b.Loop() {
		buf = k.token(buf[:0], " the")
	}
	sinkBytes = buf
}

// BenchmarkStreamRoundTrip measures whole streamed requests through a real
// HTTP server with a fake clock, so only the emulator's own CPU cost counts.
func BenchmarkStreamRoundTrip(b *testing.B) {
	for _, tokens := range []int{16, 256} {
		b.Run(fmt.Sprint("tokens=", tokens), func(b *testing.B) {
			_, url := startServer(b, Config{}, nil)
			body := []byte(fmt.Sprintf(`{"prompt":"%s","max_tokens":%d,"stream":true}`, words(500), tokens))
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					resp, err := http.Post(url+"/v1/completions", "application/json", bytes.NewReader(body))
					if err != nil {
						b.Error(err)
						return
					}
					n, _ := io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if n == 0 {
						b.Error("empty stream")
						return
					}
				}
			})
		})
	}
}
