package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
)

// maxModelsBody bounds a /v1/models or /health response, in bytes.
const maxModelsBody = 4 << 20

// checkHealth probes m once, moves it in or out of rotation when a threshold
// is crossed (logging the transition once) and reports whether its models
// are due to be discovered: it is healthy and just came back, was never
// discovered, or was last discovered rediscoverRounds rounds ago.
func (f *Fleet) checkHealth(ctx context.Context, m *member) (discover bool) {
	m.mu.Lock()
	passive := m.passive
	m.mu.Unlock()

	started := f.now()
	err := f.probe(ctx, m)
	if ctx.Err() != nil {
		// Shutting down: a probe cut short says nothing about the backend.
		return false
	}
	if err == nil {
		f.readmit(m, started) // an ejected backend returns on a pass begun after its ejection
	}

	m.mu.Lock()
	defer m.mu.Unlock()
	b := m.b
	back := false
	if err != nil {
		m.passes = 0
		m.fails++
		if (m.fails >= f.failAfter || !m.passed) && b.SetHealthy(false) {
			f.log.Warn("backend down", "backend", b.Name, "url", m.base, "cause", "health check failed",
				"fails", m.fails, "err", err)
		}
	} else {
		m.fails, m.passed = 0, true
		if m.passive == passive { // a pass that began before a passive failure doesn't count
			m.passes++
		}
		if m.passes >= f.passAfter && b.SetHealthy(true) {
			back = true
			f.log.Info("backend up", "backend", b.Name, "url", m.base, "passes", m.passes)
		}
	}
	m.sinceDiscovery++
	return b.Healthy() && (back || b.Info() == nil || m.sinceDiscovery >= rediscoverRounds)
}

// probe is one active health check: GET /health must answer 2xx. Servers
// without /health (404) are asked for /v1/models instead.
func (f *Fleet) probe(ctx context.Context, m *member) error {
	err := f.fetch(ctx, m.b, m.healthURL, "", maxModelsBody, nil)
	if se := (*StatusError)(nil); errors.As(err, &se) && se.StatusCode == http.StatusNotFound {
		err = f.fetch(ctx, m.b, m.modelsURL, "application/json", maxModelsBody, nil)
	}
	return err
}

// modelList is the OpenAI list format of /v1/models.
type modelList struct {
	Data []struct {
		ID string `json:"id"`
		// Parent is the base model of a LoRA adapter (vLLM); empty or the
		// id itself for a base model.
		Parent string `json:"parent"`
	} `json:"data"`
}

// discover reads m's models from /v1/models and publishes them, with the KV
// cache shape from the latest scrape, as m's Info. On failure m keeps the
// Info it had; failures are logged once until discovery works again.
func (f *Fleet) discover(ctx context.Context, m *member) {
	m.mu.Lock()
	m.sinceDiscovery = 0
	m.mu.Unlock()

	var list modelList
	err := f.fetch(ctx, m.b, m.modelsURL, "application/json", maxModelsBody, func(r io.Reader) error {
		return json.NewDecoder(r).Decode(&list)
	})
	var models []string
	for _, d := range list.Data {
		if d.ID != "" && !slices.Contains(models, d.ID) {
			models = append(models, d.ID)
		}
	}
	if err == nil && len(models) == 0 {
		err = ErrNoModels
	}
	adapters := adaptersOf(&list)
	if ctx.Err() != nil {
		return
	}

	m.mu.Lock()
	defer m.mu.Unlock()
	b := m.b
	if err != nil {
		if !m.discoverFailing {
			m.discoverFailing = true
			f.log.Warn("backend discovery failed", "backend", b.Name, "url", m.base, "err", err)
		}
		return
	}
	m.discoverFailing = false
	info := &Info{Models: models, Adapters: adapters, BlockSize: m.cache.blockSize, KVBlocks: m.cache.blocks}
	if old := b.Info(); old != nil {
		if info.BlockSize == 0 { // this scrape had no cache shape: keep the one we knew
			info.BlockSize, info.KVBlocks = old.BlockSize, old.KVBlocks
		}
		if sameInfo(old, info) {
			return
		}
	}
	b.SetInfo(info)
	f.log.Info("backend discovered", "backend", b.Name, "url", m.base, "models", models,
		"block_size", info.BlockSize, "kv_blocks", info.KVBlocks)
}

// setCache records the KV cache shape seen by a scrape and, if m is already
// discovered with another shape, republishes its Info.
func (m *member) setCache(c cacheConfig) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cache = c
	old := m.b.Info()
	if old == nil || (old.BlockSize == c.blockSize && old.KVBlocks == c.blocks) {
		return
	}
	m.b.SetInfo(&Info{Models: old.Models, Adapters: old.Adapters, BlockSize: c.blockSize, KVBlocks: c.blocks})
}

func sameInfo(a, b *Info) bool {
	return a.BlockSize == b.BlockSize && a.KVBlocks == b.KVBlocks && slices.Equal(a.Models, b.Models) && slices.Equal(a.Adapters, b.Adapters)
}
