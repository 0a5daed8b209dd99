package balancer

import (
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var updateGolden = flag.Bool("update", false, "rewrite the golden balancer configs in testdata")

// TestBalancerConfigGolden pins every kind's generated config, byte for
// byte, for a fixed input: the configs are what the bench measures, so a
// change to them must be deliberate (go test -run Golden -update).
func TestBalancerConfigGolden(t *testing.T) {
	for _, k := range balancerKinds {
		for _, root := range []bool{false, true} {
			if root && k.program != "nginx" {
				continue // HAProxy's config does not depend on it
			}
			name := k.name
			if root {
				name += "-root"
			}
			t.Run(name, func(t *testing.T) {
				file, conf, err := k.render(balancerConfig{
					Kind: k.name, Dir: "/tmp/kvroute-golden", Listen: "127.0.0.1:9000", Ready: "/.kvroute-ready-golden",
					Root: root, Method: k.method, Servers: []string{"127.0.0.1:8001", "127.0.0.1:8002", "[::1]:8003"},
				})
				if err != nil {
					t.Fatal(err)
				}
				golden := filepath.Join("testdata", name+"-"+file)
				if *updateGolden {
					if err := os.MkdirAll("testdata", 0o755); err != nil {
						t.Fatal(err)
					}
					if err := os.WriteFile(golden, conf, 0o644); err != nil {
						t.Fatal(err)
					}
				}
				want, err := os.ReadFile(golden)
				if err != nil {
					t.Fatal(err)
				}
				if string(conf) != string(want) {
					t.Errorf("%s config differs from %s:\n%s", k.name, golden, conf)
				}
			})
		}
	}
}
