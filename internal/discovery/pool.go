package discovery

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	coreclient "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/kvroute/kvroute/internal/fleet"
)

// The InferencePool API of the Gateway API Inference Extension, v1
// (api/v1/inferencepool_types.go there): spec.selector.matchLabels selects
// the model server pods of the pool's namespace, and spec.targetPorts (1 to
// 8 of {number}) are their ports, each pod:port an endpoint.
const (
	// DefaultPoolGroup is the InferencePool's API group, as the
	// extension's EPP takes it (--pool-group).
	DefaultPoolGroup = "inference.networking.k8s.io"
	// PoolVersion is the only version read.
	PoolVersion = "v1"
	// PoolResource is the InferencePool's resource name (for RBAC).
	PoolResource = "inferencepools"
)

// ErrInvalidPool wraps every error about an InferencePool's name or its
// spec.
var ErrInvalidPool = errors.New("invalid InferencePool")

// Pool says which InferencePool's pods are backends: the pods of its
// namespace that its selector matches, ready (the PodReady condition) and
// not being deleted, each at each of its target ports, as
// http://POD_IP:PORT, named after the pod (POD-rank-N, N from 0, when the
// pool has several ports) and labelled with the pod's labels. The pool and
// the pods are watched; a change of either, including of the pool's
// selector or ports, changes the set. A terminating pod leaves at once,
// the requests it has finish.
type Pool struct {
	// Namespace and Name name the InferencePool (--pool-namespace,
	// --pool-name).
	Namespace, Name string
	// Group is its API group (default DefaultPoolGroup; version v1).
	Group string
	// Kubeconfig is a kubeconfig file; empty: the in-cluster config.
	// Ignored when both clients are set.
	Kubeconfig string
	// Dynamic reads the InferencePool (a CRD, read as unstructured
	// objects); Core reads the pods. nil: built from Kubeconfig. Tests
	// inject k8s.io/client-go/dynamic/fake and kubernetes/fake clients.
	Dynamic dynamic.Interface
	Core    PodClient
	// Resync and SyncTimeout are as for Kubernetes (defaults
	// DefaultK8sResync, DefaultK8sSyncTimeout).
	Resync, SyncTimeout time.Duration
}

// PodClient is the part of a kubernetes.Interface the pool source uses.
type PodClient interface {
	CoreV1() coreclient.CoreV1Interface
}

// coreOnly is the PodClient kvroute builds from a rest.Config.
type coreOnly struct{ c *coreclient.CoreV1Client }

func (c coreOnly) CoreV1() coreclient.CoreV1Interface { return c.c }

// ValidatePool checks an InferencePool's namespace and name (DNS labels
// and subdomains as the API server wants them). Errors wrap ErrInvalidPool.
func ValidatePool(namespace, name string) error {
	if errs := validation.IsDNS1123Label(namespace); len(errs) > 0 {
		return fmt.Errorf("%w: namespace %q: %s", ErrInvalidPool, namespace, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return fmt.Errorf("%w: name %q: %s", ErrInvalidPool, name, strings.Join(errs, "; "))
	}
	return nil
}

// poolSource watches one InferencePool and the pods of its namespace.
type poolSource struct {
	cfg   Pool
	pools cache.SharedIndexInformer
	pods  corelisters.PodNamespaceLister
	informers
}

var _ k8sWatch = (*poolSource)(nil)

func (s *poolSource) String() string {
	return "InferencePool " + s.cfg.Namespace + "/" + s.cfg.Name + " and its pods"
}

// newPoolSource builds the clients (unless injected) and the informers: one
// on the pool alone (a field selector on its name), one on the pods of its
// namespace (the selector is the pool's and may change, so pods are
// matched when read, as the extension's own EPP does). It does not start
// them.
func newPoolSource(cfg Pool, changed chan struct{}) (*poolSource, error) {
	if err := ValidatePool(cfg.Namespace, cfg.Name); err != nil {
		return nil, err
	}
	cfg.Group = cmp.Or(cfg.Group, DefaultPoolGroup)
	if cfg.Resync <= 0 {
		cfg.Resync = DefaultK8sResync
	}
	if cfg.SyncTimeout <= 0 {
		cfg.SyncTimeout = DefaultK8sSyncTimeout
	}
	if cfg.Dynamic == nil || cfg.Core == nil {
		rc, err := restConfig(cfg.Kubeconfig)
		if err != nil {
			return nil, err
		}
		if cfg.Dynamic == nil {
			if cfg.Dynamic, err = dynamic.NewForConfig(rc); err != nil {
				return nil, fmt.Errorf("kubernetes client: %w", err)
			}
		}
		if cfg.Core == nil {
			c, err := coreclient.NewForConfig(rc)
			if err != nil {
				return nil, fmt.Errorf("kubernetes client: %w", err)
			}
			cfg.Core = coreOnly{c}
		}
	}
	gvr := schema.GroupVersionResource{Group: cfg.Group, Version: PoolVersion, Resource: PoolResource}
	poolAPI := cfg.Dynamic.Resource(gvr).Namespace(cfg.Namespace)
	byName := fields.OneTermEqualSelector("metadata.name", cfg.Name).String()
	poolLW := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = byName
			return poolAPI.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = byName
			return poolAPI.Watch(ctx, o)
		},
	}
	podAPI := cfg.Core.CoreV1().Pods(cfg.Namespace)
	podLW := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return podAPI.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return podAPI.Watch(ctx, o)
		},
	}
	indexers := cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}
	pools := cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(poolLW, cfg.Dynamic),
		&unstructured.Unstructured{}, cfg.Resync, indexers)
	pods := cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(podLW, cfg.Core),
		&corev1.Pod{}, cfg.Resync, indexers)
	s := &poolSource{cfg: cfg, pools: pools, informers: newInformers(),
		pods: corelisters.NewPodLister(pods.GetIndexer()).Pods(cfg.Namespace)}
	s.watch(pools, changed)
	s.watch(pods, changed)
	return s, nil
}

