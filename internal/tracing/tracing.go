// Package tracing sets up the sidecar's OpenTelemetry traces: W3C trace context (traceparent, tracestate)
// kept with each published event, a span for each publish and each webhook attempt, and export over
// OTLP/HTTP only when an endpoint is configured.
package tracing

import (
	"context"
	"strings"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Name is the instrumentation scope of the sidecar's spans.
const Name = "github.com/pulse-sidecar/pulse"

// Propagator reads and writes the W3C traceparent and tracestate headers.
var Propagator = propagation.TraceContext{}

// NewProvider returns the sidecar's tracer provider. Spans always get ids, so a webhook POST carries the
// traceparent of its own span even when nothing is exported; with endpoint (an OTLP/HTTP base URL such as
// http://collector:4318) they are batched and exported to <endpoint>/v1/traces, the exporter reading the
// other OTEL_EXPORTER_OTLP_* variables itself. Shut it down (it flushes) when the sidecar stops. It does
// not block on the collector; an unreachable one costs dropped spans, never deliveries.
func NewProvider(ctx context.Context, endpoint string) (*sdktrace.TracerProvider, error) {
	opts := []sdktrace.TracerProviderOption{sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample()))}
	if endpoint != "" {
		exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(strings.TrimRight(endpoint, "/")+"/v1/traces"))
		if err != nil {
			return nil, err
		}
		opts = append(opts, sdktrace.WithBatcher(exp))
	}
	return sdktrace.NewTracerProvider(opts...), nil
}

// Carried returns the W3C trace context of ctx's span as stored with an event: traceparent and tracestate
// (empty when ctx has no valid span).
func Carried(ctx context.Context) (traceparent, tracestate string) {
	c := propagation.MapCarrier{}
	Propagator.Inject(ctx, c)
	return c["traceparent"], c["tracestate"]
}

// Resume returns ctx with the remote span context stored as traceparent and tracestate as its parent;
// ctx unchanged when traceparent is empty or malformed.
func Resume(ctx context.Context, traceparent, tracestate string) context.Context {
	if traceparent == "" {
		return ctx
	}
	return Propagator.Extract(ctx, propagation.MapCarrier{"traceparent": traceparent, "tracestate": tracestate})
}

// Tracer returns the sidecar's tracer of tp, or a no-op one when tp is nil.
func Tracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		return noop.NewTracerProvider().Tracer(Name)
	}
	return tp.Tracer(Name)
}
