package discovery

import (
	"context"
	"errors"
	"maps"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kvroute/kvroute/internal/fleet"
)

// poolGVR is the InferencePool's resource.
var poolGVR = schema.GroupVersionResource{Group: DefaultPoolGroup, Version: PoolVersion, Resource: PoolResource}

// inferencePool builds an InferencePool in namespace ai selecting
// matchLabels at ports, as the v1 API spells it.
func inferencePool(name string, matchLabels map[string]any, ports ...int64) *unstructured.Unstructured {
	var tp []any
	for _, p := range ports {
		tp = append(tp, map[string]any{"number": p})
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": DefaultPoolGroup + "/" + PoolVersion,
		"kind":       "InferencePool",
		"metadata":   map[string]any{"name": name, "namespace": "ai"},
		"spec": map[string]any{
			"selector":    map[string]any{"matchLabels": matchLabels},
			"targetPorts": tp,
			"endpointPickerRef": map[string]any{"name": "kvroute-epp", "port": map[string]any{"number": int64(9002)},
				"failureMode": "FailClose"},
		},
	}}
}

// testPod is one pod of namespace ai.
type testPod struct {
	name, ip string
	labels   map[string]string
	notReady bool
	deleting bool
}

func (p testPod) pod() *corev1.Pod {
	ready := corev1.ConditionTrue
	if p.notReady {
		ready = corev1.ConditionFalse
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: "ai", Labels: p.labels},
		Status: corev1.PodStatus{PodIP: p.ip, Conditions: []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue},
			{Type: corev1.PodReady, Status: ready},
		}},
	}
	if p.deleting {
		now := metav1.Now()
		pod.DeletionTimestamp = &now
	}
	return pod
}

var vllmLabels = map[string]string{"app": "vllm", "accelerator": "h100"}

// poolClients returns fake clients holding objs: InferencePools for the
// dynamic one, pods for the other.
func poolClients(pools []*unstructured.Unstructured, pods ...testPod) (*dynamicfake.FakeDynamicClient, *fake.Clientset) {
	var dyn []runtime.Object
	for _, p := range pools {
		dyn = append(dyn, p)
	}
	var core []runtime.Object
	for _, p := range pods {
		core = append(core, p.pod())
	}
	dc := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{poolGVR: "InferencePoolList"}, dyn...)
	return dc, fake.NewClientset(core...)
}

