package balancer

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
)

// balancerKind is one entry of Kinds.
type balancerKind struct {
	name    string
	program string // "nginx" or "haproxy"
	// method holds the balancing directives, one a line: of the nginx
	// upstream block (none is nginx's default round robin) or the HAProxy
	// backend section.
	method []string
}

var balancerKinds = []balancerKind{
	{"nginx-round-robin", "nginx", nil},
	{"nginx-least-conn", "nginx", []string{"least_conn;"}},
	{"nginx-hash", "nginx", []string{"hash $http_x_session_id consistent;"}},
	{"haproxy-roundrobin", "haproxy", []string{"balance roundrobin"}},
	{"haproxy-leastconn", "haproxy", []string{"balance leastconn"}},
	{"haproxy-hdr", "haproxy", []string{"balance hdr(X-Session-ID)", "hash-type consistent"}},
}

// Kinds lists the real balancer kinds Start runs:
//
//   - "nginx-round-robin", "nginx-least-conn": nginx's upstream round robin
//     and least_conn;
//   - "nginx-hash": nginx's `hash $http_x_session_id consistent` (ketama);
//     requests without X-Session-ID all hash the empty key, to one backend;
//   - "haproxy-roundrobin", "haproxy-leastconn": HAProxy's balance
//     roundrobin and leastconn;
//   - "haproxy-hdr": HAProxy's `balance hdr(X-Session-ID)` with `hash-type
//     consistent`; requests without the header fall back to round robin.
//
// All retry failed requests before the first byte and take failing servers
// out passively, with their operators' best settings (nginx
// proxy_next_upstream and max_fails; HAProxy retry-on, redispatch and
// observe layer7, which needs its /health check); none has bounded load. The slice is fresh on every call.
func Kinds() []string {
	names := make([]string, len(balancerKinds))
	for i, k := range balancerKinds {
		names[i] = k.name
	}
	return names
}

func findKind(kind string) (balancerKind, bool) {
	for _, k := range balancerKinds {
		if k.name == kind {
			return k, true
		}
	}
	return balancerKind{}, false
}

// Available reports whether the program that kind needs is installed
// (in $PATH or /usr/sbin), and why not when it is not.
func Available(kind string) (bool, string) {
	k, ok := findKind(kind)
	if !ok {
		return false, unknownKind(kind).Error()
	}
	if _, err := lookProgram(k.program); err != nil {
		return false, err.Error()
	}
	return true, ""
}

func unknownKind(kind string) error {
	return fmt.Errorf("%w %q (want one of %s)", ErrUnknownKind, kind, strings.Join(Kinds(), ", "))
}

// lookProgram finds name in $PATH or, since Debian installs nginx and
// haproxy there and a normal user's $PATH lacks it, in /usr/sbin.
func lookProgram(name string) (string, error) {
	if path, err := exec.LookPath(name); err == nil {
		return path, nil
	}
	if path, err := exec.LookPath(filepath.Join("/usr/sbin", name)); err == nil {
		return path, nil
	}
	return "", fmt.Errorf("%w: %s is neither in $PATH nor in /usr/sbin (Debian: apt-get install %s)", ErrNotInstalled, name, name)
}
