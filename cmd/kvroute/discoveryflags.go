package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/kvroute/kvroute/internal/discovery"
	"github.com/kvroute/kvroute/internal/fleet"
)

// discoveryConfig is what the discovery flags decide, for serve and epp
// alike: with a --config file, a --dns name, a --k8s-service or a
// --pool-name, the fleet follows them while kvroute runs.
type discoveryConfig struct {
	configPath     string
	configInterval time.Duration
	dns            stringList
	dnsInterval    time.Duration
	k8sService     string // NAMESPACE/NAME
	k8sPortName    string
	kubeconfig     string
	poolName       string
	poolNamespace  string
	poolGroup      string
	fixed          []*fleet.Backend // the --backend flags: they stay
}

// defaultPoolNamespace is the InferencePool's namespace when
// --pool-namespace is not given, as the Inference Extension's EPP takes
// it.
const defaultPoolNamespace = "default"

// register defines the discovery flags on fs.
func (d *discoveryConfig) register(fs *flag.FlagSet) {
	fs.DurationVar(&d.configInterval, "config-interval", discovery.DefaultFileInterval, "how often the --config file is checked for changed backends (also re-read on SIGHUP; 0: only on SIGHUP)")
	fs.Var(&d.dns, "dns", "a DNS name whose addresses are backends, NAME[:PORT] (A/AAAA, port 8000 by default) or an SRV name starting with _ (repeatable)")
	fs.DurationVar(&d.dnsInterval, "dns-interval", discovery.DefaultDNSInterval, "how often --dns names are resolved again")
	fs.StringVar(&d.k8sService, "k8s-service", "", "a Kubernetes Service, NAMESPACE/NAME, whose ready endpoints (EndpointSlices, watched) are backends, named after their pods")
	fs.StringVar(&d.k8sPortName, "k8s-port-name", "", "the EndpointSlice port of --k8s-service to use (default: each slice's first)")
	fs.StringVar(&d.poolName, "pool-name", "", "an InferencePool (Gateway API Inference Extension, v1) whose ready pods, at its target ports, are backends, with their labels (watched)")
	fs.StringVar(&d.poolNamespace, "pool-namespace", defaultPoolNamespace, "the namespace of --pool-name")
	fs.StringVar(&d.poolGroup, "pool-group", discovery.DefaultPoolGroup, "the API group of --pool-name (version v1)")
	fs.StringVar(&d.kubeconfig, "kubeconfig", "", "kubeconfig file for --k8s-service and --pool-name (default: the in-cluster service account)")
}

// enabled reports whether the fleet changes at run time.
func (d *discoveryConfig) enabled() bool {
	return d.configPath != "" || len(d.dns) > 0 || d.k8sService != "" || d.poolName != ""
}

// dynamic reports whether a source other than the --config file may bring
// backends, so that none at start is not an error.
func (d *discoveryConfig) dynamic() bool {
	return len(d.dns) > 0 || d.k8sService != "" || d.poolName != ""
}

// validate checks the discovery flags' values.
func (d *discoveryConfig) validate() error {
	if _, err := discovery.New(discovery.Config{DNS: d.dns}); err != nil {
		return fmt.Errorf("--dns: %w", err)
	}
	if d.k8sService != "" {
		if _, _, err := discovery.ParseService(d.k8sService); err != nil {
			return fmt.Errorf("--k8s-service: %w", err)
		}
	}
	if d.poolName != "" {
		if err := discovery.ValidatePool(d.poolNamespace, d.poolName); err != nil {
			return fmt.Errorf("--pool-name, --pool-namespace: %w", err)
		}
	}
	if d.configInterval < 0 || d.dnsInterval <= 0 {
		return errors.New("--config-interval must not be negative and --dns-interval must be positive")
	}
	return nil
}

// kubernetes is the Kubernetes source of the flags, nil without
// --k8s-service (checked by validate).
func (d *discoveryConfig) kubernetes() *discovery.Kubernetes {
	if d.k8sService == "" {
		return nil
	}
	ns, name, _ := discovery.ParseService(d.k8sService)
	return &discovery.Kubernetes{Namespace: ns, Service: name, PortName: d.k8sPortName, Kubeconfig: d.kubeconfig}
}

// pool is the InferencePool source of the flags, nil without --pool-name.
func (d *discoveryConfig) pool() *discovery.Pool {
	if d.poolName == "" {
		return nil
	}
	return &discovery.Pool{Namespace: d.poolNamespace, Name: d.poolName, Group: d.poolGroup, Kubeconfig: d.kubeconfig}
}

// start builds the discovery of the flags, nil when the fleet is static,
// and re-reads it on SIGHUP until ctx ends. apiKey goes to discovered
// backends without a key of their own.
func (d *discoveryConfig) start(ctx context.Context, apiKey fleet.Secret, log *slog.Logger) (*discovery.Discovery, error) {
	if !d.enabled() {
		return nil, nil
	}
	every := d.configInterval
	if every == 0 {
		every = -1 // only on SIGHUP
	}
	disc, err := discovery.New(discovery.Config{Fixed: d.fixed, File: d.configPath, FileInterval: every,
		DNS: d.dns, DNSInterval: d.dnsInterval, Kubernetes: d.kubernetes(), Pool: d.pool(), APIKey: apiKey, Logger: log})
	if err != nil {
		return nil, err
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		defer signal.Stop(hup)
		for {
			select {
			case <-hup:
				disc.Reload()
			case <-ctx.Done():
				return
			}
		}
	}()
	return disc, nil
}
