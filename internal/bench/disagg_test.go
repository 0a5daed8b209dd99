package bench

import (
	"net/url"
	"testing"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/fleet"
)

func TestDisaggConfig(t *testing.T) {
	p, err := engine.LookupProfile(engine.DefaultProfile)
	if err != nil {
		t.Fatal(err)
	}
	mk := func() []*fleet.Backend {
		var bs []*fleet.Backend
		for i := range 3 {
			bs = append(bs, fleet.NewBackend(i, "gpu", &url.URL{Scheme: "http", Host: "127.0.0.1:1"}))
		}
		return bs
	}
	bs := mk()
	policy, pd, err := disagg(FleetConfig{Policy: "kvroute@load", Prefill: 1, Profile: p}, bs)
	if err != nil || policy != "kvroute" || pd.Splitter == nil || pd.Splitter.Name() != "load" {
		t.Fatalf("kvroute@load: %q %+v %v", policy, pd, err)
	}
	if bs[2].Role() != fleet.RolePrefill || bs[0].Role() != fleet.RoleBoth {
		t.Errorf("roles %v %v %v, want the last one prefill", bs[0].Role(), bs[1].Role(), bs[2].Role())
	}
	f := &Fleet{backends: 3, prefill: 1}
	if f.roleOf(2).Role != "prefill" || f.roleOf(0).Role != "decode" {
		t.Errorf("emulator roles %q %q", f.roleOf(0).Role, f.roleOf(2).Role)
	}
	if _, _, err := disagg(FleetConfig{Policy: "kvroute@priced"}, mk()); err == nil {
		t.Error("a splitter without prefill servers was accepted")
	}
	if policy, pd, err := disagg(FleetConfig{Policy: "round-robin"}, mk()); err != nil || policy != "round-robin" || pd.Splitter != nil {
		t.Errorf("round-robin: %q %+v %v", policy, pd, err)
	}
}
