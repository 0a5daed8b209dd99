package router

import (
	"slices"

	"github.com/cespare/xxhash/v2"

	"github.com/kvroute/kvroute/internal/fleet"
)

// setAdapter sets req.Adapter to req.Model when a candidate lists that
// model as a LoRA adapter, unless the caller set it.
func setAdapter(req *Request, cands []*fleet.Backend) {
	if req.Adapter != "" || req.Model == "" {
		return
	}
	for _, b := range cands {
		info := b.Info()
		if info.IsAdapter(req.Model) {
			req.Adapter = req.Model
			return
		}
		// A model a backend serves as its own is a base model: the common
		// case ends at the first backend, not after every one.
		if info != nil && slices.Contains(info.Models, req.Model) {
			return
		}
	}
}

// seedAdapter mixes the adapter's name into every hash of a chain, in
// place: equal prefixes under one adapter still hash equal, under two never
// (vLLM keys a KV block's hash with its adapter's name likewise). No adapter
// leaves the chain as it is.
func seedAdapter(hashes []uint64, adapter string) {
	if adapter == "" {
		return
	}
	seed := xxhash.Sum64String(adapter)
	for i, h := range hashes {
		hashes[i] = mix64(h ^ seed)
	}
}
