package balancer

import (
	"context"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
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

// TestBalancerConfigValid has the installed nginx and HAProxy check every
// kind's generated config (nginx -t, haproxy -c), so that a directive the
// installed version does not know fails here rather than at bench time.
func TestBalancerConfigValid(t *testing.T) {
	for _, k := range balancerKinds {
		t.Run(k.name, func(t *testing.T) {
			bin, err := lookProgram(k.program)
			if err != nil {
				t.Skip(err)
			}
			dir := t.TempDir()
			file, conf, err := k.render(balancerConfig{
				Kind: k.name, Dir: dir, Listen: "127.0.0.1:9000", Ready: "/.kvroute-ready",
				Root: os.Geteuid() == 0, Method: k.method, Servers: []string{"127.0.0.1:8001", "127.0.0.1:8002"},
			})
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, file)
			if err := os.WriteFile(path, conf, 0o600); err != nil {
				t.Fatal(err)
			}
			args := append(k.args(dir, path), "-t")
			if k.program == "haproxy" {
				args = []string{"-c", "-f", path}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
			if err != nil {
				t.Fatalf("%s %v: %v\n%s", bin, args, err, out)
			}
			if strings.Contains(string(out), "[WARNING]") || strings.Contains(string(out), "[warn]") {
				t.Errorf("%s warns about the config:\n%s", k.program, out)
			}
		})
	}
}
