package discovery

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/watch"
	discoveryclient "k8s.io/client-go/kubernetes/typed/discovery/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/kvroute/kvroute/internal/fleet"
)

// Defaults of Kubernetes. Each is in docs/operations.md with its reason.
const (
	// DefaultK8sResync is how often the informer hands every cached
	// EndpointSlice back again. Changes arrive by watch within a second;
	// the resync reads only the local cache (no API call) and is a safety
	// net against a missed event, so minutes are enough.
	DefaultK8sResync = 5 * time.Minute
	// DefaultK8sSyncTimeout bounds how long Resolve waits for the first
	// list of EndpointSlices. An API server that does not answer by then
	// leaves the set empty for now; Run fills it in when the list comes.
	DefaultK8sSyncTimeout = 15 * time.Second
)

// ErrInvalidService wraps every error about a --k8s-service value.
var ErrInvalidService = errors.New("invalid Kubernetes service")

// Kubernetes says which Service's endpoints are backends: every ready,
// serving, not terminating address of its EndpointSlices (label
// kubernetes.io/service-name), with the port PortName, is a backend
// http://IP:PORT named after its pod (targetRef.name).
type Kubernetes struct {
	// Namespace and Service name the Service (--k8s-service NAMESPACE/NAME).
	Namespace, Service string
	// PortName is the EndpointSlice port to use; empty: each slice's first.
	PortName string
	// Kubeconfig is a kubeconfig file; empty: the in-cluster config (the
	// pod's service account). Ignored when Client is set.
	Kubeconfig string
	// Client talks to the API server; nil: built from Kubeconfig. A
	// kubernetes.Interface is one; tests inject
	// k8s.io/client-go/kubernetes/fake's clientset.
	Client K8sClient
	// Resync is the informer's resync period (default DefaultK8sResync);
	// SyncTimeout bounds Resolve's wait for the first list (default
	// DefaultK8sSyncTimeout).
	Resync, SyncTimeout time.Duration
}

// K8sClient is the part of a kubernetes.Interface the source uses: only
// the discovery.k8s.io/v1 client, so that kvroute links that API group's
// client rather than every group's.
type K8sClient interface {
	DiscoveryV1() discoveryclient.DiscoveryV1Interface
}

// discoveryOnly is the K8sClient kvroute builds from a rest.Config.
type discoveryOnly struct {
	c *discoveryclient.DiscoveryV1Client
}

func (d discoveryOnly) DiscoveryV1() discoveryclient.DiscoveryV1Interface { return d.c }

// ParseService parses a --k8s-service value, NAMESPACE/NAME. Errors wrap
// ErrInvalidService.
func ParseService(s string) (namespace, name string, err error) {
	namespace, name, ok := strings.Cut(strings.TrimSpace(s), "/")
	if !ok {
		return "", "", fmt.Errorf("%w: %q: want NAMESPACE/NAME", ErrInvalidService, s)
	}
	for _, part := range []string{namespace, name} {
		if errs := validation.IsDNS1123Label(part); len(errs) > 0 {
			return "", "", fmt.Errorf("%w: %q: %s", ErrInvalidService, s, strings.Join(errs, "; "))
		}
	}
	return namespace, name, nil
}

// k8sSource watches one Service's EndpointSlices through an informer.
type k8sSource struct {
	cfg      Kubernetes
	informer cache.SharedIndexInformer
	lister   discoverylisters.EndpointSliceNamespaceLister
	informers
}

var _ k8sWatch = (*k8sSource)(nil)

// String names the source in logs.
func (s *k8sSource) String() string {
	return "EndpointSlices of service " + s.cfg.Namespace + "/" + s.cfg.Service
}

