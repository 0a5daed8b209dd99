package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// defaultTraceSample is the share of new traces kept when an OTLP endpoint
// is set: all of them. A routed LLM request costs a backend seconds of GPU
// time and the router three spans of a few microseconds and a few hundred
// bytes; at the hundreds of requests a second one router sees, that is a
// small stream to a collector, and the slow request one wants to explain is
// the rare one a sample would miss. A client's own decision (the sampled
// flag of its traceparent) is followed whatever this is.
const defaultTraceSample = 1.0

// tracingShutdownTimeout bounds the flush of the spans still buffered when
// serve stops.
const tracingShutdownTimeout = 5 * time.Second

// tracingConfig is what the tracing flags decide.
type tracingConfig struct {
	endpoint string
	insecure bool
	sample   float64
}

func (c *tracingConfig) register(fs *flag.FlagSet) {
	fs.StringVar(&c.endpoint, "otlp-endpoint", "", "send traces (a span per request, routing decision and attempt) over OTLP/HTTP to this collector: host:port (path /v1/traces) or a URL (empty: no tracing)")
	fs.BoolVar(&c.insecure, "otlp-insecure", false, "plain HTTP to a host:port --otlp-endpoint rather than HTTPS (a URL's scheme decides by itself)")
	fs.Float64Var(&c.sample, "trace-sample", defaultTraceSample, "share of new traces kept, 0 to 1; a request whose client sent a traceparent follows the client's choice")
}

// exporterOptions checks the flags and returns the exporter's options.
func (c *tracingConfig) exporterOptions() ([]otlptracehttp.Option, error) {
	if c.sample < 0 || c.sample > 1 {
		return nil, fmt.Errorf("--trace-sample must be between 0 and 1, got %v", c.sample)
	}
	if c.endpoint == "" {
		return nil, nil
	}
	if !strings.Contains(c.endpoint, "://") {
		if strings.ContainsAny(c.endpoint, "/?#") {
			return nil, fmt.Errorf("--otlp-endpoint %q: want host:port or a URL", c.endpoint)
		}
		opts := []otlptracehttp.Option{otlptracehttp.WithEndpoint(c.endpoint)}
		if c.insecure {
			opts = append(opts, otlptracehttp.WithInsecure())
		}
		return opts, nil
	}
	u, err := url.Parse(c.endpoint)
	switch {
	case err != nil:
		return nil, fmt.Errorf("--otlp-endpoint: %w", err)
	case u.Scheme != "http" && u.Scheme != "https", u.Host == "":
		return nil, fmt.Errorf("--otlp-endpoint %q: want an http or https URL", c.endpoint)
	}
	path := u.Path
	if path == "" || path == "/" {
		path = "/v1/traces"
	}
	opts := []otlptracehttp.Option{otlptracehttp.WithEndpoint(u.Host), otlptracehttp.WithURLPath(path)}
	if u.Scheme == "http" {
		opts = append(opts, otlptracehttp.WithInsecure())
	}
	return opts, nil
}

// start returns the tracer provider of the flags, and its shutdown, which
// flushes the spans still buffered; nil and a no-op when tracing is off.
// The exporter also reads the OTEL_EXPORTER_OTLP_* variables it knows
// (headers for a collector's credentials, timeouts), and the resource
// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES.
func (c *tracingConfig) start(ctx context.Context) (trace.TracerProvider, func(), error) {
	opts, err := c.exporterOptions()
	if err != nil || c.endpoint == "" {
		return nil, func() {}, err
	}
	// Not ctx: the exporter flushes after serve's context has ended.
	exp, err := otlptracehttp.New(context.Background(), opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("OTLP exporter: %w", err)
	}
	res, err := resource.New(ctx, resource.WithTelemetrySDK(),
		resource.WithAttributes(attribute.String("service.name", "kvroute"), attribute.String("service.version", cmp.Or(version, "devel"))),
		resource.WithFromEnv())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, nil, fmt.Errorf("trace resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(c.sample))))
	return tp, func() {
		ctx, cancel := context.WithTimeout(context.Background(), tracingShutdownTimeout)
		defer cancel()
		_ = tp.Shutdown(ctx)
	}, nil
}
