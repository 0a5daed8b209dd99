package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/util/intstr"
	kyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// deployDir holds the Kubernetes manifests, from cmd/kvroute.
const deployDir = "../../deploy"

// manifests are the objects of every YAML document under deploy/, by kind
// and name; ServiceMonitors, whose types are not Kubernetes', as maps.
type manifests struct {
	objects  map[string]runtime.Object // "Kind/name"
	monitors map[string]map[string]any // name
	pools    map[string]*inferencePool // name (epp_deploy_test.go)
	files    map[string]bool           // manifest files, relative to deploy/
}

func (m *manifests) get(t *testing.T, kind, name string) runtime.Object {
	t.Helper()
	o, ok := m.objects[kind+"/"+name]
	if !ok {
		t.Fatalf("no %s %q under deploy/", kind, name)
	}
	return o
}

// loadManifests decodes every document of every YAML file under deploy/
// with the Kubernetes API types, strictly: an unknown or duplicated field,
// or a field in the wrong case, is an error.
func loadManifests(t *testing.T) *manifests {
	t.Helper()
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme, rbacv1.AddToScheme, policyv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	strict := kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, scheme, scheme, kjson.SerializerOptions{Yaml: true, Strict: true})
	m := &manifests{objects: map[string]runtime.Object{}, monitors: map[string]map[string]any{}, pools: map[string]*inferencePool{}, files: map[string]bool{}}
	err := filepath.WalkDir(deployDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".yaml") || d.Name() == "kustomization.yaml" {
			return err
		}
		rel, _ := filepath.Rel(deployDir, path)
		m.files[rel] = true
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		r := kyaml.NewYAMLReader(bufio.NewReader(f))
		for n := 1; ; n++ {
			doc, err := r.Read()
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				return err
			}
			if len(bytes.TrimSpace(stripComments(doc))) == 0 {
				continue
			}
			obj, gvk, err := strict.Decode(doc, nil, nil)
			switch {
			case runtime.IsNotRegisteredError(err) && gvk != nil && gvk.Group == "monitoring.coreos.com" && gvk.Kind == "ServiceMonitor":
				var sm map[string]any
				if err := yaml.UnmarshalStrict(doc, &sm); err != nil {
					t.Errorf("%s #%d: %v", rel, n, err)
					continue
				}
				checkServiceMonitor(t, rel, sm)
				m.monitors[str(sm, "metadata", "name")] = sm
				continue
			case runtime.IsNotRegisteredError(err) && gvk != nil && gvk.Group == "inference.networking.k8s.io" && gvk.Kind == "InferencePool":
				if p, err := decodeInferencePool(doc); err != nil {
					t.Errorf("%s #%d: %v", rel, n, err)
				} else {
					m.pools[p.Metadata.Name] = p
				}
				continue
			case err != nil:
				t.Errorf("%s #%d: %v", rel, n, err)
				continue
			}
			acc, ok := obj.(interface {
				GetName() string
				GetNamespace() string
			})
			if !ok || acc.GetName() == "" {
				t.Errorf("%s #%d: a %s without a name", rel, n, gvk.Kind)
				continue
			}
			if gvk.Kind != "Namespace" && acc.GetNamespace() != "kvroute" {
				t.Errorf("%s #%d: %s %s is in namespace %q, want kvroute", rel, n, gvk.Kind, acc.GetName(), acc.GetNamespace())
			}
			key := gvk.Kind + "/" + acc.GetName()
			if _, dup := m.objects[key]; dup {
				t.Errorf("%s: %s defined twice", rel, key)
			}
			m.objects[key] = obj
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// stripComments drops the comment lines of a YAML document.
func stripComments(doc []byte) []byte {
	var out []byte
	for line := range bytes.Lines(doc) {
		if !bytes.HasPrefix(bytes.TrimSpace(line), []byte("#")) {
			out = append(out, line...)
		}
	}
	return out
}

