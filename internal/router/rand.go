package router

import (
	"hash/maphash"
	"math/rand/v2"
	"sync"
)

// Rand is a seeded random source safe for concurrent use: every policy that
// draws takes one, so that a seed makes its choices repeatable.
type Rand struct {
	mu sync.Mutex
	r  *rand.Rand
}

// NewRand returns a source seeded with seed; 0 picks a random seed.
func NewRand(seed uint64) *Rand {
	if seed == 0 {
		seed = new(maphash.Hash).Sum64() // a random seed
	}
	return &Rand{r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// IntN returns a uniform number in [0, n).
func (l *Rand) IntN(n int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.r.IntN(n)
}

// Float64 returns a uniform number in [0, 1).
func (l *Rand) Float64() float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.r.Float64()
}

// Pair returns two distinct uniform numbers in [0, n), n ≥ 2, under one lock.
func (l *Rand) Pair(n int) (int, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	i, j := l.r.IntN(n), l.r.IntN(n-1)
	if j >= i {
		j++
	}
	return i, j
}
