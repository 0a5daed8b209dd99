package emulator

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvroute/kvroute/internal/openai"
)

// HeaderDataParallelRank is the request header that picks a data-parallel
// rank, as vLLM reads it (its name is matched without regard to case).
const HeaderDataParallelRank = "X-data-parallel-rank"

// DataParallel is one model served by N data-parallel ranks behind one
// address, as vLLM serves --data-parallel-size N: each rank its own engine,
// with its own KV cache and batch. A request names its rank in
// HeaderDataParallelRank; without it, it goes to the rank with the fewest
// requests in flight (the lowest among ties), as vLLM's front end
// balances. /metrics has every rank's series, labelled engine="RANK" as
// vLLM labels them. Other endpoints are rank 0's, except that adapter
// loads and fault changes reach every rank. It is safe for concurrent use.
type DataParallel struct {
	ranks    []*Server
	inFlight []atomic.Int64
	metrics  http.Handler
}

// NewDataParallel returns n ranks of cfg's server; n = 1 is a plain server
// behind the same API.
func NewDataParallel(cfg Config, n int) (*DataParallel, error) {
	if n < 1 {
		return nil, fmt.Errorf("emulator: data-parallel size %d must be at least 1", n)
	}
	if n > 1 && cfg.KVEvents != nil {
		return nil, errors.New("emulator: KV events are not published for data-parallel ranks")
	}
	d := &DataParallel{inFlight: make([]atomic.Int64, n)}
	var gs prometheus.Gatherers
	for i := range n {
		rc := cfg
		if n > 1 {
			rc.GPUID = fmt.Sprintf("%s/rank%d", cfg.GPUID, i)
			if cfg.Logger != nil {
				rc.Logger = cfg.Logger.With("rank", i)
			}
		}
		s, err := New(rc)
		if err != nil {
			return nil, err
		}
		d.ranks = append(d.ranks, s)
		gs = append(gs, rankGatherer{s.metrics.reg, strconv.Itoa(i)})
	}
	d.metrics = d.ranks[0].metrics.handler
	if n > 1 {
		d.metrics = promhttp.HandlerFor(gs, promhttp.HandlerOpts{})
	}
	return d, nil
}

// Size returns the number of ranks.
func (d *DataParallel) Size() int { return len(d.ranks) }

// Rank returns rank i's server.
func (d *DataParallel) Rank(i int) *Server { return d.ranks[i] }

// Run drives every rank's engine until ctx is done.
func (d *DataParallel) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	errs := make([]error, len(d.ranks))
	for i, s := range d.ranks {
		wg.Go(func() { errs[i] = s.Run(ctx) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Close closes every rank.
func (d *DataParallel) Close() error {
	var errs []error
	for _, s := range d.ranks {
		errs = append(errs, s.Close())
	}
	return errors.Join(errs...)
}

// ServeHTTP routes a generation request to its rank and serves the rest.
func (d *DataParallel) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if len(d.ranks) == 1 {
		d.ranks[0].ServeHTTP(w, r)
		return
	}
	switch r.URL.Path {
	case "/v1/chat/completions", "/v1/completions", "/v1/responses":
		i, e := d.pick(r)
		if e != nil {
			writeError(w, e)
			return
		}
		d.inFlight[i].Add(1)
		defer d.inFlight[i].Add(-1)
		d.ranks[i].ServeHTTP(w, r)
	case "/metrics":
		d.metrics.ServeHTTP(w, r)
	case "/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/admin/faults":
		if r.Method == http.MethodGet || r.Method == http.MethodHead {
			d.ranks[0].ServeHTTP(w, r)
			return
		}
		d.toEvery(w, r)
	default:
		d.ranks[0].ServeHTTP(w, r)
	}
}

// pick returns the rank r names, or the one with the fewest requests in
// flight; a header that is not a rank of this server is a 400, as vLLM's.
func (d *DataParallel) pick(r *http.Request) (int, *openai.Error) {
	if v := r.Header.Get(HeaderDataParallelRank); v != "" {
		i, err := strconv.Atoi(v)
		if err != nil || i < 0 || i >= len(d.ranks) {
			return 0, badRequest("", "%s %q is not a data-parallel rank of this server (0 to %d)", HeaderDataParallelRank, v, len(d.ranks)-1)
		}
		return i, nil
	}
	best := 0
	for i := range d.inFlight {
		if d.inFlight[i].Load() < d.inFlight[best].Load() {
			best = i
		}
	}
	return best, nil
}

// toEvery serves r on every rank, rank 0's answer to the client: a change
// of adapters or faults holds for the whole server.
func (d *DataParallel) toEvery(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		writeError(w, tooLarge())
		return
	}
	for _, s := range d.ranks[1:] {
		rr := r.Clone(r.Context())
		rr.Body = io.NopCloser(bytes.NewReader(body))
		s.ServeHTTP(discard{h: http.Header{}}, rr)
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	d.ranks[0].ServeHTTP(w, r)
}

// discard is a ResponseWriter that keeps nothing.
type discard struct{ h http.Header }

func (d discard) Header() http.Header       { return d.h }
func (discard) Write(b []byte) (int, error) { return len(b), nil }
func (discard) WriteHeader(int)             {}

// rankGatherer is one rank's registry with every series labelled
// engine="RANK", as vLLM labels the metrics of its data-parallel engines.
type rankGatherer struct {
	g    prometheus.Gatherer
	rank string
}

// Gather implements prometheus.Gatherer.
func (g rankGatherer) Gather() ([]*dto.MetricFamily, error) {
	fams, err := g.g.Gather()
	name, value := "engine", g.rank
	for _, f := range fams {
		for _, m := range f.Metric {
			m.Label = append(m.Label, &dto.LabelPair{Name: &name, Value: &value})
		}
	}
	return fams, err
}
