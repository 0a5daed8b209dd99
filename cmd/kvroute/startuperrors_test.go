package main

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestStartupErrorsNameTheirSetting runs the commands as an operator
// does (run, as main calls it) into each start-up failure docs/operations.md
// shows ("Start-up errors"), and checks that the message names the flag
// and the config key to change.
func TestStartupErrorsNameTheirSetting(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	busy := taken.Addr().String()
	_, busyPort, _ := net.SplitHostPort(busy)
	pki := newTestPKI(t)
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// A directory stands for an unreadable file: the tests may run as
	// root, whom file modes do not stop.
	unreadable := t.TempDir()
	backend := []string{"--backend", "http://" + freeAddr(t)}
	tests := []struct {
		name string
		args []string
		want []string // in the output, in this order
	}{
		{"serve API port taken", append([]string{"serve", "--listen", busy, "--metrics-listen", ""}, backend...),
			[]string{"API listener: listen tcp " + busy, "address already in use (--listen, config key listen)"}},
		{"serve metrics port taken", append([]string{"serve", "--listen", "127.0.0.1:0", "--metrics-listen", busy}, backend...),
			[]string{"metrics listener: listen tcp " + busy, "address already in use (--metrics-listen, config key metrics_listen)"}},
		{"serve metrics port taken, from the config file", append([]string{"serve", "--listen", "127.0.0.1:0",
			"--config", file("metrics.yaml", "metrics_listen: "+busy+"\n")}, backend...),
			[]string{"metrics listener: listen tcp " + busy, "(--metrics-listen, config key metrics_listen)"}},
		{"epp gRPC port taken", []string{"epp", "--endpoint", freeAddr(t), "--grpc-listen", busy},
			[]string{"gRPC listener: listen tcp " + busy, "address already in use (--grpc-listen, config key grpc_listen)"}},
		{"epp metrics port taken", []string{"epp", "--endpoint", freeAddr(t), "--grpc-listen", "127.0.0.1:0", "--metrics-listen", busy},
			[]string{"metrics listener: listen tcp " + busy, "(--metrics-listen, config key metrics_listen)"}},
		{"emulate port taken", []string{"emulate", "--host", "127.0.0.1", "--port", busyPort},
			[]string{"replica 0 listener: listen tcp " + busy, "(--host, --port"}},
		{"serve backend URL not http", []string{"serve", "--backend", "ftp://10.0.0.1:8000"},
			[]string{`"ftp://10.0.0.1:8000" must start with http:// or https://`, "(--backend, config key backends)"}},
		{"serve backend URL without host", []string{"serve", "--backend", "gpu0=http://"},
			[]string{"has no host", "(--backend, config key backends)"}},
		{"serve backend URL in the config file", []string{"serve", "--config", file("backends.yaml", "backends:\n- url: \"10.0.0.1:8000\"\n")},
			[]string{"backends.yaml", "(--backend, config key backends)"}},
		{"epp endpoint not ip:port", []string{"epp", "--endpoint", "10.0.0.1"},
			[]string{`endpoint "10.0.0.1": want ip:port`, "(--endpoint, config key endpoint)"}},
		{"serve TLS key missing", append([]string{"serve", "--tls-cert", pki.serverCert, "--tls-key", filepath.Join(dir, "nope.pem")}, backend...),
			[]string{"private key: open ", "no such file or directory (--tls-key, config key tls_key)"}},
		{"serve TLS key unreadable", append([]string{"serve", "--tls-cert", pki.serverCert, "--tls-key", unreadable}, backend...),
			[]string{"private key: read " + unreadable, "(--tls-key, config key tls_key)"}},
		{"serve TLS certificate unreadable", append([]string{"serve", "--tls-cert", unreadable, "--tls-key", pki.serverKey}, backend...),
			[]string{"certificate: read " + unreadable, "(--tls-cert, config key tls_cert)"}},
		{"serve TLS key not the certificate's", append([]string{"serve", "--tls-cert", pki.serverCert, "--tls-key", pki.clientKey}, backend...),
			[]string{"private key does not match public key", "(--tls-cert and --tls-key, config keys tls_cert and tls_key)"}},
		{"serve backend client key unreadable", append([]string{"serve", "--backend-client-cert", pki.clientCert, "--backend-client-key", unreadable}, backend...),
			[]string{"private key: read ", "(--backend-client-key, config key backend_client_key)"}},
		{"serve API keys file unreadable", append([]string{"serve", "--api-keys-file", unreadable}, backend...),
			[]string{"read API keys: read ", "(--api-keys-file, config key api_keys_file)"}},
		{"serve unknown config key", append([]string{"serve", "--config", file("typo.yaml", "metric_listen: :9464\n")}, backend...),
			[]string{`unknown key "metric_listen" (did you mean metrics_listen?`}},
		{"epp unknown config key", []string{"epp", "--config", file("typo2.yaml", "grpc_listne: :9002\nendpoint: [10.0.0.1:8000]\n")},
			[]string{`unknown key "grpc_listne" (did you mean grpc_listen?`}},
		{"unknown config key far from any", append([]string{"serve", "--config", file("far.yaml", "colour: blue\n")}, backend...),
			[]string{`unknown key "colour" (the keys are the flags of --help`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := make(chan int, 1)
			go func() { code <- run(tt.args, &stdout, &stderr) }()
			select {
			case c := <-code:
				if c == 0 {
					t.Fatalf("exit 0, want a failure; stderr %q", stderr.String())
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("still running after 30 s: it started (stderr %q)", stderr.String())
			}
			out := stderr.String()
			rest := out
			for _, w := range tt.want {
				i := strings.Index(rest, w)
				if i < 0 {
					t.Fatalf("output lacks %q (in order):\n%s", w, out)
				}
				rest = rest[i+len(w):]
			}
		})
	}
}

func TestClosestKey(t *testing.T) {
	keys := []string{"listen", "metrics_listen", "grpc_listen", "backends", "fallbacks"}
	for _, tt := range []struct{ key, want string }{
		{"metric_listen", "metrics_listen"},
		{"Listen", "listen"},
		{"backend", "backends"},
		{"fallback", "fallbacks"},
		{"colour", ""},
		{"x", ""},
	} {
		if got := closestKey(tt.key, keys); got != tt.want {
			t.Errorf("closestKey(%q) = %q, want %q", tt.key, got, tt.want)
		}
	}
}
