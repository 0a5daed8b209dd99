package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/kvroute/kvroute/internal/auth"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/proxy"
	"github.com/kvroute/kvroute/internal/upstream"
)

// defaultMetricsListen is where /metrics is served by default: loopback,
// so that the router's metrics (backend names, key names, traffic) are not
// open to API clients, on 9464 rather than Prometheus's own 9090 or the
// Pushgateway's 9091, which often run on the same host.
const defaultMetricsListen = "127.0.0.1:9464"

// securityConfig is what the security flags of `kvroute serve` decide.
type securityConfig struct {
	apiKeys           stringList
	apiKeysFile       string
	forwardClientAuth bool
	backendAPIKeyEnv  string
	allowPaths        stringList
	metricsListen     string
	fleetPage         bool // the live fleet page on the metrics listener
	tlsCert, tlsKey   string
	backendCA         string
	backendCert       string
	backendKey        string

	// Resolved by resolve.
	keys          []auth.APIKey
	backendAPIKey fleet.Secret // of --backend-api-key-env; discovered backends get it too
	serverTLS     *tls.Config  // nil: plain HTTP
	clientTLS     *tls.Config  // nil: the system's roots, no client certificate
}

// register adds the security flags to fs.
func (s *securityConfig) register(fs *flag.FlagSet) {
	fs.Var(&s.apiKeys, "api-key", "a client API key, sent as Authorization: Bearer KEY (repeatable; named key-1, key-2, ... in logs and metrics; no limits). Without keys the API is open")
	fs.StringVar(&s.apiKeysFile, "api-keys-file", "", "YAML list of client API keys: [{name, key or key_env, priority, rpm, tpm}]")
	fs.BoolVar(&s.forwardClientAuth, "forward-client-auth", false, "forward the client's Authorization, Cookie and Proxy-Authorization headers to the backends")
	fs.StringVar(&s.backendAPIKeyEnv, "backend-api-key-env", "", "environment variable holding the API key of every backend without its own (sent as Authorization: Bearer, also on probes)")
	fs.Var(&s.allowPaths, "allow-path", "forward this path prefix too, e.g. /v1/load_lora_adapter (repeatable); by default only the inference endpoints, /v1/models, /v1/rerank and /v1/score")
	fs.StringVar(&s.metricsListen, "metrics-listen", defaultMetricsListen, "address serving /metrics (and /healthz); empty serves /metrics on the API listener instead, to key holders")
	fs.BoolVar(&s.fleetPage, "fleet-page", true, "serve the live fleet page at /fleet (its JSON at /fleet.json) on --metrics-listen, keeping the last 20 routing decisions for it; not served without --metrics-listen")
	fs.StringVar(&s.tlsCert, "tls-cert", "", "certificate file (PEM) of the API listener; with --tls-key it serves HTTPS")
	fs.StringVar(&s.tlsKey, "tls-key", "", "private key file (PEM) of --tls-cert")
	fs.StringVar(&s.backendCA, "backend-ca", "", "CA certificates file (PEM) that https backends' certificates must chain to, instead of the system's")
	fs.StringVar(&s.backendCert, "backend-client-cert", "", "client certificate file (PEM) presented to https backends (mutual TLS)")
	fs.StringVar(&s.backendKey, "backend-client-key", "", "private key file (PEM) of --backend-client-cert")
}

