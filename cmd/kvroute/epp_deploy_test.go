package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

// inferencePool is the Gateway API Inference Extension's InferencePool, v1
// (api/v1/inferencepool_types.go there), field for field, so that a strict
// decode rejects what the CRD's schema would.
type inferencePool struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name        string            `json:"name"`
		Namespace   string            `json:"namespace"`
		Labels      map[string]string `json:"labels,omitempty"`
		Annotations map[string]string `json:"annotations,omitempty"`
	} `json:"metadata"`
	Spec struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		TargetPorts []struct {
			Number int32 `json:"number"`
		} `json:"targetPorts"`
		AppProtocol       string `json:"appProtocol,omitempty"`
		EndpointPickerRef *struct {
			Group *string `json:"group,omitempty"`
			Kind  string  `json:"kind,omitempty"`
			Name  string  `json:"name"`
			Port  *struct {
				Number int32 `json:"number"`
			} `json:"port,omitempty"`
			FailureMode string `json:"failureMode,omitempty"`
		} `json:"endpointPickerRef,omitempty"`
	} `json:"spec"`
}

// decodeInferencePool decodes an InferencePool strictly and checks what the
// CRD's validation requires: a selector, 1 to 8 distinct ports, a picker
// reference with a port (its kind defaults to Service), a known failure
// mode.
func decodeInferencePool(doc []byte) (*inferencePool, error) {
	var p inferencePool
	if err := yaml.UnmarshalStrict(doc, &p); err != nil {
		return nil, err
	}
	s := p.Spec
	var ports []int32
	for _, tp := range s.TargetPorts {
		ports = append(ports, tp.Number)
	}
	switch {
	case p.APIVersion != "inference.networking.k8s.io/v1":
		return nil, fmt.Errorf("InferencePool %s: apiVersion %q, want inference.networking.k8s.io/v1", p.Metadata.Name, p.APIVersion)
	case len(s.Selector.MatchLabels) == 0:
		return nil, fmt.Errorf("InferencePool %s: no spec.selector.matchLabels", p.Metadata.Name)
	case len(ports) == 0 || len(ports) > 8 || len(slices.Compact(slices.Sorted(slices.Values(ports)))) != len(ports):
		return nil, fmt.Errorf("InferencePool %s: spec.targetPorts %v: want 1 to 8 distinct ports", p.Metadata.Name, ports)
	case slices.ContainsFunc(ports, func(n int32) bool { return n < 1 || n > 65535 }):
		return nil, fmt.Errorf("InferencePool %s: a target port out of range: %v", p.Metadata.Name, ports)
	case s.AppProtocol != "" && s.AppProtocol != "http" && s.AppProtocol != "kubernetes.io/h2c":
		return nil, fmt.Errorf("InferencePool %s: appProtocol %q", p.Metadata.Name, s.AppProtocol)
	}
	if r := s.EndpointPickerRef; r != nil {
		if r.Name == "" || (r.Kind == "" || r.Kind == "Service") && r.Port == nil {
			return nil, fmt.Errorf("InferencePool %s: endpointPickerRef needs a name, and a port for a Service", p.Metadata.Name)
		}
		if r.FailureMode != "" && r.FailureMode != "FailOpen" && r.FailureMode != "FailClose" {
			return nil, fmt.Errorf("InferencePool %s: failureMode %q", p.Metadata.Name, r.FailureMode)
		}
	}
	return &p, nil
}

