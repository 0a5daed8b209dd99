package epp

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kvroute/kvroute/internal/discovery"
	"github.com/kvroute/kvroute/internal/emulator"
	"github.com/kvroute/kvroute/internal/router/policies"
	"github.com/kvroute/kvroute/internal/server"
)

var poolGVR = schema.GroupVersionResource{Group: discovery.DefaultPoolGroup, Version: discovery.PoolVersion, Resource: discovery.PoolResource}

// inferencePool is an InferencePool "llama" in namespace ai, as the v1 API
// spells it.
func inferencePool(matchLabels map[string]any, port int) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": discovery.DefaultPoolGroup + "/" + discovery.PoolVersion,
		"kind":       "InferencePool",
		"metadata":   map[string]any{"name": "llama", "namespace": "ai"},
		"spec": map[string]any{
			"selector":          map[string]any{"matchLabels": matchLabels},
			"targetPorts":       []any{map[string]any{"number": int64(port)}},
			"endpointPickerRef": map[string]any{"name": "kvroute-epp", "port": map[string]any{"number": int64(9002)}},
		},
	}}
}

// modelPod is a pod of namespace ai at ip, ready unless told otherwise.
func modelPod(name, ip string, labels map[string]string, ready, deleting bool) *corev1.Pod {
	st := corev1.ConditionTrue
	if !ready {
		st = corev1.ConditionFalse
	}
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ai", Labels: labels},
		Status: corev1.PodStatus{PodIP: ip, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}}}
	if deleting {
		now := metav1.Now()
		p.DeletionTimestamp = &now
	}
	return p
}

// podEmulators starts n emulated vLLM servers on one port, each on an
// address of its own in 127.0.0.0/8 (127.0.0.2, .3, ...), as the pods of
// an InferencePool share its target port. It returns their IPs and the
// port.
func podEmulators(t *testing.T, ctx context.Context, n int) ([]string, int) {
	t.Helper()
	for attempt := 0; attempt < 10; attempt++ {
		probe, err := net.Listen("tcp", "127.0.0.2:0")
		if err != nil {
			t.Skipf("no loopback address beyond 127.0.0.1: %v", err)
		}
		port := probe.Addr().(*net.TCPAddr).Port
		lns := []net.Listener{probe}
		for i := 1; i < n; i++ {
			ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0."+strconv.Itoa(i+2), strconv.Itoa(port)))
			if err != nil {
				break // the port is taken on that address: try another
			}
			lns = append(lns, ln)
		}
		if len(lns) < n {
			for _, ln := range lns {
				ln.Close()
			}
			continue
		}
		var ips []string
		for i, ln := range lns {
			e, err := emulator.New(emulator.Config{Seed: 1, TimeScale: 0.05, Logger: quiet()})
			if err != nil {
				t.Fatal(err)
			}
			go e.Run(ctx)
			ts := httptest.NewUnstartedServer(e)
			ts.Listener.Close()
			ts.Listener = ln
			ts.Start()
			t.Cleanup(ts.Close)
			ips = append(ips, "127.0.0."+strconv.Itoa(i+2))
		}
		return ips, port
	}
	t.Fatal("no port free on every loopback address")
	return nil, 0
}

// TestPicksFollowInferencePool runs the picker on an InferencePool's pods
// (fake API clients in front of real emulators) while pods are added,
// become ready, terminate and go, and the pool's selector changes and the
// pool goes: after each change has reached the picker, every destination
// it names is a ready pod the pool selects, and every such pod gets
// requests (round-robin; kvroute must only stay inside the pool).
func TestPicksFollowInferencePool(t *testing.T) {
	if testing.Short() {
		t.Skip("runs emulators")
	}
	for _, policy := range []string{"round-robin", "kvroute"} {
		t.Run(policy, func(t *testing.T) { picksFollowPool(t, policy) })
	}
}

