package admission

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// reason is a rejection's label value in kvroute_admission_rejected_total.
type reason uint8

const (
	reasonQueueFull reason = iota
	reasonQueueTimeout
	reasonDeadline
	reasonCanceled
	numReasons
)

var reasonNames = [numReasons]string{"queue_full", "queue_timeout", "deadline", "canceled"}

func reasonOf(err error) reason {
	switch {
	case errors.Is(err, ErrQueueTimeout):
		return reasonQueueTimeout
	case errors.Is(err, ErrDeadline):
		return reasonDeadline
	case errors.Is(err, ErrQueueFull):
		return reasonQueueFull
	}
	return reasonCanceled
}

// waitBuckets, in seconds: most admitted requests wait not at all (the
// first bucket), queued ones up to QueueTimeout, which an operator may raise
// to minutes.
var waitBuckets = []float64{0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300}

// metrics are the controller's Prometheus metrics, all named
// kvroute_admission_*, with every child created up front so that each label
// set is exported (as zero) from the start and the hot path does no map
// lookups.
type metrics struct {
	queue    [NumClasses]prometheus.Gauge
	inFlight prometheus.Gauge
	admitted [NumClasses]prometheus.Counter
	rejected [NumClasses][numReasons]prometheus.Counter
	wait     [NumClasses]prometheus.Observer
}

// newMetrics builds the metrics and registers them on reg unless reg is nil;
// rate reads the drain rate at scrape time.
func newMetrics(reg prometheus.Registerer, rate func() float64) (*metrics, error) {
	queue := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kvroute_admission_queue_length",
		Help: "Requests waiting for admission, by priority class.",
	}, []string{"class"})
	inFlight := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kvroute_admission_in_flight",
		Help: "Requests admitted and not yet released.",
	})
	admitted := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvroute_admission_admitted_total",
		Help: "Requests admitted, at once or from the queue, by priority class.",
	}, []string{"class"})
	rejected := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvroute_admission_rejected_total",
		Help: `Requests turned away, by priority class and reason: "queue_full" (or displaced by a higher class), "queue_timeout", "deadline" (predicted TTFT plus queue wait over the deadline), "canceled" (the client went away while waiting).`,
	}, []string{"class", "reason"})
	wait := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "kvroute_admission_queue_wait_seconds",
		Help:    "Time admitted requests waited for admission (0 when admitted at once), by priority class.",
		Buckets: waitBuckets,
	}, []string{"class"})
	drain := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kvroute_admission_drain_rate",
		Help: "Releases per second (exponentially weighted, 20 s time constant): the rate Retry-After and the expected queue wait are estimated from.",
	}, rate)

	m := &metrics{inFlight: inFlight}
	for c := range Class(NumClasses) {
		name := c.String()
		m.queue[c] = queue.WithLabelValues(name)
		m.admitted[c] = admitted.WithLabelValues(name)
		m.wait[c] = wait.WithLabelValues(name)
		for r := range numReasons {
			m.rejected[c][r] = rejected.WithLabelValues(name, reasonNames[r])
		}
	}
	if reg == nil {
		return m, nil
	}
	for _, col := range []prometheus.Collector{queue, inFlight, admitted, rejected, wait, drain} {
		if err := reg.Register(col); err != nil {
			return nil, fmt.Errorf("admission: register metrics (one Controller per registry, or each under prometheus.WrapRegistererWith with its own label value): %w", err)
		}
	}
	return m, nil
}