// TestDeployEpp checks the endpoint picker's manifests (deploy/epp) against
// the example pool and model servers: the picker's args parse and name the
// pool, the pool names the picker's Service and port and selects the vLLM
// pods at their port, the probes are the picker's gRPC health services,
// and the Role grants reading pools and pods, nothing more.
func TestDeployEpp(t *testing.T) {
	m := loadManifests(t)
	dep := m.get(t, "Deployment", "kvroute-epp").(*appsv1.Deployment)
	pod := dep.Spec.Template.Spec
	c := pod.Containers[0]
	if len(c.Args) == 0 || c.Args[0] != "epp" {
		t.Fatalf("args %q, want epp first", c.Args)
	}
	cfg, err := parseEppFlags(c.Args[1:], io.Discard)
	if err != nil {
		t.Fatalf("kvroute epp refuses the Deployment's args: %v", err)
	}
	pl := cfg.discovery.pool()
	if pl == nil {
		t.Fatal("the picker is not given --pool-name")
	}
	pool, ok := m.pools[pl.Name]
	if !ok {
		t.Fatalf("no InferencePool %q under deploy/", pl.Name)
	}
	if pool.Metadata.Namespace != pl.Namespace || dep.Namespace != pl.Namespace {
		t.Errorf("pool in %q, --pool-namespace %q, picker in %q: want one namespace (its Role is namespaced)",
			pool.Metadata.Namespace, pl.Namespace, dep.Namespace)
	}
	grpcPort := containerPort(t, c, "grpc")
	if got := listenPort(t, cfg.server.GRPCListen); got != grpcPort {
		t.Errorf("--grpc-listen %s, but the grpc port is %d", cfg.server.GRPCListen, grpcPort)
	}
	if got := listenPort(t, cfg.server.MetricsListen); got != containerPort(t, c, "metrics") {
		t.Errorf("--metrics-listen %s is not the metrics port", cfg.server.MetricsListen)
	}
	if g := pod.TerminationGracePeriodSeconds; g == nil || int64(cfg.grace.Seconds())+10 > *g {
		t.Errorf("terminationGracePeriodSeconds %d, want --grace %v and 10 s more", ptrValue(g), cfg.grace)
	}
	for name, p := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		if p == nil || p.GRPC == nil || p.GRPC.Port != grpcPort || p.GRPC.Service == nil || *p.GRPC.Service != name {
			t.Errorf("%s probe %+v: want gRPC health service %q on port %d", name, p, name, grpcPort)
		}
	}

	t.Run("pool", func(t *testing.T) {
		ref := pool.Spec.EndpointPickerRef
		if ref == nil {
			t.Fatal("the pool has no endpointPickerRef")
		}
		svc := m.get(t, "Service", ref.Name).(*corev1.Service)
		if !selects(svc.Spec.Selector, dep.Spec.Template.Labels) {
			t.Errorf("Service %s does not select the picker's pods", svc.Name)
		}
		i := slices.IndexFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Port == ref.Port.Number })
		if i < 0 {
			t.Fatalf("Service %s has no port %d", svc.Name, ref.Port.Number)
		}
		if sp := svc.Spec.Ports[i]; sp.TargetPort.StrVal != "grpc" || sp.AppProtocol == nil || *sp.AppProtocol != "http2" {
			t.Errorf("Service port %+v: want targetPort grpc and appProtocol http2 (gRPC)", sp)
		}
		vllm := m.get(t, "StatefulSet", "vllm").(*appsv1.StatefulSet)
		if !selects(pool.Spec.Selector.MatchLabels, vllm.Spec.Template.Labels) {
			t.Errorf("the pool selects %v, not the vLLM pods %v", pool.Spec.Selector.MatchLabels, vllm.Spec.Template.Labels)
		}
		for _, tp := range pool.Spec.TargetPorts {
			if !slices.ContainsFunc(vllm.Spec.Template.Spec.Containers[0].Ports, func(p corev1.ContainerPort) bool { return p.ContainerPort == tp.Number }) {
				t.Errorf("target port %d is not a vLLM container port", tp.Number)
			}
		}
		if selects(pool.Spec.Selector.MatchLabels, dep.Spec.Template.Labels) {
			t.Error("the pool selects the picker's own pods")
		}
	})

	t.Run("rbac", func(t *testing.T) {
		m.get(t, "ServiceAccount", pod.ServiceAccountName)
		var bound bool
		for _, o := range m.objects {
			rb, ok := o.(*rbacv1.RoleBinding)
			if !ok || !slices.ContainsFunc(rb.Subjects, func(s rbacv1.Subject) bool {
				return s.Kind == "ServiceAccount" && s.Name == pod.ServiceAccountName && s.Namespace == dep.Namespace
			}) {
				continue
			}
			bound = true
			if rb.RoleRef.Kind != "Role" {
				t.Errorf("%s binds a %s, want a namespaced Role", rb.Name, rb.RoleRef.Kind)
			}
			role := m.get(t, "Role", rb.RoleRef.Name).(*rbacv1.Role)
			granted := map[string]bool{}
			for _, r := range role.Rules {
				if !slices.Equal(r.Verbs, []string{"get", "list", "watch"}) {
					t.Errorf("rule %+v: read-only verbs only", r)
				}
				for _, g := range r.APIGroups {
					for _, res := range r.Resources {
						granted[g+"/"+res] = true
					}
				}
			}
			want := map[string]bool{"inference.networking.k8s.io/inferencepools": true, "/pods": true}
			if !maps.Equal(granted, want) {
				t.Errorf("Role %s grants %v, want exactly %v", role.Name, granted, want)
			}
		}
		if !bound {
			t.Errorf("no RoleBinding for service account %s", pod.ServiceAccountName)
		}
	})
}
