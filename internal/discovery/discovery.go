// Package discovery keeps the set of backends kvroute routes to current
// while it runs: the backends of a --config file, re-read when the file
// changes or on SIGHUP, the addresses DNS names resolve to, re-resolved
// every interval, the ready endpoints of a Kubernetes Service, watched
// through its EndpointSlices, and the ready pods of a Gateway API
// InferencePool, watched with the pool; beside the --backend flags, which
// stay fixed. It produces the desired set and hands it to an update
// function (the fleet's Update, in internal/server); the fleet works out
// what came and went.
package discovery

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	yaml "go.yaml.in/yaml/v3"

	"github.com/kvroute/kvroute/internal/fleet"
)

// Defaults of Config. Each is in docs/operations.md with its reason.
const (
	// DefaultDNSInterval is how often DNS names are re-resolved: a
	// Kubernetes headless service's records follow its pods within
	// seconds, and a new inference server takes minutes to load its model,
	// so 10 s adds little to a scale-up and costs one query per name.
	DefaultDNSInterval = 10 * time.Second
	// DefaultFileInterval is how often the config file is read and compared
	// with its last contents: reading a small file every few seconds costs
	// nothing, and an edit is picked up before an operator has switched
	// windows. SIGHUP re-reads it at once.
	DefaultFileInterval = 5 * time.Second
	// DefaultPort is the port of a --dns name given without one: vLLM's
	// and SGLang's default.
	DefaultPort = 8000
	// lookupTimeout bounds one DNS query.
	lookupTimeout = 5 * time.Second
)

// ErrInvalidName wraps every error about a --dns name.
var ErrInvalidName = errors.New("invalid DNS name")

// Resolver is the part of *net.Resolver discovery uses; tests inject their
// own answers.
type Resolver interface {
	LookupHost(ctx context.Context, host string) ([]string, error)
	LookupSRV(ctx context.Context, service, proto, name string) (string, []*net.SRV, error)
}

var _ Resolver = (*net.Resolver)(nil)

// Config says where backends come from.
type Config struct {
	// Fixed backends are always in the set (the --backend flags).
	Fixed []*fleet.Backend
	// File, when not empty, is a YAML file whose backends list (the
	// --config format) is re-read when its contents change, checked every
	// FileInterval (default DefaultFileInterval; negative: never, only on
	// Reload), and on Reload. A file that cannot be read or parsed keeps
	// the backends it had.
	File         string
	FileInterval time.Duration
	// DNS names are resolved every DNSInterval (and on Reload), each
	// address a backend http://ADDR:PORT named ADDR:PORT. A name is
	// NAME[:PORT] (A/AAAA records, port DefaultPort by default) or an SRV
	// name starting with "_" (_http._tcp.vllm.default.svc), whose records
	// give targets and ports. A failed lookup keeps the name's last answer:
	// the health checks take dead addresses out of rotation, a resolver
	// hiccup must not empty the fleet.
	DNS         []string
	DNSInterval time.Duration
	// Resolver answers the DNS queries; nil means net.DefaultResolver.
	Resolver Resolver
	// Kubernetes, when not nil, adds the ready endpoints of one Service's
	// EndpointSlices, followed by an informer (kubernetes.go).
	Kubernetes *Kubernetes
	// Pool, when not nil, adds the ready pods an InferencePool selects, at
	// its target ports, followed by informers (pool.go).
	Pool *Pool
	// APIKey is sent to discovered backends that have no key of their own
	// (--backend-api-key-env).
	APIKey fleet.Secret
	// Logger receives the changes and failures; nil means slog.Default().
	Logger *slog.Logger
}