func (s *poolSource) waitSynced(ctx context.Context) error {
	return s.informers.waitSynced(ctx, s.cfg.SyncTimeout, s)
}

// poolSpec is what the source reads of an InferencePool.
type poolSpec struct {
	selector labels.Selector
	ports    []int
}

// spec reads the cached pool's selector and target ports. A pool that does
// not exist (yet, or any more) or whose spec is unusable is an error: the
// set has none of its endpoints.
func (s *poolSource) spec() (poolSpec, error) {
	obj, ok, err := s.pools.GetIndexer().GetByKey(s.cfg.Namespace + "/" + s.cfg.Name)
	if err != nil {
		return poolSpec{}, err
	}
	u, isU := obj.(*unstructured.Unstructured)
	if !ok || !isU {
		return poolSpec{}, fmt.Errorf("InferencePool %s/%s not found", s.cfg.Namespace, s.cfg.Name)
	}
	return parsePoolSpec(u)
}

// parsePoolSpec reads spec.selector.matchLabels (at least one label: an
// empty selector would take every pod of the namespace) and
// spec.targetPorts[].number (1 to 65535, at least one). Errors wrap
// ErrInvalidPool.
func parsePoolSpec(u *unstructured.Unstructured) (poolSpec, error) {
	where := u.GetNamespace() + "/" + u.GetName()
	match, _, err := unstructured.NestedStringMap(u.Object, "spec", "selector", "matchLabels")
	if err != nil || len(match) == 0 {
		return poolSpec{}, fmt.Errorf("%w: %s: spec.selector.matchLabels must map at least one label to a value", ErrInvalidPool, where)
	}
	sel, err := labels.ValidatedSelectorFromSet(match)
	if err != nil {
		return poolSpec{}, fmt.Errorf("%w: %s: spec.selector: %v", ErrInvalidPool, where, err)
	}
	list, _, err := unstructured.NestedSlice(u.Object, "spec", "targetPorts")
	if err != nil || len(list) == 0 {
		return poolSpec{}, fmt.Errorf("%w: %s: spec.targetPorts must list at least one port", ErrInvalidPool, where)
	}
	var ports []int
	for i, item := range list {
		m, _ := item.(map[string]any)
		n, ok, _ := unstructured.NestedInt64(m, "number")
		if !ok || n < 1 || n > 65535 {
			return poolSpec{}, fmt.Errorf("%w: %s: spec.targetPorts[%d].number must be a port, 1 to 65535", ErrInvalidPool, where, i)
		}
		if !slices.Contains(ports, int(n)) {
			ports = append(ports, int(n))
		}
	}
	return poolSpec{selector: sel, ports: ports}, nil
}

// backends returns the endpoints of the pool's ready pods, sorted by name.
func (s *poolSource) backends(apiKey fleet.Secret) ([]*fleet.Backend, error) {
	spec, err := s.spec()
	if err != nil {
		return nil, err
	}
	pods, err := s.pods.List(spec.selector)
	if err != nil {
		return nil, err
	}
	slices.SortFunc(pods, func(a, b *corev1.Pod) int { return cmp.Compare(a.Name, b.Name) })
	var bs []*fleet.Backend
	var errs []error
	for _, pod := range pods {
		if !podInRotation(pod) {
			continue
		}
		for rank, port := range spec.ports {
			name := pod.Name
			if len(spec.ports) > 1 {
				name += "-rank-" + strconv.Itoa(rank)
			}
			addr := net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(port))
			b, err := fleet.ParseBackend(0, name+"=http://"+addr)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			b.APIKey, b.Labels = apiKey, maps.Clone(pod.Labels)
			bs = append(bs, b)
		}
	}
	return bs, errors.Join(errs...)
}

// podInRotation reports whether a pod should get new requests: it has an
// address, is not being deleted (a terminating pod finishes what it has
// and gets nothing new) and its PodReady condition is true, as the
// extension's EPP and an EndpointSlice's ready condition say.
func podInRotation(pod *corev1.Pod) bool {
	if pod.DeletionTimestamp != nil || pod.Status.PodIP == "" {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
