package epp

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/router"
)

// The picker rewrites a response's ids however Envoy cuts its body into
// chunks: an id split between two chunks is held back until it is whole,
// and nothing else waits.
func TestIDMapChunks(t *testing.T) {
	b, err := fleet.ParseBackend(0, "gpu0=http://10.0.0.11:8000")
	if err != nil {
		t.Fatal(err)
	}
	r := router.NewPinningRouter(nil, nil, 0)
	const orig, prevOrig = "resp_abc123", "resp_prev42"
	prevClient := r.MintResponseID(prevOrig, b)
	client := r.MintResponseID(orig, b)
	stream := fmt.Sprintf("event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":%q,\"previous_response_id\":%q}}\n\n"+
		"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"resp_abc123 is not an id here\"}\n\n"+
		"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":%q,\"previous_response_id\":%q}}\n\n", orig, prevOrig, orig, prevOrig)
	doc := fmt.Sprintf(`{"id":%q,"object":"response","previous_response_id":%q}`, orig, prevOrig)
	replace := strings.NewReplacer(`"`+orig+`"`, `"`+client+`"`, `"`+prevOrig+`"`, `"`+prevClient+`"`)
	for _, tc := range []struct {
		name string
		body string
		sse  bool
	}{{"stream", stream, true}, {"document", doc, false}} {
		for _, size := range []int{1, 3, 7, 64, len(tc.body)} {
			t.Run(fmt.Sprintf("%s in chunks of %d", tc.name, size), func(t *testing.T) {
				m := &idMap{mint: true, client: prevClient, orig: prevOrig}
				m.start(r, b, tc.sse)
				w := newWatcher(tc.sse)
				w.responses = true
				var got strings.Builder
				for i := 0; i < len(tc.body); i += size {
					chunk := []byte(tc.body[i:min(i+size, len(tc.body))])
					w.feed(chunk)
					got.Write(m.feed(w, chunk, false))
					if tc.sse && !m.waiting && len(m.held) > m.maxPrefix {
						t.Fatalf("%d bytes held once the id is known, at most %d may be", len(m.held), m.maxPrefix)
					}
				}
				got.Write(m.feed(w, nil, true))
				if want := replace.Replace(tc.body); got.String() != want {
					t.Errorf("got\n%s\nwant\n%s", got.String(), want)
				}
			})
		}
	}
}
