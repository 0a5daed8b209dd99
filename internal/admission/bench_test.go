package admission

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
)

var sinkErr error

// BenchmarkAcquire measures an Acquire and its release: uncontended (one
// goroutine, always admitted at once), contended without queueing (every
// CPU, a cap none reach) and contended with queueing (a cap of half the
// goroutines, so that releases hand slots to waiters).
func BenchmarkAcquire(b *testing.B) {
	ctx := context.Background()
	canRun := func() bool { return true }
	b.Run("uncontended", func(b *testing.B) {
		c, err := New(Config{})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			release, err := c.Acquire(ctx, Entry{Class: Standard, Tenant: "t", Tokens: 1000}, canRun)
			if err != nil {
				sinkErr = err
				continue
			}
			release()
		}
	})
	for _, queueing := range []bool{false, true} {
		name := "parallel"
		maxInFlight := -1
		if queueing {
			name = "parallel-queueing"
			maxInFlight = max(1, runtime.GOMAXPROCS(0)/2)
		}
		b.Run(name, func(b *testing.B) {
			c, err := New(Config{MaxInFlight: maxInFlight, MaxQueue: 1 << 20})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.SetParallelism(4) // more goroutines than slots
			var goroutines atomic.Int64
			b.RunParallel(func(pb *testing.PB) {
				tenant := fmt.Sprint(goroutines.Add(1) % 8) // eight tenants share the queue
				for pb.Next() {
					release, err := c.Acquire(ctx, Entry{Class: Standard, Tenant: tenant, Tokens: 1000}, canRun)
					if err != nil {
						sinkErr = err
						continue
					}
					release()
				}
			})
		})
	}
}
