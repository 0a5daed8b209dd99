package discovery

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kvroute/kvroute/internal/fleet"
)

// k8sWatch is a source that client-go informers keep current: a Service's
// EndpointSlices (kubernetes.go) or an InferencePool and its pods
// (pool.go). Its informers signal every change on the channel Discovery
// gave it; backends then reads their caches, which costs no API call.
type k8sWatch interface {
	fmt.Stringer
	start()
	close()
	// waitSynced waits for the informers' first lists, within the
	// source's SyncTimeout and ctx.
	waitSynced(ctx context.Context) error
	backends(apiKey fleet.Secret) ([]*fleet.Backend, error)
}

// informers runs a source's informers: started once, stopped once, and
// waited for.
type informers struct {
	startOnce, stopOnce sync.Once
	stop                chan struct{}
	wg                  sync.WaitGroup
	run                 []cache.SharedIndexInformer
	handlerErr          error // adding an event handler failed
}

func newInformers() informers { return informers{stop: make(chan struct{})} }

// watch adds inf to the informers to run, signalling changed (without
// blocking) on every add, update and delete it sees.
func (s *informers) watch(inf cache.SharedIndexInformer, changed chan struct{}) {
	s.run = append(s.run, inf)
	notify := func(any) {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    notify,
		UpdateFunc: func(_, obj any) { notify(obj) },
		DeleteFunc: notify,
	})
	s.handlerErr = errors.Join(s.handlerErr, err)
}

// waitSynced waits for every informer's first list, within timeout and
// ctx; what names the source in the error.
func (s *informers) waitSynced(ctx context.Context, timeout time.Duration, what fmt.Stringer) error {
	if s.handlerErr != nil {
		return s.handlerErr
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	synced := make([]cache.InformerSynced, len(s.run))
	for i, inf := range s.run {
		synced[i] = inf.HasSynced
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return fmt.Errorf("kubernetes: %s not listed within %v", what, timeout)
	}
	return nil
}

// start starts the informers once.
func (s *informers) start() {
	s.startOnce.Do(func() {
		for _, inf := range s.run {
			s.wg.Go(func() { inf.Run(s.stop) })
		}
	})
}

// close stops the informers and waits for their goroutines.
func (s *informers) close() {
	s.stopOnce.Do(func() {
		close(s.stop)
		s.wg.Wait()
	})
}

// restConfig is the API server's address and credentials: from a
// kubeconfig file, or the pod's service account when empty.
func restConfig(kubeconfig string) (*rest.Config, error) {
	var rc *rest.Config
	var err error
	if kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes config: %w", err)
	}
	rc.UserAgent = "kvroute"
	return rc, nil
}

// readK8s re-reads every Kubernetes source's caches into the Kubernetes
// part of the set. A source that reports an error keeps what it could
// read; the error is logged on the transition only.
func (d *Discovery) readK8s() error {
	var errs []error
	for i, w := range d.k8s {
		bs, err := w.backends(d.cfg.APIKey)
		d.mu.Lock()
		d.k8sBackend[i] = bs
		first := err != nil && !d.k8sFailing[i]
		again := err == nil && d.k8sFailing[i]
		d.k8sFailing[i] = err != nil
		d.mu.Unlock()
		if first {
			d.log.Warn("discovery: some Kubernetes endpoints skipped", "source", w.String(), "err", err)
		} else if again {
			d.log.Info("discovery: Kubernetes endpoints all usable again", "source", w.String())
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// resolveK8s starts the informers if needed, waits for their first lists
// and reads them.
func (d *Discovery) resolveK8s(ctx context.Context) error {
	var errs []error
	for _, w := range d.k8s {
		w.start()
		errs = append(errs, w.waitSynced(ctx))
	}
	return errors.Join(append(errs, d.readK8s())...)
}

// startK8s starts every Kubernetes source's informers (once).
func (d *Discovery) startK8s() {
	for _, w := range d.k8s {
		w.start()
	}
}

// Close stops what Resolve or Run started (the Kubernetes informers). Run
// calls it when its ctx ends; call it after a Resolve that no Run follows.
func (d *Discovery) Close() {
	for _, w := range d.k8s {
		w.close()
	}
}

// k8sBackends is the Kubernetes sources' part of the set, in source order.
// The caller holds d.mu.
func (d *Discovery) k8sBackends() []*fleet.Backend {
	return slices.Concat(d.k8sBackend...)
}
