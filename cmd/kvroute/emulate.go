package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute/internal/emulator"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/kvevents"
)

// shutdownGrace is how long in-flight requests get to finish on SIGINT or
// SIGTERM before their streams are cut.
const shutdownGrace = 10 * time.Second

// emulateConfig is what the emulate flags decide.
type emulateConfig struct {
	host     string
	port     int // of the first replica; 0 picks free ports
	replicas int
	// dataParallel is the ranks of each replica (--data-parallel-size).
	dataParallel int
	logLevel     slog.Level
	logFormat    logFormat
	server       emulator.Config // Logger unset
}

// parseEmulateFlags parses the emulate subcommand's flags. Flags that set
// engine limits override the chosen profile's. One flag a line, as --help
// lists them: its length is the flags'.
func parseEmulateFlags(args []string, output io.Writer) (emulateConfig, error) {
	fs := flag.NewFlagSet("kvroute emulate", flag.ContinueOnError)
	fs.SetOutput(output)
	var (
		cfg              emulateConfig
		profileName      string
		model            string
		kvBlocks         int
		blockSize        int
		maxNumSeqs       int
		noPrefixCaching  bool
		maxModelLen      int
		maxBatchedTokens int
		timeScale        float64
		seed             uint64
		faults           emulator.Faults
		apiKey           string
		admin            bool
		kvEvents         kvevents.PublisherConfig
		kvFormat         string
		disagg           emulator.Disagg
	)
	fs.StringVar(&cfg.host, "host", "127.0.0.1", "address to listen on")
	fs.IntVar(&cfg.port, "port", 8001, "port of the first replica; replica i listens on port+i (0: any free port)")
	fs.IntVar(&cfg.replicas, "replicas", 1, "number of independent servers, each with its own engine and KV cache")
	fs.IntVar(&cfg.dataParallel, "data-parallel-size", 1, "data-parallel ranks of each server, as vLLM's flag: engines with their own KV cache and batch behind one address, a request's rank from its X-data-parallel-rank header (else the rank with the fewest requests in flight), metrics labelled engine=RANK")
	fs.StringVar(&profileName, "profile", engine.DefaultProfile, "engine profile, one of: "+strings.Join(engine.ProfileNames(), ", "))
	fs.StringVar(&model, "model", "", "served model name (default: the profile's model)")
	fs.IntVar(&kvBlocks, "kv-blocks", 0, "KV cache capacity in blocks (default: derived from the profile's GPU memory)")
	fs.IntVar(&blockSize, "block-size", 0, "tokens per KV block (default: the profile's, 16)")
	fs.IntVar(&maxNumSeqs, "max-num-seqs", 0, "most requests in one batch (default: the profile's, 256)")
	fs.BoolVar(&noPrefixCaching, "no-enable-prefix-caching", false, "turn prefix caching off, as vLLM's flag: every prompt is computed whole and cached_tokens is 0")
	fs.IntVar(&maxModelLen, "max-model-len", 0, "longest prompt plus output in tokens (default: the profile's, clamped to the KV capacity)")
	fs.IntVar(&maxBatchedTokens, "max-num-batched-tokens", 0, "token budget of one engine step (default: the profile's, 8192)")
	fs.Float64Var(&timeScale, "time-scale", 1, "wall seconds per model second: 1 is real time, 0.1 ten times faster")
	fs.Uint64Var(&seed, "seed", 0, "seed of the generated outputs (equal seeds give equal replies)")
	fs.TextVar(&cfg.logLevel, "log-level", slog.LevelInfo, "log level: debug, info, warn or error")
	cfg.logFormat = logText
	fs.Var(&cfg.logFormat, "log-format", logFormatUsage)
	registerFaultFlags(fs, &faults)
	fs.StringVar(&apiKey, "api-key", "", "require the header Authorization: Bearer `KEY` on every /v1 request, as vLLM's --api-key (/health and /metrics stay open)")
	fs.BoolVar(&admin, "admin", true, "serve GET and PUT /admin/faults (the faults as JSON) to loopback clients only")
	fs.StringVar(&kvEvents.Endpoint, "kv-events-endpoint", "", "publish vLLM's KV events on this ZMQ PUB `ENDPOINT` (tcp://*:5557; replica i on port+i, as vLLM's data-parallel ranks; port 0: any); empty: none")
	fs.StringVar(&kvEvents.Replay, "kv-events-replay-endpoint", "", "answer KV event replay requests on this ZMQ ROUTER `ENDPOINT` (tcp://*:5558; replica i on port+i)")
	fs.StringVar(&kvEvents.Topic, "kv-events-topic", "", "topic of the KV event messages (vLLM's kv_events_config topic)")
	var (
		enableLoRA  bool
		loraModules []emulator.LoRAModule
	)
	fs.BoolVar(&enableLoRA, "enable-lora", false, "serve LoRA adapters of the model, as vLLM's --enable-lora: --lora-modules from the start, more through POST /v1/load_lora_adapter")
	fs.Func("lora-modules", "a LoRA adapter served from the start, `NAME=PATH` as vLLM's (repeat for more; implies --enable-lora)", func(v string) error {
		m, err := emulator.ParseLoRAModule(v)
		loraModules = append(loraModules, m)
		return err
	})
	lf := addLoRAFlags(fs, "with --enable-lora")
	fs.StringVar(&kvFormat, "kv-events-format", "map", "msgpack layout of the KV event batches: map (vLLM's current source), array (array_like, as most vLLM releases and its subscriber example) or sglang (SGLang's: array_like, one page per event, signed hashes)")
	fs.StringVar(&disagg.Role, "kv-role", "", "the server's part in prefill/decode disaggregation, as vLLM with NixlConnector: prefill (answers kv_transfer_params asking for a remote decode with those of its KV), decode (pulls the KV a request's kv_transfer_params name), both; empty: no KV connector")
	fs.Float64Var(&disagg.LinkBandwidth, "kv-link-bandwidth", emulator.DefaultLinkBandwidth, "with --kv-role: the KV transfer link's bandwidth in bytes/s (a pull of n tokens takes n × KV bytes per token / this, in model time)")
	fs.DurationVar(&disagg.BootstrapTimeout, "kv-bootstrap-timeout", emulator.DefaultBootstrapTimeout, "with --kv-role decode or both: how long a request with SGLang's bootstrap_room waits for its prefill before it answers 503")
	fs.DurationVar(&disagg.Hold, "kv-hold", emulator.DefaultKVHold, "with --kv-role prefill or both: how long a prefill's KV is held for its decode server (vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: kvroute emulate [flags]\n\n"+
			"Serves emulated vLLM servers: the OpenAI API (/v1/chat/completions, /v1/completions,\n"+
			"/v1/models), /health and /metrics, with tokens paced by the engine model.\n"+
			"/metrics also carries the GPU metrics of NVIDIA's DCGM exporter (DCGM_FI_DEV_GPU_UTIL, ...)\n"+
			"computed from the model. Profiles other than the vLLM ones model engines of other\n"+
			"shapes (docs/engine-model.md).\n"+
			"Each replica prints `listening replica=I url=URL` on stdout once it accepts connections.\n"+
			"The --fault-* flags inject failures into every replica; with --admin,\n"+
			"GET and PUT /admin/faults read and replace a replica's faults at runtime.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}

	p, err := engine.LookupProfile(profileName)
	if err != nil {
		return cfg, err
	}
	overrides := []struct {
		name  string
		value int
		field *int
	}{
		{"kv-blocks", kvBlocks, &p.NumGPUBlocks},
		{"block-size", blockSize, &p.BlockSize},
		{"max-num-seqs", maxNumSeqs, &p.MaxNumSeqs},
		{"max-model-len", maxModelLen, &p.MaxModelLen},
		{"max-num-batched-tokens", maxBatchedTokens, &p.MaxNumBatchedTokens},
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for _, o := range overrides {
		if !set[o.name] {
			continue
		}
		if o.value < 1 {
			return cfg, fmt.Errorf("--%s must be positive, got %d", o.name, o.value)
		}
		*o.field = o.value
	}
	p.NoPrefixCaching = p.NoPrefixCaching || noPrefixCaching
	// A llama.cpp-like profile runs one sequence per slot: --max-num-seqs
	// is its --parallel.
	if p.Slots > 0 && set["max-num-seqs"] {
		p.Slots = p.MaxNumSeqs
	}
	// vLLM refuses to start when one sequence cannot fit in the cache; a
	// small --kv-blocks alone should just work, so shrink the context.
	if capacity := p.Blocks() * p.BlockSize; !set["max-model-len"] && p.MaxModelLen > capacity {
		p.MaxModelLen = capacity
	}
	if err := p.Validate(); err != nil {
		return cfg, err
	}

	switch {
	case cfg.replicas < 1:
		return cfg, fmt.Errorf("--replicas must be at least 1, got %d", cfg.replicas)
	case cfg.dataParallel < 1:
		return cfg, fmt.Errorf("--data-parallel-size must be at least 1, got %d", cfg.dataParallel)
	case cfg.port < 0 || cfg.port > 65535:
		return cfg, fmt.Errorf("--port %d is not a TCP port", cfg.port)
	case cfg.port > 0 && cfg.port+cfg.replicas-1 > 65535:
		return cfg, fmt.Errorf("--port %d + %d replicas runs past port 65535", cfg.port, cfg.replicas)
	case !(timeScale > 0):
		return cfg, fmt.Errorf("--time-scale must be positive, got %v", timeScale)
	}
	if err := faults.Validate(); err != nil {
		return cfg, err
	}
	cfg.server = emulator.Config{Model: model, Profile: p, TimeScale: timeScale, Seed: seed,
		Faults: faults, APIKey: apiKey, Admin: admin, Disagg: disagg}
	switch disagg.Role {
	case "", "prefill", "decode", "both":
	default:
		return cfg, fmt.Errorf("--kv-role %q: want prefill, decode or both", disagg.Role)
	}
	if !(disagg.LinkBandwidth > 0) || disagg.Hold <= 0 || disagg.BootstrapTimeout <= 0 {
		return cfg, fmt.Errorf("--kv-link-bandwidth, --kv-hold and --kv-bootstrap-timeout must be positive")
	}
	if kvEvents.Endpoint != "" {
		if kvEvents.Format, err = kvevents.ParseFormat(kvFormat); err != nil {
			return cfg, err
		}
		cfg.server.KVEvents = &kvEvents
	}
	if enableLoRA || len(loraModules) > 0 {
		l, err := lf.lora(p)
		if err != nil {
			return cfg, err
		}
		cfg.server.LoRA, cfg.server.LoRAModules = &l, loraModules
	}
	return cfg, nil
}

func runEmulate(args []string, stdout, stderr io.Writer) int {
	cfg, err := parseEmulateFlags(args, stderr)
	if code, ok := flagsDone("emulate", err, stderr); !ok {
		return code
	}
	log := newLogger(stderr, cfg.logFormat, cfg.logLevel)
	ctx, stop := signalContext()
	defer stop()
	// Tests and scripts that start with --port 0 read the addresses here.
	ready := func(urls []string) {
		for i, u := range urls {
			fmt.Fprintf(stdout, "listening replica=%d url=%s\n", i, u)
		}
	}
	if err := emulate(ctx, cfg, log, ready); err != nil {
		log.Error("emulate failed", "err", err)
		return 1
	}
	return 0
}

// offsetPort returns a tcp endpoint with its port moved up by i (vLLM's
// offset for data-parallel ranks); a port of 0 or * stays any.
func offsetPort(endpoint string, i int) string {
	colon := strings.LastIndexByte(endpoint, ':')
	if i == 0 || colon < 0 {
		return endpoint
	}
	port, err := strconv.Atoi(endpoint[colon+1:])
	if err != nil || port == 0 {
		return endpoint
	}
	return endpoint[:colon+1] + strconv.Itoa(port+i)
}

// replica is one emulated server and its listener.
type replica struct {
	srv  *emulator.Server // rank 0's
	dp   *emulator.DataParallel
	http *http.Server
	ln   net.Listener
	url  string
}

// emulate serves cfg.replicas emulated servers until ctx is done, then shuts
// them down gracefully. ready, if not nil, gets the replicas' base URLs once
// they accept connections. Starting, serving and stopping the replicas are
// one function, so that what a start that fails halfway must undo is beside
// what it started.
func emulate(ctx context.Context, cfg emulateConfig, log *slog.Logger, ready func(urls []string)) error {
	replicas := make([]*replica, 0, cfg.replicas)
	defer func() {
		for _, r := range replicas {
			r.ln.Close()
			r.dp.Close() // after the drivers stopped: the KV event sockets
		}
	}()
	for i := range cfg.replicas {
		port := cfg.port
		if port != 0 {
			port += i
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(cfg.host, strconv.Itoa(port)))
		if err != nil {
			// emulate has no config file: the flags alone.
			return fmt.Errorf("replica %d listener: %w (--host, --port: replica i listens on port+i)", i, err)
		}
		sc := cfg.server
		sc.Logger = log.With("replica", i)
		// Each replica's fake GPUs get UUIDs of their own, the same at
		// every start on the same address.
		sc.GPUID = ln.Addr().String()
		if sc.KVEvents != nil {
			ev := *sc.KVEvents
			ev.Endpoint, ev.Replay = offsetPort(ev.Endpoint, i), offsetPort(ev.Replay, i)
			sc.KVEvents = &ev
		}
		dp, err := emulator.NewDataParallel(sc, cfg.dataParallel)
		if err != nil {
			ln.Close()
			return err
		}
		replicas = append(replicas, &replica{
			srv:  dp.Rank(0),
			dp:   dp,
			http: &http.Server{Handler: dp, ReadHeaderTimeout: 10 * time.Second},
			ln:   ln,
			url:  "http://" + ln.Addr().String(),
		})
	}

	runCtx, stopDrivers := context.WithCancel(context.Background())
	defer stopDrivers()
	var drivers sync.WaitGroup
	errc := make(chan error, len(replicas))
	urls := make([]string, len(replicas))
	for i, r := range replicas {
		drivers.Go(func() { _ = r.dp.Run(runCtx) })
		go func() {
			if err := r.http.Serve(r.ln); !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("replica %d: %w", i, err)
			}
		}()
		if pub, replay := r.srv.KVEventsAddr(); pub != "" {
			log.Info("publishing kv events", "replica", i, "endpoint", pub, "replay", replay)
		}
		p := r.srv.Profile()
		log.Info("emulating vLLM", "replica", i, "url", r.url, "model", r.srv.Model(),
			"profile", p.Name, "kv_blocks", p.Blocks(), "block_size", p.BlockSize,
			"max_num_seqs", p.MaxNumSeqs, "max_model_len", p.MaxModelLen, "time_scale", cfg.server.TimeScale,
			"data_parallel_size", r.dp.Size(),
			"faults", r.srv.Faults(), "api_key", cfg.server.APIKey != "", "admin", cfg.server.Admin)
		urls[i] = r.url
	}
	if ready != nil {
		ready(urls)
	}

	var err error
	select {
	case <-ctx.Done():
		log.Info("shutting down", "grace", shutdownGrace)
	case err = <-errc:
	}
	// Stop accepting and let streams finish; past the grace period stop the
	// drivers, which ends the remaining streams with an error event.
	sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	var closing sync.WaitGroup
	for _, r := range replicas {
		closing.Go(func() {
			if r.http.Shutdown(sctx) != nil {
				stopDrivers()
				r.http.Close()
			}
		})
	}
	closing.Wait()
	stopDrivers()
	drivers.Wait()
	return err
}

// registerFaultFlags adds the flags of the faults an emulator injects.
func registerFaultFlags(fs *flag.FlagSet, f *emulator.Faults) {
	fs.BoolVar(&f.Hang, "fault-hang", false, "fault: chat and completion requests never answer, not even headers (/health stays 200)")
	fs.BoolVar(&f.HangAfterFirst, "fault-hang-after-first", false, "fault: responses send their first token, then stall forever with the connection open")
	fs.Float64Var(&f.Rate500, "fault-500-rate", 0, "fault: fraction of requests, 0 to 1, answered with a 500 server_error (drawn from --seed)")
	fs.Float64Var(&f.Rate429, "fault-429-rate", 0, "fault: fraction of requests, 0 to 1, answered with a 429 and a Retry-After header")
	fs.IntVar(&f.RetryAfter, "fault-retry-after", 1, "Retry-After of the injected 429s, in seconds")
	fs.IntVar(&f.DieAfterTokens, "fault-die-after-tokens", 0, "fault: cut every response after this many tokens, closing the connection without the final chunk (0: never)")
	fs.Float64Var(&f.Slow, "fault-slow", 1, "fault: every engine step takes this many times its modelled time (1: normal)")
	fs.BoolVar(&f.HealthFail, "fault-health-fail", false, "fault: GET /health answers 503")
}