// str reads a string at path in a decoded YAML map, "" if absent.
func str(m map[string]any, path ...string) string {
	var v any = m
	for _, k := range path {
		mm, ok := v.(map[string]any)
		if !ok {
			return ""
		}
		v = mm[k]
	}
	s, _ := v.(string)
	return s
}

// checkServiceMonitor checks the fields of a ServiceMonitor that the
// Prometheus Operator needs: a name, a selector and endpoints with a port.
func checkServiceMonitor(t *testing.T, file string, sm map[string]any) {
	t.Helper()
	if str(sm, "apiVersion") != "monitoring.coreos.com/v1" || str(sm, "metadata", "name") == "" || str(sm, "metadata", "namespace") == "" {
		t.Errorf("%s: ServiceMonitor needs apiVersion monitoring.coreos.com/v1, a name and a namespace", file)
	}
	spec, _ := sm["spec"].(map[string]any)
	for k := range spec {
		if !slices.Contains([]string{"selector", "namespaceSelector", "endpoints", "jobLabel"}, k) {
			t.Errorf("%s: ServiceMonitor spec has unexpected field %q", file, k)
		}
	}
	if sel, _ := spec["selector"].(map[string]any); len(sel) == 0 {
		t.Errorf("%s: ServiceMonitor without a selector", file)
	}
	eps, _ := spec["endpoints"].([]any)
	if len(eps) == 0 {
		t.Errorf("%s: ServiceMonitor without endpoints", file)
	}
	for _, e := range eps {
		em, _ := e.(map[string]any)
		for k := range em {
			if !slices.Contains([]string{"port", "path", "interval", "scrapeTimeout", "scheme"}, k) {
				t.Errorf("%s: ServiceMonitor endpoint has unexpected field %q", file, k)
			}
		}
		if str(em, "port") == "" {
			t.Errorf("%s: ServiceMonitor endpoint without a port name", file)
		}
	}
}

// selects reports whether selector (equality only) selects lbls.
func selects(selector, lbls map[string]string) bool {
	return len(selector) > 0 && labels.SelectorFromSet(selector).Matches(labels.Set(lbls))
}

// portDeclared reports whether p names or numbers one of the ports.
func portDeclared(p intstr.IntOrString, ports []corev1.ContainerPort) bool {
	return slices.ContainsFunc(ports, func(cp corev1.ContainerPort) bool {
		if p.Type == intstr.String {
			return cp.Name == p.StrVal
		}
		return cp.ContainerPort == p.IntVal
	})
}

func containerPort(t *testing.T, c corev1.Container, name string) int32 {
	t.Helper()
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	t.Fatalf("container %s has no port %q", c.Name, name)
	return 0
}

func listenPort(t *testing.T, addr string) int32 {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(port)
	return int32(n)
}

