package emulator

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/openai"
)

// LoRAModule is an adapter served from the start, as vLLM's
// --lora-modules name=path.
type LoRAModule struct {
	Name, Path string
}

// ParseLoRAModule reads vLLM's name=path form.
func ParseLoRAModule(s string) (LoRAModule, error) {
	name, path, ok := strings.Cut(s, "=")
	if !ok || name == "" || path == "" {
		return LoRAModule{}, fmt.Errorf("lora module %q: want name=path", s)
	}
	return LoRAModule{Name: name, Path: path}, nil
}

// adapters are the LoRA adapters a server has registered, by name, with the
// engine's number for each (1, 2, …, never reused, as vLLM's lora_int_id).
type adapters struct {
	mu    sync.Mutex
	ids   map[string]int32
	paths map[string]string
	order []string // names in order of registration, for /v1/models
	next  int32
	max   int // max_loras, for the metric
}

// setLoRA turns adapters on in s's engine and registers cfg's modules,
// which vLLM loads at start (into the CPU cache).
func (s *Server) setLoRA(l engine.LoRA, modules []LoRAModule) error {
	if err := s.eng.SetLoRA(l); err != nil {
		return fmt.Errorf("emulator: %w", err)
	}
	s.lora = &adapters{ids: map[string]int32{}, paths: map[string]string{}, max: l.MaxLoRAs}
	for _, m := range modules {
		if e := s.loadAdapter(m.Name, m.Path, false); e != nil {
			return fmt.Errorf("emulator: lora module %s: %s", m.Name, e.Message)
		}
	}
	return nil
}

// adapter returns the engine's number for the adapter called name, 0 when
// none is registered.
func (s *Server) adapter(name string) int32 {
	if s.lora == nil {
		return 0
	}
	s.lora.mu.Lock()
	defer s.lora.mu.Unlock()
	return s.lora.ids[name]
}

// runUnder makes c a request for the adapter called name ("": the base
// model): the engine runs it under the adapter and keys its blocks by it.
func (s *Server) runUnder(c *call, name string) {
	if name == "" {
		return
	}
	c.req.Adapter = s.adapter(name)
	engine.SeedHashes(c.req.BlockHashes, engine.AdapterSeed(name))
}

// loadAdapter registers name at path and loads it into the CPU cache, as
// vLLM's /v1/load_lora_adapter does; inplace replaces one already there.
func (s *Server) loadAdapter(name, path string, inplace bool) *openai.Error {
	if name == "" || path == "" {
		return badRequest("", "Both 'lora_name' and 'lora_path' must be provided.")
	}
	if name == s.model {
		return badRequest("lora_name", "The lora adapter '%s' has the base model's name.", name)
	}
	a := s.lora
	a.mu.Lock()
	id, ok := a.ids[name]
	if ok && !inplace {
		a.mu.Unlock()
		return badRequest("", "The lora adapter '%s' has already been loaded. If you want to load the adapter in place, set 'load_inplace' to True.", name)
	}
	if !ok {
		a.next++
		id = a.next
		a.ids[name] = id
		a.order = append(a.order, name)
	}
	a.paths[name] = path
	a.mu.Unlock()
	s.mu.Lock()
	s.eng.LoadAdapter(id)
	s.mu.Unlock()
	s.log.Info("loaded LoRA adapter", "name", name, "path", path)
	return nil
}

// unloadAdapter unregisters name and drops it from the engine's caches.
func (s *Server) unloadAdapter(name string) *openai.Error {
	if name == "" {
		return badRequest("", "'lora_name' needs to be provided to unload a LoRA adapter.")
	}
	a := s.lora
	a.mu.Lock()
	id, ok := a.ids[name]
	if ok {
		delete(a.ids, name)
		delete(a.paths, name)
		a.order = slices.DeleteFunc(a.order, func(n string) bool { return n == name })
	}
	a.mu.Unlock()
	if !ok {
		return &openai.Error{Status: http.StatusNotFound, Message: fmt.Sprintf("The lora adapter '%s' cannot be found.", name),
			Type: openai.TypeInvalidRequest, Param: "lora_name", Code: "not_found"}
	}
	s.mu.Lock()
	s.eng.UnloadAdapter(id)
	s.mu.Unlock()
	s.log.Info("removed LoRA adapter", "name", name)
	return nil
}

