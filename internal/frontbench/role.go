package frontbench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// The roles Run starts this binary in, each its own process.
const (
	RoleBackends = "backends"
	RoleStdlib   = "httputil"
	RoleLoad     = "load"
)

// RoleArgs are a role's parameters, from the flags of `kvroute bench front
// --role`.
type RoleArgs struct {
	Backends    int    // backends: how many
	BackendURLs string // httputil: comma-separated
	Load        string // load: a LoadConfig in JSON
}

// RunRole runs role until ctx ends (backends, httputil) or its work is done
// (load), printing its announcement or result to stdout.
func RunRole(ctx context.Context, role string, a RoleArgs, stdout io.Writer) error {
	switch role {
	case RoleBackends:
		bs, err := StartBackends(a.Backends, benchModel)
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, strings.Join(bs.URLs, ","))
		<-ctx.Done()
		bs.Close()
		return nil
	case RoleStdlib:
		h, err := NewStdlibFront(strings.Split(a.BackendURLs, ","))
		if err != nil {
			return err
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		fmt.Fprintln(stdout, "http://"+ln.Addr().String())
		<-ctx.Done()
		return srv.Close()
	case RoleLoad:
		var lc LoadConfig
		if err := json.Unmarshal([]byte(a.Load), &lc); err != nil {
			return fmt.Errorf("--load: %w", err)
		}
		res, err := RunLoad(ctx, lc)
		if err != nil {
			return err
		}
		return json.NewEncoder(stdout).Encode(res)
	}
	return fmt.Errorf("unknown role %q", role)
}
