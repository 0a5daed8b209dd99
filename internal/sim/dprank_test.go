package sim

import (
	"context"
	"testing"
)

// A server of four data-parallel ranks is four engines routed to as four
// backends: kvroute meets the same fleet as four servers, and every rank's
// hit rate is its server's.
func TestDataParallelRanksAreServers(t *testing.T) {
	run := func(dp int) []float64 {
		cfg := Config{Workload: chatWorkload(t, 40), Backends: 4, DataParallel: dp, Profile: profile(t),
			Policies: []string{"kvroute"}, Seed: 3}
		rep, err := Run(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		var rates []float64
		for _, b := range rep.Runs[0].Backends {
			rates = append(rates, float64(b.CachedTokens)/float64(max(b.PromptTokens, 1)))
		}
		if dp > 1 && rep.Runs[0].Backends[3].Name != "gpu0/dp3" {
			t.Errorf("rank 3 named %q, want gpu0/dp3", rep.Runs[0].Backends[3].Name)
		}
		return rates
	}
	ranks, servers := run(4), run(1)
	for i := range ranks {
		if d := ranks[i] - servers[i]; d > 0.01 || d < -0.01 {
			t.Errorf("rank %d: %.1f %% cached, server %d: %.1f %%", i, 100*ranks[i], i, 100*servers[i])
		}
	}
	if _, err := Run(context.Background(), Config{Workload: chatWorkload(t, 4), Backends: 6, DataParallel: 4, Profile: profile(t), Policies: []string{"kvroute"}}); err == nil {
		t.Error("6 engines accepted as servers of 4 ranks")
	}
}