// TestPoolFollowsPodsAndPool adds, updates and deletes pods and the pool
// through fake clients and checks that the set handed to the update
// function follows: ready, undeleted pods the selector matches, at the
// target ports, with their labels.
func TestPoolFollowsPodsAndPool(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	dc, cs := poolClients([]*unstructured.Unstructured{
		inferencePool("llama", map[string]any{"app": "vllm"}, 8000),
		inferencePool("other", map[string]any{"app": "sglang"}, 30000),
	},
		testPod{name: "vllm-0", ip: "10.0.0.1", labels: vllmLabels},
		testPod{name: "vllm-1", ip: "10.0.0.2", labels: vllmLabels},
		testPod{name: "vllm-8", ip: "10.0.0.8", labels: vllmLabels, notReady: true},
		testPod{name: "vllm-9", ip: "", labels: vllmLabels},
		testPod{name: "sglang-0", ip: "10.0.1.1", labels: map[string]string{"app": "sglang"}},
	)
	d, err := New(Config{Pool: &Pool{Namespace: "ai", Name: "llama", Dynamic: dc, Core: cs, Resync: time.Second}, APIKey: "k"})
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
		if b.Index != i || b.APIKey != "k" || b.Labels["accelerator"] != "h100" {
			t.Errorf("backend %d: Index %d, APIKey %q, labels %v", i, b.Index, b.APIKey, b.Labels)
		}
	}

	sets, done := follow(ctx, d) // pool_test.go
	expect := expectSets(t, sets)
	pods := cs.CoreV1().Pods("ai")
	poolAPI := dc.Resource(poolGVR).Namespace("ai")

	// Scale up: two new pods, one ready at once, one when it turns ready.
	for _, p := range []testPod{{name: "vllm-2", ip: "10.0.0.3", labels: vllmLabels},
		{name: "vllm-3", ip: "10.0.0.4", labels: vllmLabels, notReady: true}} {
		if _, err := pods.Create(ctx, p.pod(), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	expect("new pod", "vllm-0=http://10.0.0.1:8000", "vllm-1=http://10.0.0.2:8000", "vllm-2=http://10.0.0.3:8000")
	if _, err := pods.UpdateStatus(ctx, testPod{name: "vllm-3", ip: "10.0.0.4", labels: vllmLabels}.pod(), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("pod ready", "vllm-0=http://10.0.0.1:8000", "vllm-1=http://10.0.0.2:8000",
		"vllm-2=http://10.0.0.3:8000", "vllm-3=http://10.0.0.4:8000")

	// vllm-1 is being deleted (still serving what it has): it leaves;
	// vllm-0 is deleted outright.
	if _, err := pods.Update(ctx, testPod{name: "vllm-1", ip: "10.0.0.2", labels: vllmLabels, deleting: true}.pod(), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := pods.Delete(ctx, "vllm-0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("terminating and deleted", "vllm-2=http://10.0.0.3:8000", "vllm-3=http://10.0.0.4:8000")

	// The pool's selector narrows to one accelerator and gains a port: each
	// pod:port is an endpoint.
	if _, err := pods.Update(ctx, testPod{name: "vllm-3", ip: "10.0.0.4", labels: map[string]string{"app": "vllm", "accelerator": "a100"}}.pod(),
		metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := poolAPI.Update(ctx, inferencePool("llama", map[string]any{"app": "vllm", "accelerator": "h100"}, 8000, 8001),
		metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("selector and ports", "vllm-2-rank-0=http://10.0.0.3:8000", "vllm-2-rank-1=http://10.0.0.3:8001")

	// The pool goes: no endpoints; it comes back: they do too.
	if err := poolAPI.Delete(ctx, "llama", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("pool deleted")
	if _, err := poolAPI.Create(ctx, inferencePool("llama", map[string]any{"app": "vllm"}, 8000), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("pool back", "vllm-2=http://10.0.0.3:8000", "vllm-3=http://10.0.0.4:8000")

	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// follow runs d until ctx ends: every set it hands out goes to sets (as
// names), Run's result to done.
func follow(ctx context.Context, d *Discovery) (sets <-chan []string, done <-chan error) {
	c, e := make(chan []string, 16), make(chan error, 1)
	go func() {
		e <- d.Run(ctx, func(_ context.Context, bs []*fleet.Backend) { c <- names(bs) })
	}()
	return c, e
}

// expectSets returns a function that waits (10 s at most) until the set
// received is want, skipping intermediate ones.
func expectSets(t *testing.T, sets <-chan []string) func(step string, want ...string) {
	return func(step string, want ...string) {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for {
			select {
			case got := <-sets:
				if slices.Equal(got, want) || len(got) == 0 && len(want) == 0 {
					return
				}
				t.Logf("%s: intermediate set %v", step, got)
			case <-deadline:
				t.Fatalf("%s: the set never became %v", step, want)
			}
		}
	}
}

// TestPoolSpecErrors checks that an unusable pool gives no endpoints and
// an error that says why.
func TestPoolSpecErrors(t *testing.T) {
	noPorts := inferencePool("llama", map[string]any{"app": "vllm"})
	badPort := inferencePool("llama", map[string]any{"app": "vllm"}, 70000)
	noSelector := inferencePool("llama", map[string]any{}, 8000)
	for _, c := range []struct {
		name string
		pool []*unstructured.Unstructured
		want error
	}{
		{"missing", nil, nil},
		{"no ports", []*unstructured.Unstructured{noPorts}, ErrInvalidPool},
		{"bad port", []*unstructured.Unstructured{badPort}, ErrInvalidPool},
		{"no selector", []*unstructured.Unstructured{noSelector}, ErrInvalidPool},
	} {
		t.Run(c.name, func(t *testing.T) {
			dc, cs := poolClients(c.pool, testPod{name: "vllm-0", ip: "10.0.0.1", labels: vllmLabels})
			d, err := New(Config{Pool: &Pool{Namespace: "ai", Name: "llama", Dynamic: dc, Core: cs}})
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			bs, err := d.Resolve(t.Context())
			if err == nil || len(bs) != 0 {
				t.Fatalf("Resolve = %v, %v; want no backends and an error", names(bs), err)
			}
			if c.want != nil && !errors.Is(err, c.want) {
				t.Fatalf("err = %v, want %v", err, c.want)
			}
		})
	}
}

func TestValidatePool(t *testing.T) {
	if err := ValidatePool("ai", "llama-3.1-8b"); err != nil {
		t.Fatal(err)
	}
	for _, c := range [][2]string{{"", "x"}, {"ai", ""}, {"AI", "x"}, {"ai", "a/b"}} {
		if err := ValidatePool(c[0], c[1]); !errors.Is(err, ErrInvalidPool) {
			t.Errorf("ValidatePool(%q, %q) = %v, want ErrInvalidPool", c[0], c[1], err)
		}
	}
}

// TestPoolRoles reads each pod's prefill/decode role from llm-d's label.
func TestPoolRoles(t *testing.T) {
	role := func(r string) map[string]string { return map[string]string{"app": "vllm", fleet.RoleLabel: r} }
	dc, cs := poolClients([]*unstructured.Unstructured{inferencePool("llama", map[string]any{"app": "vllm"}, 8000)},
		testPod{name: "p-0", ip: "10.0.0.1", labels: role("prefill")},
		testPod{name: "d-0", ip: "10.0.0.2", labels: role("decode")},
		testPod{name: "b-0", ip: "10.0.0.3", labels: map[string]string{"app": "vllm"}},
	)
	d, err := New(Config{Pool: &Pool{Namespace: "ai", Name: "llama", Dynamic: dc, Core: cs, Resync: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	bs, err := d.Resolve(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]fleet.Role{}
	for _, b := range bs {
		got[b.Name] = b.Role()
	}
	want := map[string]fleet.Role{"p-0": fleet.RolePrefill, "d-0": fleet.RoleDecode, "b-0": fleet.RoleBoth}
	if !maps.Equal(got, want) {
		t.Errorf("roles %v, want %v", got, want)
	}
}
