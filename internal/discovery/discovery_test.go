package discovery

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
)

// fakeResolver answers from its maps; a name it does not know fails.
type fakeResolver struct {
	mu    sync.Mutex
	hosts map[string][]string
	srv   map[string][]*net.SRV
	fail  bool
}

func (r *fakeResolver) set(host string, addrs ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.hosts[host] = addrs
}

func (r *fakeResolver) LookupHost(_ context.Context, host string) ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if a, ok := r.hosts[host]; ok && !r.fail {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

func (r *fakeResolver) LookupSRV(_ context.Context, _, _, name string) (string, []*net.SRV, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s, ok := r.srv[name]; ok && !r.fail {
		return name, s, nil
	}
	return "", nil, &net.DNSError{Err: "no such host", Name: name, IsNotFound: true}
}

func newResolver() *fakeResolver {
	return &fakeResolver{hosts: map[string][]string{}, srv: map[string][]*net.SRV{}}
}

func urls(bs []*fleet.Backend) []string {
	out := make([]string, len(bs))
	for i, b := range bs {
		out[i] = fmt.Sprintf("%d:%s=%s", b.Index, b.Name, b.URL)
	}
	return out
}

func TestParseDNSName(t *testing.T) {
	tests := []struct {
		spec    string
		want    dnsName
		wantErr bool
	}{
		{"vllm.default.svc", dnsName{host: "vllm.default.svc", port: 8000}, false},
		{"vllm:9000", dnsName{host: "vllm", port: 9000}, false},
		{"[::1]:9000", dnsName{host: "::1", port: 9000}, false},
		{"_http._tcp.vllm", dnsName{host: "_http._tcp.vllm", port: 8000, srv: true}, false},
		{"_http._tcp.vllm:80", dnsName{}, true},
		{"vllm:0", dnsName{}, true},
		{"vllm:http", dnsName{}, true},
		{"", dnsName{}, true},
		{"http://vllm", dnsName{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.spec, func(t *testing.T) {
			got, err := parseDNSName(tt.spec)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if err != nil {
				if !errors.Is(err, ErrInvalidName) {
					t.Errorf("err %v does not wrap ErrInvalidName", err)
				}
				return
			}
			tt.want.spec = tt.spec
			if got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestResolve(t *testing.T) {
	r := newResolver()
	r.set("vllm", "10.0.0.2", "10.0.0.1", "10.0.0.1")
	r.set("pod-a.vllm", "10.0.1.1")
	r.set("pod-b.vllm", "fd00::1")
	r.srv["_http._tcp.vllm"] = []*net.SRV{{Target: "pod-a.vllm.", Port: 8001}, {Target: "pod-b.vllm.", Port: 8002}}
	file := filepath.Join(t.TempDir(), "kvroute.yaml")
	writeFile(t, file, "listen: 127.0.0.1:0\nbackends:\n  - name: gpu\n    url: http://10.0.9.9:8000\n  - url: http://10.0.0.1:8000\n")
	fixed, err := fleet.ParseBackends([]string{"fixed=http://10.0.8.8:8000"})
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(Config{Fixed: fixed, File: file, DNS: []string{"vllm", "_http._tcp.vllm"}, Resolver: r, APIKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	bs, err := d.Resolve(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	// The file's second backend and the first DNS address are one URL:
	// the file's comes first and wins.
	want := []string{
		"0:gpu=http://10.0.9.9:8000",
		"1:backend-1=http://10.0.0.1:8000",
		"2:fixed=http://10.0.8.8:8000",
		"3:10.0.0.2:8000=http://10.0.0.2:8000",
		"4:10.0.1.1:8001=http://10.0.1.1:8001",
		"5:[fd00::1]:8002=http://[fd00::1]:8002",
	}
	if got := urls(bs); !slices.Equal(got, want) {
		t.Errorf("Resolve =\n%v\nwant\n%v", got, want)
	}
	if bs[0].APIKey != "k" || bs[3].APIKey != "k" {
		t.Error("discovered backends without a key of their own did not get the default")
	}

	// A failed lookup keeps the last answer.
	r.mu.Lock()
	r.fail = true
	r.mu.Unlock()
	bs, err = d.Resolve(t.Context())
	if err == nil || len(bs) != len(want) {
		t.Errorf("with DNS failing: err %v, %d backends; want an error and the last answer", err, len(bs))
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestRun follows a file and a name through Run: each change is one update
// with the whole set, a re-read that changes nothing is none, and a broken
// file keeps its backends.
func TestRun(t *testing.T) {
	r := newResolver()
	r.set("vllm", "10.0.0.1")
	file := filepath.Join(t.TempDir(), "kvroute.yaml")
	writeFile(t, file, "backends:\n  - name: a\n    url: http://10.0.9.1:8000\n")
	d, err := New(Config{File: file, DNS: []string{"vllm:9000"}, Resolver: r,
		FileInterval: time.Hour, DNSInterval: time.Hour}) // only Reload drives it
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Resolve(t.Context()); err != nil {
		t.Fatal(err)
	}
	updates := make(chan []string)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error)
	go func() {
		done <- d.Run(ctx, func(_ context.Context, bs []*fleet.Backend) {
			names := make([]string, len(bs))
			for i, b := range bs {
				names[i] = b.Name
			}
			updates <- names
		})
	}()
	expect := func(want ...string) {
		t.Helper()
		d.Reload()
		select {
		case got := <-updates:
			if !slices.Equal(got, want) {
				t.Errorf("update %v, want %v", got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no update; want %v", want)
		}
	}
	r.set("vllm", "10.0.0.1", "10.0.0.2")
	expect("a", "10.0.0.1:9000", "10.0.0.2:9000")
	writeFile(t, file, "backends:\n  - name: a\n    url: http://10.0.9.1:8000\n  - name: b\n    url: http://10.0.9.2:8000\n")
	expect("a", "b", "10.0.0.1:9000", "10.0.0.2:9000")
	writeFile(t, file, "backends: [{url: nonsense}]\n") // broken: keeps a and b
	r.set("vllm", "10.0.0.2")
	expect("a", "b", "10.0.0.2:9000")
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run = %v", err)
	}
}

// TestFileReplacedWithinOneTick replaces the file, as an editor or a
// ConfigMap update does (write a new file, rename it over the old one),
// with one of the same size and the same modification time: what a
// replace within one tick of the file system's clock (4 ms on ext4 with
// HZ=250) looks like to stat. The periodic check must still see the new
// backends.
func TestFileReplacedWithinOneTick(t *testing.T) {
	file := filepath.Join(t.TempDir(), "kvroute.yaml")
	writeFile(t, file, "backends:\n  - {name: dead, url: http://10.0.9.1:8000}\n")
	st, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(Config{File: file})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Resolve(t.Context()); err != nil {
		t.Fatal(err)
	}
	tmp := file + ".new"
	writeFile(t, tmp, "backends:\n  - {name: gpu0, url: http://10.0.9.2:8000}\n")
	if err := os.Chtimes(tmp, st.ModTime(), st.ModTime()); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, file); err != nil {
		t.Fatal(err)
	}
	if now, err := os.Stat(file); err != nil || now.Size() != st.Size() || !now.ModTime().Equal(st.ModTime()) {
		t.Fatalf("the new file does not look like the old one to stat (%v): the test tests nothing", err)
	}
	if err := d.readFile(false); err != nil { // what Run does every FileInterval
		t.Fatal(err)
	}
	bs, changed := d.desired()
	if got := urls(bs); !changed || !slices.Equal(got, []string{"0:gpu0=http://10.0.9.2:8000"}) {
		t.Errorf("after the replace: %v (changed %v), want gpu0 alone", got, changed)
	}
}
