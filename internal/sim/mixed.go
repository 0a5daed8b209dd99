package sim

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/results"
)

// A mixed fleet (Config.Servers) runs each server on its own profile: two
// GPU generations of one model, or several models. The router is told only
// what a live one learns from /v1/models and vllm:cache_config_info: each
// server's model and KV capacity, never its GPU.

// serverProfile is server i's engine profile.
func (c *Config) serverProfile(i int) engine.Profile {
	if c.Servers != nil {
		return c.Servers[i]
	}
	return c.Profile
}

// checkMixed validates a mixed fleet against the workload: one profile per
// server, one block size, and a server for every model a session names.
func (c *Config) checkMixed() error {
	if c.Servers == nil {
		return nil
	}
	if len(c.Servers) != c.Backends {
		return fmt.Errorf("sim: %d server profiles for %d backends", len(c.Servers), c.Backends)
	}
	served := map[string]bool{}
	for _, p := range c.Servers {
		if p.BlockSize != c.Profile.BlockSize {
			return fmt.Errorf("sim: server profile %s has blocks of %d tokens, the fleet %d", p.Name, p.BlockSize, c.Profile.BlockSize)
		}
		served[p.Model] = true
	}
	for i := range c.Workload.Sessions {
		if m := c.Workload.Sessions[i].Model; m != "" && !served[m] {
			return fmt.Errorf("sim: session %s asks for model %s, which no server serves", c.Workload.Sessions[i].ID, m)
		}
	}
	return nil
}

// Models returns the models a fleet serves, in the order of their first
// server, with the number of servers serving each.
func Models(servers []engine.Profile) (models []string, counts []int) {
	for _, p := range servers {
		i := slices.Index(models, p.Model)
		if i < 0 {
			models, counts = append(models, p.Model), append(counts, 0)
			i = len(models) - 1
		}
		counts[i]++
	}
	return models, counts
}

// serverInfos returns what each server tells the routers of itself.
func serverInfos(cfg *Config) []*fleet.Info {
	infos := make([]*fleet.Info, cfg.Backends)
	byName := map[string]*fleet.Info{}
	for i := range infos {
		p := cfg.serverProfile(i)
		key := p.Name + "\x00" + p.Model
		if byName[key] == nil {
			byName[key] = &fleet.Info{Models: []string{p.Model}, BlockSize: p.BlockSize, KVBlocks: p.Blocks()}
		}
		infos[i] = byName[key]
	}
	return infos
}

// servingModels returns a replica's backends grouped by the model they
// serve, as fleet.Candidates filters them; nil for a fleet of one model.
func servingModels(cfg *Config, backends []*fleet.Backend) map[string][]*fleet.Backend {
	if cfg.Servers == nil {
		return nil
	}
	by := map[string][]*fleet.Backend{}
	for i, b := range backends {
		m := cfg.Servers[i].Model
		by[m] = append(by[m], b)
	}
	if len(by) == 1 {
		return nil
	}
	return by
}

// candidates returns the replica's backends serving model.
func (r *replica) candidates(model string) []*fleet.Backend {
	if r.serving == nil {
		return r.backends
	}
	return r.serving[model]
}

// model is the model a session's requests name.
func (s *simulation) model(model string) string {
	if model != "" {
		return model
	}
	return s.cfg.Profile.Model
}

// KindShare is what one kind of server (a profile and its model) did in a
// run: its servers, and their shares of the requests and prompt tokens.
type KindShare struct {
	Kind            string
	Servers         int
	Requests        float64 // share of the run's completed requests
	PromptTokens    float64 // share of the prompt tokens the servers computed or reused
	PromptPerServer float64 // prompt tokens per server over the mean per server
}

// Kinds returns each run's shares per kind of server, in the order of
// servers (nil for a fleet of one kind). Request shares come from the
// requests the run kept (an even sample beyond Config.KeepRequests).
func Kinds(cfg Config, run *results.Run) []KindShare {
	if cfg.Servers == nil {
		return nil
	}
	var kinds []KindShare
	of := make([]int, len(cfg.Servers))
	for i, p := range cfg.Servers {
		k := p.Name
		if p.Model != cfg.Servers[0].Model || modelsDiffer(cfg.Servers) {
			k = p.Name + " (" + p.Model + ")"
		}
		j := slices.IndexFunc(kinds, func(ks KindShare) bool { return ks.Kind == k })
		if j < 0 {
			kinds = append(kinds, KindShare{Kind: k})
			j = len(kinds) - 1
		}
		kinds[j].Servers++
		of[i] = j
	}
	if len(kinds) == 1 {
		return nil
	}
	var reqs int
	for _, r := range run.Requests {
		i, ok := serverIndex(r.Backend)
		if !ok || i >= len(of) || r.Status != 200 {
			continue
		}
		kinds[of[i]].Requests++
		reqs++
	}
	var prompt float64
	for i, b := range run.Backends {
		if i < len(of) {
			kinds[of[i]].PromptTokens += float64(b.PromptTokens)
			prompt += float64(b.PromptTokens)
		}
	}
	for j := range kinds {
		if reqs > 0 {
			kinds[j].Requests /= float64(reqs)
		}
		if prompt > 0 {
			kinds[j].PromptPerServer = kinds[j].PromptTokens / prompt * float64(len(cfg.Servers)) / float64(kinds[j].Servers)
			kinds[j].PromptTokens /= prompt
		}
	}
	return kinds
}

func modelsDiffer(servers []engine.Profile) bool {
	ms, _ := Models(servers)
	return len(ms) > 1
}

// serverIndex reads the index of a simulated server's name ("gpu12").
func serverIndex(name string) (int, bool) {
	n, ok := strings.CutPrefix(name, "gpu")
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(n)
	return i, err == nil
}

// WriteKinds writes, for a mixed fleet, the share of the work each kind of
// server took under each policy: requests and prompt tokens, and prompt
// tokens per server against the fleet's mean (1.00: an even share).
func WriteKinds(w io.Writer, cfg Config, rep *results.Report) {
	if cfg.Servers == nil || len(rep.Runs) == 0 || Kinds(cfg, &rep.Runs[0]) == nil {
		return
	}
	fmt.Fprintf(w, "\nwork by kind of server (share of requests / of prompt tokens / prompt tokens per server over the mean)\n")
	kinds := Kinds(cfg, &rep.Runs[0])
	names := make([]string, len(kinds))
	for j, k := range kinds {
		names[j] = fmt.Sprintf("%s ×%d", k.Kind, k.Servers)
	}
	width := 0
	for _, n := range names {
		width = max(width, len(n))
	}
	fmt.Fprintf(w, "%-*s", width+2, "")
	for _, run := range rep.Runs {
		fmt.Fprintf(w, " %22s", run.Policy)
	}
	fmt.Fprintln(w)
	for j := range kinds {
		fmt.Fprintf(w, "%-*s", width+2, names[j])
		for r := range rep.Runs {
			k := Kinds(cfg, &rep.Runs[r])[j]
			fmt.Fprintf(w, " %22s", fmt.Sprintf("%.1f%% / %.1f%% / %.2f", 100*k.Requests, 100*k.PromptTokens, k.PromptPerServer))
		}
		fmt.Fprintln(w)
	}
}
