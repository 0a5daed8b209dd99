package workload

import (
	"errors"
	"fmt"
	"math/rand/v2"
)

// AssignModels gives each session of w one of models, drawn with the given
// weights from seed (the same seed, the same assignment), so that a fleet
// serving several models gets a mix of their traffic: a conversation stays
// on its model, as a client's does.
func AssignModels(w *Workload, models []string, weights []float64, seed uint64) error {
	if len(models) == 0 || len(models) != len(weights) {
		return errors.New("workload: give each model one weight")
	}
	total := 0.0
	for i, v := range weights {
		if v <= 0 {
			return fmt.Errorf("workload: model %s: weight %v must be positive", models[i], v)
		}
		total += v
	}
	rng := rand.New(rand.NewPCG(seed, 0x6d6f64656c73))
	for i := range w.Sessions {
		x := rng.Float64() * total
		k := 0
		for k < len(models)-1 && x >= weights[k] {
			x -= weights[k]
			k++
		}
		w.Sessions[i].Model = models[k]
	}
	return nil
}
