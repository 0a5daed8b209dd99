package discovery

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kvroute/kvroute/internal/fleet"
)

// k8sEndpoint is one endpoint of a test slice.
type k8sEndpoint struct {
	pod, ip                   string
	notReady, terminating     bool
	serving, servingSpecified bool
}

// endpointSlice builds a slice of service vllm in namespace ai, with a
// port "http" 8000 and a port "metrics" 9000 before it.
func endpointSlice(name string, eps ...k8sEndpoint) *discoveryv1.EndpointSlice {
	ptr := func(s string) *string { return &s }
	port := func(p int32) *int32 { return &p }
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ai",
			Labels: map[string]string{discoveryv1.LabelServiceName: "vllm"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{
			{Name: ptr("metrics"), Port: port(9000)},
			{Name: ptr("http"), Port: port(8000)},
		},
	}
	for _, e := range eps {
		ready, term := !e.notReady, e.terminating
		c := discoveryv1.EndpointConditions{Ready: &ready, Terminating: &term}
		if e.servingSpecified {
			c.Serving = &e.serving
		}
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{e.ip},
			Conditions: c,
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: "ai", Name: e.pod},
		})
	}
	return es
}

// names lists "name=url" of a set, sorted.
func names(bs []*fleet.Backend) []string {
	var out []string
	for _, b := range bs {
		out = append(out, b.Name+"="+b.URL.String())
	}
	slices.Sort(out)
	return out
}

func TestParseService(t *testing.T) {
	ns, name, err := ParseService("ai/vllm")
	if err != nil || ns != "ai" || name != "vllm" {
		t.Fatalf("ParseService(ai/vllm) = %q, %q, %v", ns, name, err)
	}
	for _, bad := range []string{"", "vllm", "ai/", "/vllm", "ai/vllm/x", "AI/vllm"} {
		if _, _, err := ParseService(bad); !errors.Is(err, ErrInvalidService) {
			t.Errorf("ParseService(%q): err = %v, want ErrInvalidService", bad, err)
		}
	}
}

func TestInRotation(t *testing.T) {
	yes, no := true, false
	for _, c := range []struct {
		cond discoveryv1.EndpointConditions
		want bool
	}{
		{discoveryv1.EndpointConditions{}, true}, // nil means ready and serving
		{discoveryv1.EndpointConditions{Ready: &yes, Serving: &yes, Terminating: &no}, true},
		{discoveryv1.EndpointConditions{Ready: &no}, false},
		{discoveryv1.EndpointConditions{Ready: &yes, Serving: &no}, false},
		// Terminating but still serving: its requests finish, no new ones.
		{discoveryv1.EndpointConditions{Ready: &no, Serving: &yes, Terminating: &yes}, false},
		{discoveryv1.EndpointConditions{Ready: &yes, Terminating: &yes}, false},
	} {
		if got := inRotation(c.cond); got != c.want {
			t.Errorf("inRotation(%+v) = %v, want %v", c.cond, got, c.want)
		}
	}
}

