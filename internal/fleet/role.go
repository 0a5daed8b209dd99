package fleet

import (
	"fmt"
	"maps"
	"strconv"
	"strings"
)

// RoleLabel is the label that carries a backend's part in prefill/decode
// disaggregation: the Kubernetes pod label llm-d's scheduler reads, with
// its values prefill, decode and both.
const RoleLabel = "llm-d.ai/role"

// Role is a backend's part in prefill/decode disaggregation.
type Role uint8

const (
	// RoleBoth serves whole requests, and may decode a request prefilled
	// elsewhere: every backend without a role label.
	RoleBoth Role = iota
	// RolePrefill only prefills prompts for a decode server to continue.
	RolePrefill
	// RoleDecode decodes requests, prefilled elsewhere or (when no prefill
	// server can take one) by itself.
	RoleDecode
)

// String returns the role as its label value.
func (r Role) String() string {
	switch r {
	case RolePrefill:
		return "prefill"
	case RoleDecode:
		return "decode"
	}
	return "both"
}

// ParseRole reads a role label's value: prefill, decode, or both ("" and
// prefill-decode, which some llm-d charts write, mean both too).
func ParseRole(s string) (Role, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "prefill":
		return RolePrefill, nil
	case "decode":
		return RoleDecode, nil
	case "", "both", "prefill-decode":
		return RoleBoth, nil
	}
	return RoleBoth, fmt.Errorf("%w: role %q: want prefill, decode or both", ErrInvalidBackend, s)
}

// Role returns the backend's role, from its RoleLabel; a value ParseRole
// rejects counts as both, so that a mislabelled pod still serves.
func (b *Backend) Role() Role {
	r, _ := ParseRole(b.Labels[RoleLabel])
	return r
}

// SetRole labels b with role r. Like Labels, it must be called before the
// backend is used.
func (b *Backend) SetRole(r Role) {
	if r == RoleBoth && b.Labels[RoleLabel] == "" {
		return
	}
	l := maps.Clone(b.Labels)
	if l == nil {
		l = make(map[string]string, 1)
	}
	l[RoleLabel] = r.String()
	b.Labels = l
}

// SplitRoles partitions cands into the backends that take whole or
// decode requests (decode and both) and the prefill-only ones, in order.
// When every candidate is prefill-only they all count as decoders: a
// prefill server can still serve a request whole.
func SplitRoles(cands []*Backend) (decoders, prefillers []*Backend) {
	n := 0
	for _, b := range cands {
		if b.Role() == RolePrefill {
			n++
		}
	}
	if n == 0 || n == len(cands) {
		return cands, nil
	}
	decoders = make([]*Backend, 0, len(cands)-n)
	prefillers = make([]*Backend, 0, n)
	for _, b := range cands {
		if b.Role() == RolePrefill {
			prefillers = append(prefillers, b)
		} else {
			decoders = append(decoders, b)
		}
	}
	return decoders, prefillers
}

// BootstrapPortLabel carries a prefill server's SGLang bootstrap port
// (its --disaggregation-bootstrap-port, 8998 by default): with one, its
// prefill legs go SGLang's way, at the same time as the decode's, with
// bootstrap_host, bootstrap_port and bootstrap_room in both.
const BootstrapPortLabel = "kvroute.io/bootstrap-port"

// BootstrapPort returns the backend's SGLang bootstrap port, 0 for none.
func (b *Backend) BootstrapPort() int {
	p, err := strconv.Atoi(b.Labels[BootstrapPortLabel])
	if err != nil || p <= 0 || p > 65535 {
		return 0
	}
	return p
}

// SetBootstrapPort labels b with its SGLang bootstrap port; like SetRole,
// before the backend is used.
func (b *Backend) SetBootstrapPort(port int) error {
	if port < 0 || port > 65535 {
		return fmt.Errorf("%w: bootstrap port %d", ErrInvalidBackend, port)
	}
	if port == 0 {
		return nil
	}
	l := maps.Clone(b.Labels)
	if l == nil {
		l = make(map[string]string, 1)
	}
	l[BootstrapPortLabel] = strconv.Itoa(port)
	b.Labels = l
	return nil
}
