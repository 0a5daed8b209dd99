package fleet

import (
	"errors"
	"slices"
	"testing"
)

func TestParseRole(t *testing.T) {
	tests := []struct {
		in      string
		want    Role
		wantErr bool
	}{
		{in: "prefill", want: RolePrefill},
		{in: "decode", want: RoleDecode},
		{in: "Decode ", want: RoleDecode},
		{in: "both", want: RoleBoth},
		{in: "", want: RoleBoth},
		{in: "prefill-decode", want: RoleBoth},
		{in: "encode", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseRole(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("ParseRole(%q) error %v, want error %v", tt.in, err, tt.wantErr)
			}
			if err != nil && !errors.Is(err, ErrInvalidBackend) {
				t.Errorf("error %v does not wrap ErrInvalidBackend", err)
			}
			if got != tt.want {
				t.Errorf("ParseRole(%q) = %v, want %v", tt.in, got, tt.want)
			}
		})
	}
}

func TestConfigRole(t *testing.T) {
	cfg, err := parseConfig([]byte("backends:\n  - {name: p, url: http://127.0.0.1:1, role: prefill}\n  - {name: d, url: http://127.0.0.1:2, role: decode}\n  - {name: b, url: http://127.0.0.1:3}\n"))
	if err != nil {
		t.Fatal(err)
	}
	var got []Role
	for _, b := range cfg.Backends {
		got = append(got, b.Role())
	}
	if want := []Role{RolePrefill, RoleDecode, RoleBoth}; !slices.Equal(got, want) {
		t.Errorf("roles %v, want %v", got, want)
	}
	if cfg.Backends[2].Labels != nil {
		t.Errorf("a backend with no role got labels %v", cfg.Backends[2].Labels)
	}
	if _, err := parseConfig([]byte("backends:\n  - {url: http://127.0.0.1:1, role: primary}\n")); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("role primary: error %v, want ErrInvalidConfig", err)
	}
	cfg, err = parseConfig([]byte("backends:\n  - {url: http://127.0.0.1:1, role: prefill, bootstrap_port: 8998}\n"))
	if err != nil || cfg.Backends[0].BootstrapPort() != 8998 || cfg.Backends[0].Role() != RolePrefill {
		t.Errorf("bootstrap_port 8998: %v, %+v", err, cfg.Backends)
	}
	if _, err := parseConfig([]byte("backends:\n  - {url: http://127.0.0.1:1, bootstrap_port: 70000}\n")); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("bootstrap_port 70000: error %v, want ErrInvalidConfig", err)
	}
}

func TestSplitRoles(t *testing.T) {
	mk := func(name string, r Role) *Backend {
		b, err := ParseBackend(0, name+"=http://127.0.0.1:1")
		if err != nil {
			t.Fatal(err)
		}
		b.SetRole(r)
		return b
	}
	p1, p2, d1, b1 := mk("p1", RolePrefill), mk("p2", RolePrefill), mk("d1", RoleDecode), mk("b1", RoleBoth)
	dec, pre := SplitRoles([]*Backend{p1, d1, p2, b1})
	if !slices.Equal(dec, []*Backend{d1, b1}) || !slices.Equal(pre, []*Backend{p1, p2}) {
		t.Errorf("SplitRoles: decoders %v prefillers %v", dec, pre)
	}
	// With no decoder left, the prefill servers serve whole requests.
	dec, pre = SplitRoles([]*Backend{p1, p2})
	if !slices.Equal(dec, []*Backend{p1, p2}) || pre != nil {
		t.Errorf("all prefill: decoders %v prefillers %v", dec, pre)
	}
}