// newK8sSource builds the client (unless injected) and the informer; it
// does not start it.
func newK8sSource(cfg Kubernetes, changed chan struct{}) (*k8sSource, error) {
	if cfg.Namespace == "" || cfg.Service == "" {
		return nil, fmt.Errorf("%w: namespace and name are required", ErrInvalidService)
	}
	if cfg.Resync <= 0 {
		cfg.Resync = DefaultK8sResync
	}
	if cfg.SyncTimeout <= 0 {
		cfg.SyncTimeout = DefaultK8sSyncTimeout
	}
	if cfg.Client == nil {
		rc, err := restConfig(cfg.Kubeconfig)
		if err != nil {
			return nil, err
		}
		c, err := discoveryclient.NewForConfig(rc)
		if err != nil {
			return nil, fmt.Errorf("kubernetes client: %w", err)
		}
		cfg.Client = discoveryOnly{c}
	}
	selector := labels.Set{discoveryv1.LabelServiceName: cfg.Service}.AsSelector().String()
	api := cfg.Client.DiscoveryV1().EndpointSlices(cfg.Namespace)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = selector
			return api.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = selector
			return api.Watch(ctx, o)
		},
	}
	// The client passed says whether it supports watch lists (the fake
	// clientset does not).
	informer := cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, cfg.Client),
		&discoveryv1.EndpointSlice{}, cfg.Resync, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	s := &k8sSource{cfg: cfg, informer: informer, informers: newInformers(),
		lister: discoverylisters.NewEndpointSliceLister(informer.GetIndexer()).EndpointSlices(cfg.Namespace)}
	s.watch(informer, changed)
	return s, nil
}

func (s *k8sSource) waitSynced(ctx context.Context) error {
	return s.informers.waitSynced(ctx, s.cfg.SyncTimeout, s)
}

// backends returns the endpoints of the cached slices that should get
// requests, sorted by name, one per pod (a dual-stack pod appears in an
// IPv4 and an IPv6 slice: it keeps its lowest address). A slice without
// the port is skipped, and reported in the error.
func (s *k8sSource) backends(apiKey fleet.Secret) ([]*fleet.Backend, error) {
	slicesList, err := s.lister.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	type cand struct{ name, addr string }
	var cands []cand
	var errs []error
	for _, es := range slicesList {
		if es.Labels[discoveryv1.LabelServiceName] != s.cfg.Service {
			continue
		}
		if es.AddressType != discoveryv1.AddressTypeIPv4 && es.AddressType != discoveryv1.AddressTypeIPv6 {
			continue // FQDN slices name hosts, not pods
		}
		port, ok := slicePort(es, s.cfg.PortName)
		if !ok {
			if len(es.Endpoints) > 0 {
				errs = append(errs, fmt.Errorf("EndpointSlice %s has no port %q", es.Name, s.cfg.PortName))
			}
			continue
		}
		for _, ep := range es.Endpoints {
			if !inRotation(ep.Conditions) || len(ep.Addresses) == 0 {
				continue
			}
			addr := net.JoinHostPort(ep.Addresses[0], strconv.Itoa(int(port)))
			name := addr
			if ep.TargetRef != nil && ep.TargetRef.Name != "" {
				name = ep.TargetRef.Name
			}
			cands = append(cands, cand{name, addr})
		}
	}
	slices.SortFunc(cands, func(a, b cand) int { return cmp.Or(cmp.Compare(a.name, b.name), cmp.Compare(a.addr, b.addr)) })
	cands = slices.CompactFunc(cands, func(a, b cand) bool { return a.name == b.name })
	bs := make([]*fleet.Backend, 0, len(cands))
	for _, c := range cands {
		b, err := fleet.ParseBackend(0, c.name+"=http://"+c.addr)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		b.APIKey = apiKey
		bs = append(bs, b)
	}
	return bs, errors.Join(errs...)
}

// slicePort returns the port named name of a slice, or its first port when
// name is empty.
func slicePort(es *discoveryv1.EndpointSlice, name string) (int32, bool) {
	for _, p := range es.Ports {
		if p.Port == nil {
			continue
		}
		if name == "" || (p.Name != nil && *p.Name == name) {
			return *p.Port, true
		}
	}
	return 0, false
}

// inRotation reports whether an endpoint should get new requests: ready
// and serving (nil means true, as the API says) and not terminating. A
// terminating pod is still serving the requests it has (the fleet lets
// them finish when the backend is removed) but gets no new ones.
func inRotation(c discoveryv1.EndpointConditions) bool {
	isTrue := func(b *bool, unset bool) bool {
		if b == nil {
			return unset
		}
		return *b
	}
	return isTrue(c.Ready, true) && isTrue(c.Serving, true) && !isTrue(c.Terminating, false)
}