// Discovery produces the desired set of backends from its sources. It is
// safe for concurrent use.
type Discovery struct {
	cfg    Config
	names  []dnsName
	k8s    []k8sWatch // the Kubernetes sources: Config.Kubernetes, Config.Pool
	log    *slog.Logger
	reload chan struct{}
	// k8sC gets a token whenever a Kubernetes source's cache changes.
	k8sC chan struct{}

	mu sync.Mutex // guards the fields below
	// file: the contents last parsed, and their backends.
	fileData    []byte
	fileRead    bool
	fileBackend []*fleet.Backend
	fileFailing bool
	// dns: each name's last good answer, by position in names.
	dns        [][]*fleet.Backend
	dnsFailing []bool
	// k8s: the endpoints last read from each source's caches.
	k8sBackend [][]*fleet.Backend
	k8sFailing []bool
	// last is the identity of the set last handed out.
	last string
}

// dnsName is one parsed --dns value.
type dnsName struct {
	spec, host string
	port       int
	srv        bool
}

// parseDNSName parses a --dns value: NAME[:PORT], or an SRV name starting
// with "_". Errors wrap ErrInvalidName.
func parseDNSName(spec string) (dnsName, error) {
	spec = strings.TrimSpace(spec)
	n := dnsName{spec: spec, host: spec, port: DefaultPort}
	if strings.HasPrefix(spec, "_") {
		if strings.Contains(spec, ":") {
			return n, fmt.Errorf("%w: %q: an SRV name gives its own ports", ErrInvalidName, spec)
		}
		n.srv = true
		return n, nil
	}
	if i := strings.LastIndexByte(spec, ':'); i >= 0 && !strings.HasSuffix(spec, "]") {
		p, err := strconv.Atoi(spec[i+1:])
		if err != nil || p <= 0 || p > 65535 {
			return n, fmt.Errorf("%w: %q: bad port", ErrInvalidName, spec)
		}
		n.host, n.port = spec[:i], p
	}
	n.host = strings.TrimSuffix(strings.TrimPrefix(n.host, "["), "]")
	if n.host == "" || strings.ContainsAny(n.host, "/ ") {
		return n, fmt.Errorf("%w: %q", ErrInvalidName, spec)
	}
	return n, nil
}

// New returns the discovery of cfg, checking its DNS names.
func New(cfg Config) (*Discovery, error) {
	if cfg.DNSInterval <= 0 {
		cfg.DNSInterval = DefaultDNSInterval
	}
	if cfg.FileInterval == 0 {
		cfg.FileInterval = DefaultFileInterval
	}
	if cfg.Resolver == nil {
		cfg.Resolver = net.DefaultResolver
	}
	d := &Discovery{cfg: cfg, log: cfg.Logger, reload: make(chan struct{}, 1), k8sC: make(chan struct{}, 1)}
	if d.log == nil {
		d.log = slog.Default()
	}
	for _, s := range cfg.DNS {
		n, err := parseDNSName(s)
		if err != nil {
			return nil, err
		}
		d.names = append(d.names, n)
	}
	d.dns = make([][]*fleet.Backend, len(d.names))
	d.dnsFailing = make([]bool, len(d.names))
	if cfg.Kubernetes != nil {
		s, err := newK8sSource(*cfg.Kubernetes, d.k8sC)
		if err != nil {
			return nil, err
		}
		d.k8s = append(d.k8s, s)
	}
	if cfg.Pool != nil {
		s, err := newPoolSource(*cfg.Pool, d.k8sC)
		if err != nil {
			return nil, err
		}
		d.k8s = append(d.k8s, s)
	}
	d.k8sBackend = make([][]*fleet.Backend, len(d.k8s))
	d.k8sFailing = make([]bool, len(d.k8s))
	return d, nil
}

// Reload asks Run to re-read the file and re-resolve every name now (the
// SIGHUP handler calls it). It does not block.
func (d *Discovery) Reload() {
	select {
	case d.reload <- struct{}{}:
	default:
	}
}

