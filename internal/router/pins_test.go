package router

import (
	"fmt"
	"net/url"
	"runtime"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/fleet"
)

func TestPinsForgetTheOldest(t *testing.T) {
	bs := backends(3)
	p := newPins(2)
	p.learn("resp_a", bs[0])
	p.learn("resp_b", bs[1])
	p.learn("resp_a", bs[2]) // learned again: moves, takes no room
	p.learn("resp_c", bs[1]) // full: resp_a, the oldest, goes
	tests := []struct {
		id         string
		want       int // index of the backend alone, or -1: all candidates
		wantPinned bool
	}{
		{"resp_a", -1, false},
		{"resp_b", 1, true},
		{"resp_c", 1, true},
		{"", -1, false},
	}
	for _, tt := range tests {
		got, pinned := p.narrow(tt.id, bs)
		if pinned != tt.wantPinned || (tt.want < 0) != (len(got) == 3) || tt.want >= 0 && (len(got) != 1 || got[0] != bs[tt.want]) {
			t.Errorf("narrow(%q) = %v, %v; want backend %d, pinned %v", tt.id, got, pinned, tt.want, tt.wantPinned)
		}
	}
	if n := p.entries(); n != 2 {
		t.Errorf("%d entries, want 2", n)
	}
	// The backend that holds it is not a candidate: all the others are.
	if got, pinned := p.narrow("resp_b", bs[2:]); pinned || len(got) != 1 || got[0] != bs[2] {
		t.Errorf("narrow without the pinned backend = %v, %v", got, pinned)
	}
	if u, g, pn := p.unknown.Load(), p.gone.Load(), p.pinned.Load(); u != 1 || g != 1 || pn != 2 {
		t.Errorf("unknown %d, gone %d, pinned %d; want 1, 1, 2", u, g, pn)
	}
	var none *pins
	none.learn("resp_a", bs[0])
	if got, pinned := none.narrow("resp_a", bs); pinned || len(got) != 3 {
		t.Error("nil pins pinned a request")
	}
}

// BenchmarkPins measures learning a response id and looking one up, as
// every Responses API request does, from many goroutines at once, with
// the pins full; and reports the heap an id takes.
func BenchmarkPins(b *testing.B) {
	bs := backends(8)
	ids := make([]string, DefaultResponsePins)
	for i := range ids {
		ids[i] = fmt.Sprintf("resp_%032x", i)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	p := newPins(DefaultResponsePins)
	for i, id := range ids {
		p.learn(id, bs[i%8])
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	perID := float64(after.HeapAlloc-before.HeapAlloc) / float64(len(ids))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			i++
			p.learn(ids[i%len(ids)], bs[i%8])
			pinSink, _ = p.narrow(ids[(i*7919)%len(ids)], bs)
		}
	})
	runtime.KeepAlive(p)
	b.ReportMetric(perID, "heap-B/id")
}

var pinSink []*fleet.Backend

// backends returns n backends serving model m (the policies' tests use
// routertest.Backends, which this package cannot import).
func backends(n int) []*fleet.Backend {
	bs := make([]*fleet.Backend, n)
	for i := range bs {
		u, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", 8001+i))
		bs[i] = fleet.NewBackend(i, fmt.Sprintf("b%d", i), u)
		bs[i].SetInfo(&fleet.Info{Models: []string{"m"}, BlockSize: 16, KVBlocks: 25_000})
	}
	return bs
}