// resolve loads what the flags name (keys, certificates) and gives every
// backend without a key of its own the --backend-api-key-env key.
func (s *securityConfig) resolve(backends []*fleet.Backend) error {
	for i, k := range s.apiKeys {
		s.keys = append(s.keys, auth.APIKey{Key: fleet.Secret(k), Name: fmt.Sprintf("key-%d", i+1)})
	}
	if s.apiKeysFile != "" {
		keys, err := auth.LoadAPIKeys(s.apiKeysFile)
		if err != nil {
			return bySetting("api-keys-file", err)
		}
		s.keys = append(s.keys, keys...)
	}
	if err := auth.CheckAPIKeys(s.keys); err != nil {
		return fmt.Errorf("API keys: %w", err)
	}
	if s.backendAPIKeyEnv != "" {
		key, err := fleet.SecretFromEnv(s.backendAPIKeyEnv)
		if err != nil {
			return bySetting("backend-api-key-env", fmt.Errorf("backend API key: %w", err))
		}
		s.backendAPIKey = key
		for _, b := range backends {
			if b.APIKey == "" {
				b.APIKey = key
			}
		}
	}
	if (s.tlsCert == "") != (s.tlsKey == "") {
		return errors.New("--tls-cert and --tls-key go together")
	}
	if s.tlsCert != "" {
		cert, err := loadKeyPair("tls-cert", s.tlsCert, "tls-key", s.tlsKey)
		if err != nil {
			return err
		}
		s.serverTLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	if (s.backendCert == "") != (s.backendKey == "") {
		return errors.New("--backend-client-cert and --backend-client-key go together")
	}
	if s.backendCA != "" || s.backendCert != "" {
		s.clientTLS = &tls.Config{MinVersion: tls.VersionTLS12}
		if s.backendCA != "" {
			pem, err := os.ReadFile(s.backendCA)
			if err != nil {
				return bySetting("backend-ca", fmt.Errorf("backend CA certificates: %w", err))
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return bySetting("backend-ca", fmt.Errorf("backend CA certificates: no PEM certificate in %s", s.backendCA))
			}
			s.clientTLS.RootCAs = pool
		}
		if s.backendCert != "" {
			cert, err := loadKeyPair("backend-client-cert", s.backendCert, "backend-client-key", s.backendKey)
			if err != nil {
				return err
			}
			s.clientTLS.Certificates = []tls.Certificate{cert}
		}
	}
	return nil
}

// loadKeyPair loads a certificate and its private key, each file read on
// its own so that an error names the flag of the file that failed
// (tls.LoadX509KeyPair's error does not say which of the two it was).
func loadKeyPair(certFlag, certPath, keyFlag, keyPath string) (tls.Certificate, error) {
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return tls.Certificate{}, bySetting(certFlag, fmt.Errorf("certificate: %w", err))
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return tls.Certificate{}, bySetting(keyFlag, fmt.Errorf("private key: %w", err))
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("certificate %s with key %s: %w (--%s and --%s, config keys %s and %s)",
			certPath, keyPath, err, certFlag, keyFlag, configKey(certFlag), configKey(keyFlag))
	}
	return cert, nil
}

// fleetOptions gives the fleet's probes the backends' TLS settings.
func (s *securityConfig) fleetOptions(opts *fleet.Options) {
	if s.clientTLS == nil {
		return
	}
	// As fleet.New's own client, with the TLS settings.
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = 0
	t.TLSClientConfig = s.clientTLS.Clone()
	opts.Client = &http.Client{Transport: t}
}

// proxyConfig adds the security settings to the proxy's config.
func (s *securityConfig) proxyConfig(cfg proxy.Config) proxy.Config {
	cfg.Security = proxy.Security{
		APIKeys:           s.keys,
		ForwardClientAuth: s.forwardClientAuth,
		AllowPaths:        s.allowPaths,
		MetricsElsewhere:  s.metricsListen != "",
	}
	if s.clientTLS != nil {
		t := upstream.NewTransport()
		t.TLSClientConfig = s.clientTLS.Clone()
		cfg.Transport = t
	}
	return cfg
}

// listen wraps the API listener in TLS if configured, and starts the
// metrics listener, whose errors go to errc. The returned stop shuts it
// down.
func (s *securityConfig) listen(ln net.Listener, px *proxy.Proxy, log *slog.Logger, errc chan<- error) (net.Listener, func(context.Context), error) {
	if s.serverTLS != nil {
		ln = tls.NewListener(ln, s.serverTLS)
	}
	if s.metricsListen == "" {
		return ln, func(context.Context) {}, nil
	}
	mln, err := net.Listen("tcp", s.metricsListen)
	if err != nil {
		ln.Close()
		return nil, nil, fmt.Errorf("--metrics-listen: %w", err)
	}
	msrv := &http.Server{Handler: px.MetricsHandler(), ReadHeaderTimeout: 10 * time.Second}
	go func() { errc <- msrv.Serve(mln) }()
	log.Info("metrics serving", "url", "http://"+mln.Addr().String()+"/metrics")
	return ln, func(ctx context.Context) {
		ctx, cancel := context.WithTimeout(ctx, shutdownGrace)
		defer cancel()
		if err := msrv.Shutdown(ctx); err != nil {
			msrv.Close()
		}
	}, nil
}

// scheme is the API's URL scheme.
func (s *securityConfig) scheme() string {
	if s.serverTLS != nil {
		return "https"
	}
	return "http"
}