// Resolve reads every source now and returns the set: the file's backends,
// the fixed ones, then each name's addresses, then the Kubernetes
// endpoints (a Service's, then an InferencePool's), numbered 0..n-1 in
// that order for fleet.New. The error joins the sources that failed; the
// set is what the others gave. With a Kubernetes source, Resolve starts
// its informers and waits for their first lists (Run or Close stops them).
func (d *Discovery) Resolve(ctx context.Context) ([]*fleet.Backend, error) {
	errFile := d.readFile(true)
	errDNS := d.resolveDNS(ctx)
	errK8s := d.resolveK8s(ctx)
	bs, _ := d.desired()
	for i, b := range bs {
		b.Index = i
	}
	return bs, errors.Join(errFile, errDNS, errK8s)
}

// Run keeps the set current until ctx ends, calling update with the whole
// new set whenever it changes (not when a source is merely re-read). update
// runs on Run's goroutine. Run returns nil when ctx ends, having stopped
// the Kubernetes informer.
func (d *Discovery) Run(ctx context.Context, update func(context.Context, []*fleet.Backend)) error {
	var k8sC <-chan struct{} // nil (never ready) without a Kubernetes source
	if len(d.k8s) > 0 {
		d.startK8s()
		defer d.Close()
		k8sC = d.k8sC
	}
	var fileC, dnsC <-chan time.Time
	if d.cfg.File != "" && d.cfg.FileInterval > 0 {
		t := time.NewTicker(d.cfg.FileInterval)
		defer t.Stop()
		fileC = t.C
	}
	if len(d.names) > 0 {
		t := time.NewTicker(d.cfg.DNSInterval)
		defer t.Stop()
		dnsC = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-d.reload:
			d.log.Info("discovery: reloading")
			_ = d.readFile(true)
			_ = d.resolveDNS(ctx)
			_ = d.readK8s()
		case <-fileC:
			_ = d.readFile(false)
		case <-dnsC:
			_ = d.resolveDNS(ctx)
		case <-k8sC:
			_ = d.readK8s()
		}
		if ctx.Err() != nil {
			return nil
		}
		if bs, changed := d.desired(); changed {
			update(ctx, bs)
		}
	}
}

// desired returns the union of the sources, without a second backend of
// one URL, and whether it differs from the set last returned.
func (d *Discovery) desired() ([]*fleet.Backend, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var bs []*fleet.Backend
	seen := map[string]bool{}
	add := func(b *fleet.Backend) {
		if u := b.URL.String(); !seen[u] {
			seen[u] = true
			bs = append(bs, b)
		}
	}
	for _, b := range d.fileBackend {
		add(b)
	}
	for _, b := range d.cfg.Fixed {
		add(b)
	}
	for _, answer := range d.dns {
		for _, b := range answer {
			add(b)
		}
	}
	for _, b := range d.k8sBackends() {
		add(b)
	}
	var id strings.Builder
	for _, b := range bs {
		fmt.Fprintf(&id, "%s\x00%s\x00%s\n", b.Name, b.URL, string(b.APIKey))
	}
	changed := id.String() != d.last
	d.last = id.String()
	return bs, changed
}

// readFile re-reads the file's backends if its contents changed since the
// last read (or always, when force). On failure the file keeps its last
// backends.
//
// The contents are compared, not the modification time and size: a file
// replaced by one of the same size within one tick of the file system's
// clock (4 ms on ext4 with HZ=250; seconds on some network file systems)
// keeps both, and its change would be missed until the next edit.
func (d *Discovery) readFile(force bool) error {
	if d.cfg.File == "" {
		return nil
	}
	data, err := os.ReadFile(d.cfg.File)
	if err == nil {
		d.mu.Lock()
		same := d.fileRead && bytes.Equal(data, d.fileData)
		d.mu.Unlock()
		if same && !force {
			return nil
		}
		var bs []*fleet.Backend
		if bs, err = parseBackends(d.cfg.File, data); err == nil {
			for _, b := range bs {
				if b.APIKey == "" {
					b.APIKey = d.cfg.APIKey
				}
			}
			d.mu.Lock()
			d.fileData, d.fileRead, d.fileBackend = data, true, bs
			if d.fileFailing {
				d.log.Info("discovery: config file readable again", "file", d.cfg.File)
			}
			d.fileFailing = false
			d.mu.Unlock()
			return nil
		}
	}
	d.mu.Lock()
	first := !d.fileFailing
	d.fileFailing = true
	// Not read: a fixed file is tried again at the next check.
	d.fileRead = false
	d.mu.Unlock()
	if first {
		d.log.Warn("discovery: config file unusable; keeping its backends", "file", d.cfg.File, "err", err)
	}
	return err
}