func picksFollowPool(t *testing.T, policy string) {
	ctx := t.Context()
	ips, port := podEmulators(t, ctx, 4)
	h100 := map[string]string{"app": "vllm", "accelerator": "h100"}
	a100 := map[string]string{"app": "vllm", "accelerator": "a100"}
	dc := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{poolGVR: "InferencePoolList"}, inferencePool(map[string]any{"app": "vllm"}, port))
	cs := fake.NewClientset(
		modelPod("vllm-0", ips[0], h100, true, false), modelPod("vllm-1", ips[1], h100, true, false),
		// Not selected: a pod of another app, ready, whose address has no
		// server.
		modelPod("sglang-0", "127.0.0.9", map[string]string{"app": "sglang"}, true, false))
	pods, pools := cs.CoreV1().Pods("ai"), dc.Resource(poolGVR).Namespace("ai")
	d, err := discovery.New(discovery.Config{Logger: quiet(),
		Pool: &discovery.Pool{Namespace: "ai", Name: "llama", Dynamic: dc, Core: cs, Resync: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	s, err := Start(ctx, Config{CoreConfig: server.CoreConfig{Discovery: d, Policy: policy, Router: policies.Options{Seed: 1}, Logger: quiet()},
		Picker: Options{Fallbacks: 1}, GRPCListen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	env := connect(t, s)
	addr := func(i int) string { return net.JoinHostPort(ips[i], strconv.Itoa(port)) }

	// phase waits until the picker's endpoints in rotation are exactly
	// want, then sends requests and checks where they go.
	n := 0
	phase := func(name string, want ...int) {
		t.Helper()
		env.pool = map[string]bool{}
		for _, i := range want {
			env.pool[addr(i)] = true
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			got := map[string]bool{}
			for _, b := range s.Fleet.Healthy(nil) {
				got[Address(b)] = true
			}
			if maps.Equal(got, env.pool) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: endpoints in rotation %v, want %v", name, slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(env.pool)))
			}
			time.Sleep(10 * time.Millisecond)
		}
		if len(want) == 0 {
			res, err := env.do(ctx, "/v1/chat/completions", nil, chatBody("m", []message{{"user", "anyone?"}}, 4))
			if err != nil || !res.immediate || res.status != http.StatusServiceUnavailable {
				t.Fatalf("%s: %+v, %v; want an immediate 503", name, res, err)
			}
			return
		}
		model := s.Fleet.Healthy(nil)[0].Info().Models[0]
		served := map[string]int{}
		for range 4 * len(want) {
			n++
			body := chatBody(model, []message{{"user", fmt.Sprintf("conversation %d: %s", n, strings.Repeat("tell me more. ", 20))}}, 4)
			res, err := env.do(ctx, "/v1/chat/completions", map[string]string{"x-session-id": strconv.Itoa(n)}, body)
			if err != nil { // the harness fails on a destination outside env.pool
				t.Fatalf("%s: %v", name, err)
			}
			if res.status != http.StatusOK {
				t.Fatalf("%s: status %d: %s", name, res.status, res.body)
			}
			served[res.list[0]]++
		}
		if policy == "round-robin" && len(served) != len(want) {
			t.Errorf("%s: requests went to %v, want every one of %d endpoints", name, served, len(want))
		}
	}

	phase("start", 0, 1)

	if _, err := pods.Create(ctx, modelPod("vllm-2", ips[2], h100, true, false), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := pods.Create(ctx, modelPod("vllm-3", ips[3], a100, false, false), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	phase("a pod added", 0, 1, 2)
	if _, err := pods.UpdateStatus(ctx, modelPod("vllm-3", ips[3], a100, true, false), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	phase("a pod ready", 0, 1, 2, 3)

	if _, err := pods.Update(ctx, modelPod("vllm-1", ips[1], h100, true, true), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := pods.Delete(ctx, "vllm-0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	phase("a pod terminating, one deleted", 2, 3)

	if _, err := pools.Update(ctx, inferencePool(map[string]any{"app": "vllm", "accelerator": "a100"}, port), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	phase("the selector narrowed", 3)

	if err := pools.Delete(ctx, "llama", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	phase("the pool deleted")
}