// TestKubernetesFollowsEndpointSlices adds, updates and deletes
// EndpointSlices through a fake clientset and checks that the set handed
// to the update function follows: 2 → 4 → a terminating endpoint leaves →
// 2.
func TestKubernetesFollowsEndpointSlices(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	cs := fake.NewClientset(
		endpointSlice("vllm-a", k8sEndpoint{pod: "vllm-0", ip: "10.0.0.1"}, k8sEndpoint{pod: "vllm-1", ip: "10.0.0.2"},
			k8sEndpoint{pod: "vllm-9", ip: "10.0.0.9", notReady: true}),
		// Another service's slice in the namespace is not ours.
		func() *discoveryv1.EndpointSlice {
			es := endpointSlice("other-a", k8sEndpoint{pod: "other-0", ip: "10.0.1.1"})
			es.Labels[discoveryv1.LabelServiceName] = "other"
			return es
		}(),
	)
	d, err := New(Config{Kubernetes: &Kubernetes{Namespace: "ai", Service: "vllm", PortName: "http", Client: cs, Resync: time.Second},
		APIKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	bs, err := d.Resolve(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"vllm-0=http://10.0.0.1:8000", "vllm-1=http://10.0.0.2:8000"}
	if got := names(bs); !slices.Equal(got, want) {
		t.Fatalf("Resolve = %v, want %v", got, want)
	}
	for i, b := range bs {
		if b.Index != i || b.APIKey != "k" {
			t.Errorf("backend %d: Index %d, APIKey %q", i, b.Index, b.APIKey)
		}
	}

	sets, done := follow(ctx, d) // pool_test.go
	expect := expectSets(t, sets)
	slicesAPI := cs.DiscoveryV1().EndpointSlices("ai")

	// Scale up: a second slice with two more pods.
	if _, err := slicesAPI.Create(ctx, endpointSlice("vllm-b", k8sEndpoint{pod: "vllm-2", ip: "10.0.0.3"},
		k8sEndpoint{pod: "vllm-3", ip: "10.0.0.4"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("scale up", "vllm-0=http://10.0.0.1:8000", "vllm-1=http://10.0.0.2:8000",
		"vllm-2=http://10.0.0.3:8000", "vllm-3=http://10.0.0.4:8000")

	// vllm-1 starts terminating (still serving its requests): it leaves.
	if _, err := slicesAPI.Update(ctx, endpointSlice("vllm-a", k8sEndpoint{pod: "vllm-0", ip: "10.0.0.1"},
		k8sEndpoint{pod: "vllm-1", ip: "10.0.0.2", notReady: true, terminating: true, serving: true, servingSpecified: true},
		k8sEndpoint{pod: "vllm-9", ip: "10.0.0.9", notReady: true}), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("terminating", "vllm-0=http://10.0.0.1:8000", "vllm-2=http://10.0.0.3:8000", "vllm-3=http://10.0.0.4:8000")

	// Scale down: the first slice goes (vllm-0, vllm-1 gone).
	if err := slicesAPI.Delete(ctx, "vllm-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("scale down", "vllm-2=http://10.0.0.3:8000", "vllm-3=http://10.0.0.4:8000")

	// A resync hands the same slices again: no update without a change.
	select {
	case got := <-sets:
		t.Fatalf("update without a change: %v", got)
	case <-time.After(1500 * time.Millisecond):
	}

	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// TestKubernetesPorts checks the port choice: the named one, else the
// first; a slice without the named port is skipped with an error.
func TestKubernetesPorts(t *testing.T) {
	for _, c := range []struct {
		portName string
		want     []string
		err      bool
	}{
		{"", []string{"vllm-0=http://10.0.0.1:9000"}, false},
		{"http", []string{"vllm-0=http://10.0.0.1:8000"}, false},
		{"grpc", nil, true},
	} {
		t.Run(fmt.Sprintf("port=%q", c.portName), func(t *testing.T) {
			cs := fake.NewClientset(endpointSlice("vllm-a", k8sEndpoint{pod: "vllm-0", ip: "10.0.0.1"}))
			d, err := New(Config{Kubernetes: &Kubernetes{Namespace: "ai", Service: "vllm", PortName: c.portName, Client: cs}})
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			bs, err := d.Resolve(t.Context())
			if (err != nil) != c.err {
				t.Fatalf("Resolve err = %v, want error %v", err, c.err)
			}
			if got := names(bs); !slices.Equal(got, c.want) {
				t.Fatalf("Resolve = %v, want %v", got, c.want)
			}
		})
	}
}

// TestKubernetesDualStack checks that a pod in an IPv4 and an IPv6 slice
// is one backend.
func TestKubernetesDualStack(t *testing.T) {
	v6 := endpointSlice("vllm-v6", k8sEndpoint{pod: "vllm-0", ip: "fd00::1"})
	v6.AddressType = discoveryv1.AddressTypeIPv6
	cs := fake.NewClientset(endpointSlice("vllm-v4", k8sEndpoint{pod: "vllm-0", ip: "10.0.0.1"}), v6,
		endpointSlice("vllm-v6b", k8sEndpoint{pod: "vllm-1", ip: "fd00::2"}))
	d, err := New(Config{Kubernetes: &Kubernetes{Namespace: "ai", Service: "vllm", PortName: "http", Client: cs}})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	bs, err := d.Resolve(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"vllm-0=http://10.0.0.1:8000", "vllm-1=http://[fd00::2]:8000"}
	if got := names(bs); !slices.Equal(got, want) {
		t.Fatalf("Resolve = %v, want %v", got, want)
	}
}