// LoadBackends reads the backends list of a --config file (its other keys
// are the flags', applied once at start). A file without backends has
// none.
func LoadBackends(path string) ([]*fleet.Backend, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	return parseBackends(path, data)
}

// parseBackends parses the backends list of data, the contents of the
// --config file path.
func parseBackends(path string, data []byte) ([]*fleet.Backend, error) {
	var file struct {
		Backends any `yaml:"backends"`
	}
	if err := yaml.Unmarshal(data, &file); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if file.Backends == nil {
		return nil, nil
	}
	part, err := yaml.Marshal(map[string]any{"backends": file.Backends})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	cfg, err := fleet.ParseConfig(part)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return cfg.Backends, nil
}

// resolveDNS resolves every name in turn; a name whose lookup fails keeps
// its last answer.
func (d *Discovery) resolveDNS(ctx context.Context) error {
	var errs []error
	for i, n := range d.names {
		bs, err := d.lookup(ctx, n)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		d.mu.Lock()
		if err != nil {
			first := !d.dnsFailing[i]
			d.dnsFailing[i] = true
			d.mu.Unlock()
			if first {
				d.log.Warn("discovery: DNS lookup failed; keeping its last answer", "name", n.spec, "err", err)
			}
			errs = append(errs, err)
			continue
		}
		if d.dnsFailing[i] {
			d.log.Info("discovery: DNS lookup works again", "name", n.spec)
		}
		d.dnsFailing[i] = false
		d.dns[i] = bs
		d.mu.Unlock()
	}
	return errors.Join(errs...)
}

// lookup resolves one name into backends, sorted by address so that an
// answer in another order is the same set.
func (d *Discovery) lookup(ctx context.Context, n dnsName) ([]*fleet.Backend, error) {
	ctx, cancel := context.WithTimeout(ctx, min(lookupTimeout, d.cfg.DNSInterval))
	defer cancel()
	var addrs []string // host:port
	if n.srv {
		_, srvs, err := d.cfg.Resolver.LookupSRV(ctx, "", "", n.host)
		if err != nil {
			return nil, fmt.Errorf("SRV %s: %w", n.host, err)
		}
		for _, s := range srvs {
			ips, err := d.cfg.Resolver.LookupHost(ctx, strings.TrimSuffix(s.Target, "."))
			if err != nil {
				return nil, fmt.Errorf("SRV %s target %s: %w", n.host, s.Target, err)
			}
			for _, ip := range ips {
				addrs = append(addrs, net.JoinHostPort(ip, strconv.Itoa(int(s.Port))))
			}
		}
	} else {
		ips, err := d.cfg.Resolver.LookupHost(ctx, n.host)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", n.host, err)
		}
		for _, ip := range ips {
			addrs = append(addrs, net.JoinHostPort(ip, strconv.Itoa(n.port)))
		}
	}
	slices.Sort(addrs)
	addrs = slices.Compact(addrs)
	bs := make([]*fleet.Backend, 0, len(addrs))
	for _, a := range addrs {
		b, err := fleet.ParseBackend(0, a+"=http://"+a)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", n.spec, err)
		}
		b.APIKey = d.cfg.APIKey
		bs = append(bs, b)
	}
	return bs, nil
}
