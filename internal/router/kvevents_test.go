package router

import "testing"

func TestEventCached(t *testing.T) {
	tests := []struct {
		name                string
		k                   KVState
		sure, maybe         int
		wantSure, wantMaybe int
	}{
		{name: "unknown keeps the index", k: KVState{}, sure: 64, maybe: 128, wantSure: 64, wantMaybe: 128},
		{name: "exact replaces a guess too high", k: KVState{Tokens: 32, Known: true, Exact: true}, sure: 64, maybe: 128, wantSure: 32, wantMaybe: 32},
		{name: "exact replaces a guess too low", k: KVState{Tokens: 256, Known: true, Exact: true}, sure: 64, maybe: 128, wantSure: 256, wantMaybe: 256},
		{name: "exact beyond the estimated prompt", k: KVState{Tokens: 512, Known: true, Exact: true}, wantSure: 512, wantMaybe: 512},
		{name: "partial only raises", k: KVState{Tokens: 96, Known: true}, sure: 64, maybe: 128, wantSure: 96, wantMaybe: 128},
		{name: "partial below the index", k: KVState{Tokens: 16, Known: true}, sure: 64, maybe: 128, wantSure: 64, wantMaybe: 128},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, m := eventCached(tt.k, tt.sure, tt.maybe)
			if s != tt.wantSure || m != tt.wantMaybe {
				t.Fatalf("eventCached = %d, %d; want %d, %d", s, m, tt.wantSure, tt.wantMaybe)
			}
		})
	}
}
