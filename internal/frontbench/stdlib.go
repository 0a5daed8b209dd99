package frontbench

import (
	"fmt"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync/atomic"

	"github.com/kvroute/kvroute/internal/proxy"
)

// NewStdlibFront returns the standard library's reverse proxy in front of
// backends, in turn (round robin), with kvroute's transport and a flush
// after every write: the reference for what any Go proxy pays.
func NewStdlibFront(backends []string) (http.Handler, error) {
	targets := make([]*url.URL, len(backends))
	for i, b := range backends {
		u, err := url.Parse(b)
		if err != nil {
			return nil, fmt.Errorf("backend %q: %w", b, err)
		}
		targets[i] = u
	}
	if len(targets) == 0 {
		return nil, fmt.Errorf("no backends")
	}
	var next atomic.Uint64
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(targets[(next.Add(1)-1)%uint64(len(targets))])
			pr.Out.Host = pr.In.Host
		},
		FlushInterval: -1,
		Transport:     proxy.NewTransport(),
	}, nil
}