func TestMintedResponseIDs(t *testing.T) {
	bs := backends(3)
	r := NewPinningRouter(nil, nil, 0)
	const id = "resp_0123456789abcdef0123456789abcdef"
	minted := r.MintResponseID(id, bs[1])
	if !strings.HasPrefix(minted, id+mintMark) || len(minted) != len(id)+mintSuffix {
		t.Fatalf("MintResponseID(%q) = %q", id, minted)
	}
	// Stable: another router, and the same backend rebuilt from its URL
	// (a restart, a rediscovery), mint the same id.
	again := fleet.NewBackend(7, "renamed", bs[1].URL)
	if got := NewPinningRouter(nil, nil, 0).MintResponseID(id, again); got != minted {
		t.Errorf("another router minted %q, want %q", got, minted)
	}
	tests := []struct {
		name       string
		id         string
		wantOrig   string
		wantMinted bool
	}{
		{"minted", minted, id, true},
		{"backend's own", id, id, false},
		{"empty", "", "", false},
		{"only the suffix", minted[len(id):], minted[len(id):], false},
		{"check altered", minted[:len(minted)-1] + string(minted[len(minted)-1]^1), "", false},
		{"tag altered", minted[:len(id)+len(mintMark)] + "0" + minted[len(id)+len(mintMark)+1:], "", false},
		{"upper-case hex", strings.ToUpper(minted), "", false},
		{"another id's suffix", "resp_other" + minted[len(id):], "", false},
		{"minted twice", r.MintResponseID(minted, bs[2]), id, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			orig, ok := OriginalResponseID(tt.id)
			if tt.wantOrig == "" && !tt.wantMinted {
				tt.wantOrig = tt.id // not minted: unchanged
			}
			if orig != tt.wantOrig || ok != tt.wantMinted {
				t.Errorf("OriginalResponseID(%q) = %q, %v; want %q, %v", tt.id, orig, ok, tt.wantOrig, tt.wantMinted)
			}
		})
	}
	// Ids that would need escaping, and a router without pins, mint nothing.
	for _, odd := range []string{"", "resp/1", `resp"1`, "resp 1", "resp_é"} {
		if got := r.MintResponseID(odd, bs[0]); got != odd {
			t.Errorf("MintResponseID(%q) = %q, want it unchanged", odd, got)
		}
	}
	if got := NewRouter(nil, nil).MintResponseID(id, bs[0]); got != id {
		t.Errorf("a router without pins minted %q", got)
	}
}

// A replica that never saw a response (or lost its memory in a restart)
// sends its continuation where the minted id says, if that backend is a
// candidate; a remembered backend comes first.
func TestNarrowByMintedID(t *testing.T) {
	bs := backends(3)
	r := NewPinningRouter(nil, nil, 0)
	minted := r.MintResponseID("resp_a", bs[2])
	p := newPins(0) // the other replica's
	if got, pinned := p.narrow(minted, bs); !pinned || len(got) != 1 || got[0] != bs[2] {
		t.Errorf("narrow(minted) = %v, %v; want %s alone", got, pinned, bs[2].Name)
	}
	if got, pinned := p.narrow(minted, bs[:2]); pinned || len(got) != 2 {
		t.Errorf("narrow(minted) without its backend = %v, %v; want all candidates", got, pinned)
	}
	p.learn("resp_a", bs[0]) // remembered (by the backend's own id) elsewhere: memory wins
	if got, pinned := p.narrow(minted, bs); !pinned || len(got) != 1 || got[0] != bs[0] {
		t.Errorf("narrow(minted) after learning = %v, %v; want %s", got, pinned, bs[0].Name)
	}
	if got, pinned := p.narrow("resp_b", bs); pinned || len(got) != 3 {
		t.Errorf("narrow(unknown) = %v, %v", got, pinned)
	}
	if st := p.stats(); st.Decoded != 1 || st.Gone != 1 || st.Pinned != 1 || st.Unknown != 1 {
		t.Errorf("stats %+v; want 1 decoded, 1 gone, 1 pinned, 1 unknown", st)
	}
	other := NewPinningRouter(nil, nil, 0)
	if b := other.ResponseBackend(minted, bs); b != bs[2] {
		t.Errorf("ResponseBackend(minted) = %v, want %s", b, bs[2].Name)
	}
	if b := other.ResponseBackend(minted, bs[:2]); b != nil {
		t.Errorf("ResponseBackend(minted) among others = %s, want none", b.Name)
	}
	if b := other.ResponseBackend("resp_a", bs); b != nil {
		t.Errorf("ResponseBackend of an id neither seen nor minted = %s", b.Name)
	}
}

// BenchmarkMintedResponseID measures what a Responses API request with a
// minted previous_response_id pays: minting the response's id, and
// mapping the previous one back to its backend among 64 candidates.
func BenchmarkMintedResponseID(b *testing.B) {
	bs := backends(64)
	r := NewPinningRouter(nil, nil, 0)
	minted := r.MintResponseID("resp_0123456789abcdef0123456789abcdef", bs[63])
	p := newPins(0)
	b.ReportAllocs()
	for b.Loop() {
		idSink = r.MintResponseID("resp_0123456789abcdef0123456789abcdef", bs[5])
		pinSink, _ = p.narrow(minted, bs)
	}
}

var idSink string
