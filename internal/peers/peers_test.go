package peers

import (
	"context"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
)

// replicaFleet is one replica's view of the same two backends.
func replicaFleet(t *testing.T) []*fleet.Backend {
	t.Helper()
	var bs []*fleet.Backend
	for i, raw := range []string{"http://10.0.0.1:8000", "http://10.0.0.2:8000"} {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		bs = append(bs, fleet.NewBackend(i, u.Host, u))
	}
	return bs
}

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

// A replica polls two others over real HTTP: their counts are summed onto
// its own backends, its own report (it is listed among its peers) is left
// out, and a peer that stops answering stops counting once its report is
// older than MaxAge: it is no longer among the replicas heard either, by
// whose names a burst's lanes are split.
func TestPollSumsOtherReplicas(t *testing.T) {
	self, a, b := replicaFleet(t), replicaFleet(t), replicaFleet(t)
	a[0].Start(100, 300)
	a[0].Start(50, 80).FirstToken()
	b[0].Start(10, 20)
	b[1].Start(7, 9)
	self[1].Start(1000, 2000) // its own: must not come back as a peer's
	sa := httptest.NewServer(Handler("a", func() []*fleet.Backend { return a }))
	defer sa.Close()
	sb := httptest.NewServer(Handler("b", func() []*fleet.Backend { return b }))
	defer sb.Close()
	ss := httptest.NewServer(Handler("self", func() []*fleet.Backend { return self }))
	defer ss.Close()

	c := &clock{t: time.Unix(1000, 0)}
	p := NewPoller("self", func() []*fleet.Backend { return self },
		Options{Peers: []string{sa.URL, sb.URL + "/", ss.URL}, MaxAge: time.Second, Now: c.now})
	p.Poll(context.Background())
	if got := strings.Join(p.Replicas(), ","); got != "a,b" {
		t.Errorf("replicas heard %q, want a,b (not itself)", got)
	}

	got := self[0].PeerLoad(c.now(), time.Second)
	if got == nil {
		t.Fatal("no peer load after a poll")
	}
	want := fleet.Load{Requests: 3, PrefillTokens: 110, Decoding: 1, DecodeTokens: 400}
	if got.Load != want || got.Peers != 2 {
		t.Errorf("backend 0: peer load %+v from %d peers, want %+v from 2", got.Load, got.Peers, want)
	}
	if got := self[1].PeerLoad(c.now(), time.Second); got == nil || got.Load != (fleet.Load{Requests: 1, PrefillTokens: 7, DecodeTokens: 9}) {
		t.Errorf("backend 1: peer load %+v, want only b's request", got)
	}

	sb.Close()
	c.t = c.t.Add(600 * time.Millisecond)
	p.Poll(context.Background()) // a answers, b does not: b's report still counts
	if got := self[1].PeerLoad(c.now(), time.Second); got == nil || got.Peers != 2 {
		t.Fatalf("after one missed poll: %+v, want b still counted", got)
	}
	c.t = c.t.Add(600 * time.Millisecond)
	p.Poll(context.Background())
	got = self[1].PeerLoad(c.now(), time.Second)
	if got == nil || got.Peers != 1 || got.Load != (fleet.Load{}) {
		t.Errorf("after b's report aged out: %+v, want a alone, idle on backend 1", got)
	}
	if got := strings.Join(p.Replicas(), ","); got != "a" {
		t.Errorf("replicas heard after b's report aged out %q, want a", got)
	}
}

type resolver map[string][]string

func (r resolver) LookupHost(_ context.Context, host string) ([]string, error) { return r[host], nil }

// A dns+http peer stands for every address of the name, looked up at every
// poll, with the given port.
func TestDNSPeersExpand(t *testing.T) {
	p := NewPoller("x", nil, Options{
		Peers:    []string{"dns+http://kvroute-peers.ns.svc:9091", "http://10.1.1.1:9091"},
		Resolver: resolver{"kvroute-peers.ns.svc": {"10.0.0.7", "fd00::1"}},
	})
	got := strings.Join(p.targets(context.Background()), " ")
	want := "http://10.0.0.7:9091 http://[fd00::1]:9091 http://10.1.1.1:9091"
	if got != want {
		t.Errorf("targets %q, want %q", got, want)
	}
}

func TestValidate(t *testing.T) {
	for _, ok := range []string{"http://10.0.0.1:9091", "https://r1:9091", "dns+http://peers.ns.svc:9091"} {
		if err := Validate([]string{ok}); err != nil {
			t.Errorf("Validate(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"10.0.0.1:9091", "ftp://x", "dns+http://peers.ns.svc", "http://"} {
		if err := Validate([]string{bad}); err == nil {
			t.Errorf("Validate(%q) accepted it", bad)
		}
	}
}