// handleLoadAdapter serves POST /v1/load_lora_adapter
// ({"lora_name", "lora_path", "load_inplace"}); vLLM answers success as
// plain text.
func (s *Server) handleLoadAdapter(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Name    string `json:"lora_name"`
		Path    string `json:"lora_path"`
		Inplace bool   `json:"load_inplace"`
	}
	if e := decodeBody(w, r, &req); e != nil {
		writeError(w, e)
		return
	}
	if e := s.loadAdapter(req.Name, req.Path, req.Inplace); e != nil {
		writeError(w, e)
		return
	}
	writeText(w, fmt.Sprintf("Success: LoRA adapter '%s' added successfully.", req.Name))
}

// handleUnloadAdapter serves POST /v1/unload_lora_adapter ({"lora_name"}).
func (s *Server) handleUnloadAdapter(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Name string `json:"lora_name"`
	}
	if e := decodeBody(w, r, &req); e != nil {
		writeError(w, e)
		return
	}
	if e := s.unloadAdapter(req.Name); e != nil {
		writeError(w, e)
		return
	}
	writeText(w, fmt.Sprintf("Success: LoRA adapter '%s' removed successfully.", req.Name))
}

func writeText(w http.ResponseWriter, text string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write([]byte(text))
}

// adapterCards are the adapters' /v1/models entries: each names the base
// model as its parent and its path as its root, as vLLM lists them.
func (s *Server) adapterCards() []modelCard {
	if s.lora == nil {
		return nil
	}
	a := s.lora
	a.mu.Lock()
	defer a.mu.Unlock()
	cards := make([]modelCard, 0, len(a.order))
	for _, name := range a.order {
		parent := s.model
		cards = append(cards, modelCard{ID: name, Object: "model", Created: s.created, OwnedBy: "vllm",
			Root: a.paths[name], Parent: &parent})
	}
	return cards
}

// loraCollector exports vllm:lora_requests_info as vLLM does: one series
// whose labels list the adapters of the running and the waiting requests
// (comma-separated) and max_lora, valued at the time it was read (Unix
// seconds); and the emulator's own count of adapters loaded from storage.
type loraCollector struct {
	s           *Server
	info, loads *prometheus.Desc
}

func newLoRACollector(s *Server) *loraCollector {
	model := prometheus.Labels{"model_name": s.model}
	return &loraCollector{
		s: s,
		info: prometheus.NewDesc("vllm:lora_requests_info", "Running stats on lora requests.",
			[]string{"max_lora", "running_lora_adapters", "waiting_lora_adapters"}, nil),
		loads: prometheus.NewDesc("kvroute_emulator_lora_loads_total",
			"LoRA adapters loaded from storage (emulator only, not a vLLM metric).", nil, model),
	}
}

// Describe implements prometheus.Collector.
func (c *loraCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.info; ch <- c.loads }

// Collect implements prometheus.Collector: nothing while LoRA is off.
func (c *loraCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	if s.lora == nil {
		return
	}
	s.mu.Lock()
	run, wait := s.eng.Adapters(nil, nil)
	loads := s.eng.Stats().LoRALoads
	s.mu.Unlock()
	names := func(ids []int32) string {
		s.lora.mu.Lock()
		defer s.lora.mu.Unlock()
		out := make([]string, 0, len(ids))
		for _, id := range ids {
			for name, x := range s.lora.ids {
				if x == id {
					out = append(out, name)
				}
			}
		}
		return strings.Join(out, ",")
	}
	at := float64(s.clock.Now().UnixNano()) / 1e9
	ch <- prometheus.MustNewConstMetric(c.info, prometheus.GaugeValue, at,
		strconv.Itoa(s.lora.max), names(run), names(wait))
	ch <- prometheus.MustNewConstMetric(c.loads, prometheus.CounterValue, float64(loads))
}
