package server

import (
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kvroute/kvroute/internal/discovery"
	"github.com/kvroute/kvroute/internal/emulator"
)

// podSlice is the EndpointSlice of one pod of Service vllm in namespace
// ai: pod e<i> on 127.0.0.1 at port, ready or terminating (still serving).
func podSlice(i int, port uint16, terminating bool) *discoveryv1.EndpointSlice {
	name, p := "http", int32(port)
	ready, serving := !terminating, true
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("vllm-e%d", i), Namespace: "ai",
			Labels: map[string]string{discoveryv1.LabelServiceName: "vllm"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &p}},
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{"127.0.0.1"},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &serving, Terminating: &terminating},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: "ai", Name: fmt.Sprintf("e%d", i)},
		}},
	}
}

// TestKubernetesFleetUnderLoad runs kvroute with Kubernetes discovery (a
// fake clientset) in front of four in-process emulators under steady
// streaming load: EndpointSlices are created (2 → 4), one pod starts
// terminating and another's slice is deleted (4 → 2). No client sees an
// error, added backends take requests within a second of the change, and
// removed ones finish what they had and get nothing new.
func TestKubernetesFleetUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("runs emulators for seconds")
	}
	// slack covers admitting a new backend (the watch event, a probe, a
	// scrape on loopback) and the first request's routing.
	const slack = time.Second
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	emus := make([]*countedEmulator, 4)
	var model string
	for i := range emus {
		e, err := emulator.New(emulator.Config{Seed: uint64(i + 1), TimeScale: 0.5, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		go e.Run(ctx)
		c := &countedEmulator{emu: e}
		c.srv = httptest.NewServer(c)
		defer c.srv.Close()
		emus[i], model = c, e.Model()
	}
	cs := fake.NewClientset(podSlice(0, emus[0].port(), false), podSlice(1, emus[1].port(), false))
	api := cs.DiscoveryV1().EndpointSlices("ai")
	d, err := discovery.New(discovery.Config{Logger: fleetLogger(),
		Kubernetes: &discovery.Kubernetes{Namespace: "ai", Service: "vllm", PortName: "http", Client: cs}})
	if err != nil {
		t.Fatal(err)
	}
	s := startDiscovered(t, ctx, d)

	// Steady streaming load from six clients until the end.
	defer steadyLoad(t, s.URL, model, "tell me about the pods ", 6)()
	inFleet := func(i int) bool {
		for _, b := range s.Fleet.Backends() {
			if b.URL.String() == emus[i].srv.URL {
				return true
			}
		}
		return false
	}
	time.Sleep(300 * time.Millisecond) // load on the first two

	// Scale up: e2 and e3's slices appear.
	at := time.Now()
	for _, i := range []int{2, 3} {
		emus[i].firstAt.Store(0)
		if _, err := api.Create(ctx, podSlice(i, emus[i].port(), false), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, i := range []int{2, 3} {
		waitWithin(t, fmt.Sprintf("e%d a candidate", i), slack, func() bool {
			for _, b := range s.Fleet.Candidates(nil, model) {
				if b.URL.String() == emus[i].srv.URL {
					return b.Name == fmt.Sprintf("e%d", i)
				}
			}
			return false
		})
	}
	for _, i := range []int{2, 3} {
		waitWithin(t, fmt.Sprintf("e%d takes requests", i), 10*time.Second, func() bool { return emus[i].firstAt.Load() != 0 })
		t.Logf("scale up: e%d's first request %v after the change", i, time.Unix(0, emus[i].firstAt.Load()).Sub(at).Round(time.Millisecond))
	}

	// Scale down, while e0 and e1 have requests in flight: e0 starts
	// terminating, e1's slice is deleted.
	for _, i := range []int{0, 1} {
		waitWithin(t, fmt.Sprintf("e%d busy", i), 10*time.Second, func() bool { return emus[i].inFlight() > 0 })
	}
	busy, finished := make([]int64, 2), make([]int64, 2)
	for _, i := range []int{0, 1} {
		busy[i], finished[i] = emus[i].inFlight(), emus[i].finished.Load()
	}
	if _, err := api.Update(ctx, podSlice(0, emus[0].port(), true), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := api.Delete(ctx, "vllm-e1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitWithin(t, "e0 and e1 removed", slack, func() bool { return !inFleet(0) && !inFleet(1) })
	started := []int64{emus[0].started.Load(), emus[1].started.Load()}
	for _, i := range []int{0, 1} {
		waitWithin(t, fmt.Sprintf("e%d's requests in flight finish", i), 10*time.Second, func() bool { return emus[i].inFlight() == 0 })
		if n := emus[i].finished.Load() - finished[i]; n < busy[i] {
			t.Errorf("e%d finished %d requests of the %d in flight at its removal", i, n, busy[i])
		}
		t.Logf("scale down: e%d removed with %d requests in flight; %d finished after", i, busy[i], emus[i].finished.Load()-finished[i])
	}
	time.Sleep(300 * time.Millisecond) // load on the last two
	for _, i := range []int{0, 1} {
		// Requests routed just before the removal may arrive just after
		// it; none is routed there later.
		if n := emus[i].started.Load() - started[i]; n > 2 {
			t.Errorf("e%d received %d requests after its removal", i, n)
		}
	}
	if n := len(s.Fleet.Backends()); n != 2 {
		t.Errorf("after scale down: %d backends, want 2", n)
	}
}
