package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// testPKI is a CA and certificates it signed for 127.0.0.1, in PEM files.
type testPKI struct {
	pool                                         *x509.CertPool
	caFile                                       string
	serverCert, serverKey, clientCert, clientKey string
	serverPair                                   tls.Certificate
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	dir := t.TempDir()
	now := time.Now()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kvroute test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	write := func(name, typ string, der []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	leaf := func(serial int64, usage x509.ExtKeyUsage, name string) (string, string) {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kder, _ := x509.MarshalECPrivateKey(key)
		return write(name+".pem", "CERTIFICATE", der), write(name+"-key.pem", "EC PRIVATE KEY", kder)
	}
	p := &testPKI{pool: x509.NewCertPool(), caFile: write("ca.pem", "CERTIFICATE", caDER)}
	p.pool.AddCert(ca)
	p.serverCert, p.serverKey = leaf(2, x509.ExtKeyUsageServerAuth, "server")
	p.clientCert, p.clientKey = leaf(3, x509.ExtKeyUsageClientAuth, "client")
	if p.serverPair, err = tls.LoadX509KeyPair(p.serverCert, p.serverKey); err != nil {
		t.Fatal(err)
	}
	return p
}

// freeAddr is a loopback address nobody listens on (for a listener whose
// address the test must know before it starts).
func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestServeSecured runs `kvroute serve` with every security flag against an
// HTTPS backend that, like vLLM started with --api-key, wants its key, and
// here also a client certificate.
func TestServeSecured(t *testing.T) {
	pki := newTestPKI(t)
	var mu sync.Mutex
	var backendAuth []string
	be := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		backendAuth = append(backendAuth, r.URL.Path+" "+r.Header.Get("Authorization"))
		mu.Unlock()
		if r.Header.Get("Authorization") != "Bearer backend-key" {
			http.Error(w, `{"error":"Unauthorized"}`, http.StatusUnauthorized)
			return
		}
		switch r.URL.Path {
		case "/v1/models":
			fmt.Fprint(w, `{"object":"list","data":[{"id":"m"}]}`)
		case "/v1/chat/completions":
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`)
		default:
			fmt.Fprint(w, "ok")
		}
	}))
	be.TLS = &tls.Config{Certificates: []tls.Certificate{pki.serverPair},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pki.pool}
	be.StartTLS()
	t.Cleanup(be.Close)

	t.Setenv("KVROUTE_TEST_BACKEND_KEY", "backend-key")
	metricsAddr := freeAddr(t)
	base := startServe(t, "--backend", be.URL, "--api-key", "client-key",
		"--backend-api-key-env", "KVROUTE_TEST_BACKEND_KEY", "--metrics-listen", metricsAddr,
		"--tls-cert", pki.serverCert, "--tls-key", pki.serverKey,
		"--backend-ca", pki.caFile, "--backend-client-cert", pki.clientCert, "--backend-client-key", pki.clientKey)
	base = "https" + strings.TrimPrefix(base, "http")
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pki.pool}}}
	t.Cleanup(client.CloseIdleConnections)

	do := func(method, url, key string) (*http.Response, string) {
		req, _ := http.NewRequest(method, url, strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hello"}]}`))
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		res, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		data, _ := io.ReadAll(res.Body)
		return res, string(data)
	}
	res, body := do("POST", base+"/v1/chat/completions", "client-key")
	if res.StatusCode != 200 || res.Header.Get("X-Kvroute-Backend") != "backend-0" {
		t.Errorf("chat: %d %v %s, want 200 from backend-0 (named for its index, not its address)", res.StatusCode, res.Header, body)
	}
	if res, body := do("POST", base+"/v1/chat/completions", ""); res.StatusCode != 401 {
		t.Errorf("chat without a key: %d %s, want 401", res.StatusCode, body)
	}
	if res, _ := do("GET", base+"/metrics", "client-key"); res.StatusCode != 404 {
		t.Errorf("API /metrics: %d, want 404 with a metrics listener", res.StatusCode)
	}
	mres, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(mres.Body)
	mres.Body.Close()
	if mres.StatusCode != 200 || !strings.Contains(string(page), `kvroute_key_requests_total{key="key-1",outcome="admitted"} 1`) {
		t.Errorf("metrics listener: %d, want 200 with the key's requests", mres.StatusCode)
	}
	if strings.Contains(string(page), "client-key") || strings.Contains(string(page), "backend-key\"") {
		t.Error("a key shows in the metrics")
	}
	mu.Lock()
	defer mu.Unlock()
	for _, a := range backendAuth {
		if !strings.HasSuffix(a, " Bearer backend-key") {
			t.Errorf("backend got %q, want its own key on every request and probe", a)
		}
	}
}

func TestSecurityFlagErrors(t *testing.T) {
	pki := newTestPKI(t)
	keys := filepath.Join(t.TempDir(), "keys.yaml")
	if err := os.WriteFile(keys, []byte("- {name: a, key: k1, rpm: 5}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	b := []string{"--backend", "http://127.0.0.1:9001"}
	tests := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"keys from flags and file", []string{"--api-key", "k0", "--api-keys-file", keys}, ""},
		{"same key twice", []string{"--api-key", "k1", "--api-keys-file", keys}, "given twice"},
		{"missing keys file", []string{"--api-keys-file", keys + ".nope"}, "no such file"},
		{"unset backend key env", []string{"--backend-api-key-env", "KVROUTE_TEST_UNSET"}, "unset or empty"},
		{"cert without key", []string{"--tls-cert", pki.serverCert}, "go together"},
		{"client cert without key", []string{"--backend-client-cert", pki.clientCert}, "go together"},
		{"CA not PEM", []string{"--backend-ca", keys}, "no PEM certificate"},
		{"TLS files", []string{"--tls-cert", pki.serverCert, "--tls-key", pki.serverKey, "--backend-ca", pki.caFile}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := parseServeFlags(append(b, tt.args...), io.Discard)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if tt.name == "keys from flags and file" && len(cfg.security.keys) != 2 {
					t.Errorf("keys %d, want 2", len(cfg.security.keys))
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("error %v, want %q", err, tt.wantErr)
			}
		})
	}
}
