package main

import (
	"net"
	"net/url"
	"strings"

	"github.com/kvroute/kvroute/internal/fleet"
)

// duplicateBackend is a --backend flag whose server another backend (of
// the --config file or an earlier flag) already names: kvroute routes to a
// server once, or it would count its load twice and split its cache.
type duplicateBackend struct {
	name, url string
	kept      string // the backend that stays
}

// sameServer returns the backend of bs whose URL names the same server and
// path as u (scheme and host in any case, the default port or none, a
// trailing slash or none), or nil.
func sameServer(bs []*fleet.Backend, u *url.URL) *fleet.Backend {
	key := serverKey(u)
	for _, b := range bs {
		if serverKey(b.URL) == key {
			return b
		}
	}
	return nil
}

// serverKey writes u in one form per server and path.
func serverKey(u *url.URL) string {
	scheme := strings.ToLower(u.Scheme)
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[scheme]
	}
	return scheme + "://" + net.JoinHostPort(strings.ToLower(u.Hostname()), port) + strings.TrimRight(u.EscapedPath(), "/")
}
