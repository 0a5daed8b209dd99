package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/kvroute/kvroute/internal/emulator"
	"github.com/kvroute/kvroute/internal/fleet"
)

// emulateRanks starts cfg.Backends emulated servers of cfg.DataParallel
// data-parallel ranks each, on a loopback port per server; the router
// sees every rank as a backend of its own, NAME/dpRANK, as `kvroute serve
// --dp-ranks` does. Servers and Names are by rank.
func (f *Fleet) emulateRanks(ctx context.Context, cfg FleetConfig) ([]*fleet.Backend, []string, error) {
	if cfg.KVEvents {
		return nil, nil, errors.New("bench: KV events are not published for data-parallel ranks")
	}
	var (
		backends []*fleet.Backend
		urls     []string
	)
	for i := range cfg.Backends {
		dp, err := emulator.NewDataParallel(f.emuCfg, cfg.DataParallel)
		if err != nil {
			return nil, nil, err
		}
		f.Model = dp.Rank(0).Model()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, nil, err
		}
		u, err := url.Parse("http://" + ln.Addr().String())
		if err != nil {
			ln.Close()
			return nil, nil, err
		}
		ranks, err := fleet.ExpandRanks(fleet.NewBackend(len(backends), fmt.Sprintf("gpu%d", i), u), cfg.DataParallel)
		if err != nil {
			ln.Close()
			return nil, nil, err
		}
		srv := &http.Server{Handler: dp, ReadHeaderTimeout: 10 * time.Second}
		// The ranks run until the fleet's context ends: no fault stops
		// one server of them alone.
		f.wg.Go(func() { dp.Run(f.ctx) })
		f.wg.Go(func() { srv.Serve(ln) })
		for r, b := range ranks {
			// Every rank's entry holds the server's: a kill would stop
			// them all (faults are refused with ranks).
			f.emu = append(f.emu, emuBackend{srv: srv, addr: ln.Addr().String(), cancel: func() {}})
			f.retired = append(f.retired, backendStats{})
			f.Servers = append(f.Servers, dp.Rank(r))
			f.Names = append(f.Names, b.Name)
		}
		backends = append(backends, ranks...)
		urls = append(urls, u.String())
	}
	return backends, urls, nil
}