func TestDeployManifests(t *testing.T) {
	m := loadManifests(t)
	dep := m.get(t, "Deployment", "kvroute").(*appsv1.Deployment)
	pod := dep.Spec.Template.Spec
	podLabels := dep.Spec.Template.Labels

	t.Run("deployment", func(t *testing.T) {
		if dep.Spec.Selector == nil || !selects(dep.Spec.Selector.MatchLabels, podLabels) {
			t.Errorf("the Deployment's selector %v does not select its pods %v", dep.Spec.Selector, podLabels)
		}
		if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 2 {
			t.Errorf("replicas %v, want 2", dep.Spec.Replicas)
		}
		m.get(t, "ServiceAccount", pod.ServiceAccountName)
		if len(pod.Containers) != 1 {
			t.Fatalf("%d containers, want 1", len(pod.Containers))
		}
		c := pod.Containers[0]
		psc, sc := pod.SecurityContext, c.SecurityContext
		if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser != 65532 {
			t.Error("the pod must run as non-root user 65532, the image's")
		}
		if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
			sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
			sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
			t.Error("the container must have a read-only root filesystem, no privilege escalation and drop ALL capabilities")
		}
		if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
			t.Error("the container needs CPU and memory requests and a memory limit")
		}
		for name, p := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
			if p == nil || p.HTTPGet == nil {
				t.Errorf("no HTTP %s probe", name)
				continue
			}
			if !portDeclared(p.HTTPGet.Port, c.Ports) {
				t.Errorf("the %s probe's port %s is not a container port", name, p.HTTPGet.Port.String())
			}
		}
		if p := c.ReadinessProbe; p != nil && p.HTTPGet != nil && (p.HTTPGet.Path != "/readyz" || p.HTTPGet.Port.StrVal != "http") {
			t.Errorf("readiness probe %s on %s, want /readyz on the API port", p.HTTPGet.Path, p.HTTPGet.Port.String())
		}
		if p := c.LivenessProbe; p != nil && p.HTTPGet != nil && (p.HTTPGet.Path != "/healthz" || p.HTTPGet.Port.StrVal != "metrics") {
			t.Errorf("liveness probe %s on %s, want /healthz on the metrics port", p.HTTPGet.Path, p.HTTPGet.Port.String())
		}
		for _, vm := range c.VolumeMounts {
			i := slices.IndexFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == vm.Name })
			if i < 0 {
				t.Errorf("volume mount %s has no volume", vm.Name)
			} else if cm := pod.Volumes[i].ConfigMap; cm != nil {
				m.get(t, "ConfigMap", cm.Name)
			}
		}
	})

	t.Run("config parsed by kvroute serve", func(t *testing.T) {
		c := pod.Containers[0]
		if len(c.Args) == 0 || c.Args[0] != "serve" {
			t.Fatalf("args %q, want serve first", c.Args)
		}
		// The args as the pod runs them, with the ConfigMap's file where
		// the pod mounts it.
		args := slices.Clone(c.Args[1:])
		i := slices.Index(args, "--config")
		if i < 0 || i+1 == len(args) {
			t.Fatalf("args %q lack --config", args)
		}
		dir, file := filepath.Split(args[i+1])
		var cm *corev1.ConfigMap
		for _, vm := range c.VolumeMounts {
			if filepath.Clean(vm.MountPath) == filepath.Clean(dir) {
				v := pod.Volumes[slices.IndexFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == vm.Name })]
				cm = m.get(t, "ConfigMap", v.ConfigMap.Name).(*corev1.ConfigMap)
			}
		}
		if cm == nil || cm.Data[file] == "" {
			t.Fatalf("--config %s: no ConfigMap mounted there with the key %q", args[i+1], file)
		}
		args[i+1] = filepath.Join(t.TempDir(), file)
		if err := os.WriteFile(args[i+1], []byte(cm.Data[file]), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := parseServeFlags(args, io.Discard)
		if err != nil {
			t.Fatalf("kvroute serve refuses the Deployment's args and ConfigMap: %v", err)
		}
		if len(cfg.backends) == 0 {
			t.Error("the config lists no backends")
		}
		if got := cfg.policyOpts.KVRoute.Replicas; dep.Spec.Replicas == nil || int32(got) != *dep.Spec.Replicas {
			t.Errorf("the config says replicas: %d, the Deployment runs %d", got, ptrValue(dep.Spec.Replicas))
		}
		if got, want := listenPort(t, cfg.listen), containerPort(t, c, "http"); got != want {
			t.Errorf("--listen %s, but the http port is %d", cfg.listen, want)
		}
		if got, want := listenPort(t, cfg.security.metricsListen), containerPort(t, c, "metrics"); got != want {
			t.Errorf("--metrics-listen %s, but the metrics port is %d", cfg.security.metricsListen, want)
		}
		if cfg.logFormat != logJSON {
			t.Errorf("log format %q, want json in a cluster", cfg.logFormat)
		}
		// SIGKILL must not come before the drain delay and the grace are
		// over, with a margin for the last error events (up to 5 s after
		// the grace: server.Shutdown) and the exit.
		const margin = 10 * time.Second
		need := cfg.server.DrainDelay + cfg.server.Grace + margin
		if g := pod.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second < need {
			t.Errorf("terminationGracePeriodSeconds %d, want at least %v (drain delay %v + grace %v + %v)",
				ptrValue(g), need, cfg.server.DrainDelay, cfg.server.Grace, margin)
		}
	})

	t.Run("services", func(t *testing.T) {
		c := pod.Containers[0]
		for _, name := range []string{"kvroute", "kvroute-metrics"} {
			svc := m.get(t, "Service", name).(*corev1.Service)
			if !selects(svc.Spec.Selector, podLabels) {
				t.Errorf("Service %s selects %v, not the Deployment's pods %v", name, svc.Spec.Selector, podLabels)
			}
			for _, p := range svc.Spec.Ports {
				if !portDeclared(p.TargetPort, c.Ports) {
					t.Errorf("Service %s targets port %s, which the container does not declare", name, p.TargetPort.String())
				}
			}
		}
		if svc := m.get(t, "Service", "kvroute").(*corev1.Service); slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool {
			return p.TargetPort.StrVal == "metrics"
		}) {
			t.Error("the API Service exposes the metrics port")
		}
	})

	t.Run("rbac", func(t *testing.T) {
		rb := m.get(t, "RoleBinding", "kvroute-discovery").(*rbacv1.RoleBinding)
		if rb.RoleRef.Kind != "Role" {
			t.Errorf("the binding refers to a %s, want a namespaced Role", rb.RoleRef.Kind)
		}
		role := m.get(t, "Role", rb.RoleRef.Name).(*rbacv1.Role)
		for _, s := range rb.Subjects {
			if s.Kind != "ServiceAccount" || s.Name != pod.ServiceAccountName || s.Namespace != dep.Namespace {
				t.Errorf("binding subject %+v is not the Deployment's service account", s)
			}
		}
		for _, r := range role.Rules {
			if !slices.Equal(r.Verbs, []string{"get", "list", "watch"}) {
				t.Errorf("rule %+v: read-only verbs only", r)
			}
			for _, res := range r.Resources {
				if res != "endpointslices" && res != "pods" {
					t.Errorf("rule %+v grants %s: only endpointslices and pods are needed", r, res)
				}
			}
		}
	})

	t.Run("disruption budget", func(t *testing.T) {
		pdb := m.get(t, "PodDisruptionBudget", "kvroute").(*policyv1.PodDisruptionBudget)
		if pdb.Spec.Selector == nil || !selects(pdb.Spec.Selector.MatchLabels, podLabels) {
			t.Errorf("the PDB's selector %v does not select the Deployment's pods", pdb.Spec.Selector)
		}
		if pdb.Spec.MaxUnavailable == nil && pdb.Spec.MinAvailable == nil {
			t.Error("the PDB sets neither maxUnavailable nor minAvailable")
		}
	})

	t.Run("service monitor", func(t *testing.T) {
		sm, ok := m.monitors["kvroute"]
		if !ok {
			t.Fatal("no ServiceMonitor kvroute")
		}
		sel := map[string]string{}
		if ml, ok := sm["spec"].(map[string]any)["selector"].(map[string]any)["matchLabels"].(map[string]any); ok {
			for k, v := range ml {
				sel[k], _ = v.(string)
			}
		}
		svc := m.get(t, "Service", "kvroute-metrics").(*corev1.Service)
		if !selects(sel, svc.Labels) {
			t.Errorf("the ServiceMonitor selects %v, not the metrics Service's labels %v", sel, svc.Labels)
		}
		for _, e := range sm["spec"].(map[string]any)["endpoints"].([]any) {
			port := str(e.(map[string]any), "port")
			if !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == port }) {
				t.Errorf("the ServiceMonitor scrapes port %q, which Service kvroute-metrics lacks", port)
			}
		}
	})

	t.Run("kustomizations", func(t *testing.T) {
		listed := map[string]bool{}
		for _, dir := range []string{".", "monitoring", "epp"} {
			data, err := os.ReadFile(filepath.Join(deployDir, dir, "kustomization.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			var k struct {
				APIVersion string   `json:"apiVersion"`
				Kind       string   `json:"kind"`
				Namespace  string   `json:"namespace"`
				Resources  []string `json:"resources"`
			}
			if err := yaml.UnmarshalStrict(data, &k); err != nil {
				t.Fatalf("%s/kustomization.yaml: %v", dir, err)
			}
			if k.Kind != "Kustomization" || k.Namespace != "kvroute" {
				t.Errorf("%s/kustomization.yaml: kind %q namespace %q", dir, k.Kind, k.Namespace)
			}
			for _, r := range k.Resources {
				p := filepath.Join(dir, r)
				if fi, err := os.Stat(filepath.Join(deployDir, p)); err != nil {
					t.Errorf("%s/kustomization.yaml lists %s: %v", dir, r, err)
				} else if !fi.IsDir() {
					listed[filepath.Clean(p)] = true
				}
			}
		}
		for f := range m.files {
			if !listed[f] && !strings.HasPrefix(f, "examples"+string(filepath.Separator)) {
				t.Errorf("%s is in no kustomization", f)
			}
		}
	})
}

