package tracing

import (
	"context"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// A span started from a stored traceparent is its child in the same trace, and Carried gives the new
// span's own traceparent (what a webhook POST carries); the in-memory exporter sees both links.
func TestResumeAndCarried(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	ctx, span := Tracer(tp).Start(Resume(context.Background(), parent, "k=v"), "deliver t", trace.WithSpanKind(trace.SpanKindClient))
	tp2, ts := Carried(ctx)
	span.End()
	if !strings.HasPrefix(tp2, "00-4bf92f3577b34da6a3ce929d0e0e4736-") || tp2 == parent || ts != "k=v" {
		t.Errorf("Carried = %q, %q; want a child of %s with tracestate k=v", tp2, ts, parent)
	}
	spans := exp.GetSpans()
	if len(spans) != 1 || spans[0].Parent.SpanID().String() != "00f067aa0ba902b7" || !spans[0].Parent.IsRemote() {
		t.Fatalf("exported %+v", spans)
	}
	if !strings.Contains(tp2, spans[0].SpanContext.SpanID().String()) {
		t.Errorf("Carried %q does not name the span %s", tp2, spans[0].SpanContext.SpanID())
	}
	if got := Resume(context.Background(), "", ""); trace.SpanContextFromContext(got).IsValid() {
		t.Error("Resume of an empty traceparent made a span context")
	}
	if p, _ := Carried(context.Background()); p != "" {
		t.Errorf("Carried without a span = %q", p)
	}
}
