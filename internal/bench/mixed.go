package bench

import (
	"fmt"

	"github.com/kvroute/kvroute/internal/emulator"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/kvevents"
)

// emulatorConfig is emulator i's config: the fleet's, on its own profile
// when the fleet mixes GPU generations.
func (f *Fleet) emulatorConfig(i int, events kvevents.Source) emulator.Config {
	cfg := f.withEvents(events)
	if i < len(f.profiles) {
		cfg.Profile = f.profiles[i]
	}
	return cfg
}

// checkServers validates a mixed fleet: one profile per backend, all
// serving one model, since the bench's clients name one.
func checkServers(servers []engine.Profile, backends int) error {
	if servers == nil {
		return nil
	}
	if len(servers) != backends {
		return fmt.Errorf("bench: %d server profiles for %d backends", len(servers), backends)
	}
	for _, p := range servers {
		if p.Model != servers[0].Model {
			return fmt.Errorf("bench: the servers serve %s and %s: the bench plays one model's workload (kvroute sim plays several)", servers[0].Model, p.Model)
		}
	}
	return nil
}