// ptrValue is *p, or 0 for nil.
func ptrValue[T any](p *T) T {
	var v T
	if p != nil {
		v = *p
	}
	return v
}

// promNames finds the kvroute metric names in a PromQL expression.
var promNames = regexp.MustCompile(`\bkvroute_[a-z0-9_]+`)

func TestGrafanaDashboard(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(deployDir, "grafana", "kvroute.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string `json:"title"`
		UID    string `json:"uid"`
		Panels []struct {
			ID      int    `json:"id"`
			Type    string `json:"type"`
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatal(err)
	}
	if dash.Title == "" || dash.UID == "" || len(dash.Panels) == 0 {
		t.Fatal("the dashboard needs a title, a uid and panels")
	}
	src := goSources(t)
	used := map[string]bool{}
	ids := map[int]bool{}
	for _, p := range dash.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			if strings.Count(tg.Expr, "(") != strings.Count(tg.Expr, ")") {
				t.Errorf("panel %q: unbalanced parentheses in %s", p.Title, tg.Expr)
			}
			for _, name := range promNames.FindAllString(tg.Expr, -1) {
				base := name
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if b, ok := strings.CutSuffix(name, suffix); ok && strings.Contains(src, `"`+b+`"`) {
						base = b
					}
				}
				if !strings.Contains(src, `"`+base+`"`) {
					t.Errorf("panel %q queries %s, which no Go source under internal/ defines", p.Title, name)
				}
				used[base] = true
			}
		}
	}
	// The panels the operations doc promises.
	for _, want := range []string{"kvroute_requests_total", "kvroute_ttft_seconds", "kvroute_e2e_seconds", "kvroute_decision_seconds",
		"kvroute_inflight_requests", "kvroute_predicted_cached_tokens_total", "kvroute_reported_cached_tokens_total",
		"kvroute_retries_total", "kvroute_timeouts_total", "kvroute_responses_cut_total", "kvroute_backend_up",
		"kvroute_backend_ejections_total", "kvroute_admission_queue_length", "kvroute_admission_rejected_total",
		"kvroute_deadline_refused_total"} {
		if !used[want] {
			t.Errorf("no panel queries %s", want)
		}
	}
}

// goSources returns the non-test Go sources under internal/, concatenated.
func goSources(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir("../../internal", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		data, err := os.ReadFile(path)
		b.Write(data)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}
