package e2e

import (
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/pulse-sidecar/pulse/e2e/internal/harness"
	"github.com/pulse-sidecar/pulse/internal/testwait"
)

// otlpReceiver is an OTLP/HTTP trace receiver on loopback that keeps every span it got.
type otlpReceiver struct {
	*httptest.Server
	mu    sync.Mutex
	spans []*tracepb.Span
}

func newOTLPReceiver(t *testing.T) *otlpReceiver {
	o := &otlpReceiver{}
	o.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req coltrace.ExportTraceServiceRequest
		if r.URL.Path != "/v1/traces" || proto.Unmarshal(body, &req) != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		o.mu.Lock()
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				o.spans = append(o.spans, ss.Spans...)
			}
		}
		o.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(nil)
	}))
	t.Cleanup(o.Close)
	return o
}

// named returns the spans received with this name.
func (o *otlpReceiver) named(name string) []*tracepb.Span {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []*tracepb.Span
	for _, s := range o.spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// A traceparent on the publish request is kept with the event: each webhook POST carries the traceparent of
// its own attempt span in the same trace, and the publish and attempt spans (group, attempt number, HTTP
// status, outcome) are exported over OTLP/HTTP to OTEL_EXPORTER_OTLP_ENDPOINT.
func TestTracePropagatesFromPublishToEachAttempt(t *testing.T) {
	b := harness.Setup(t)
	collector := newOTLPReceiver(t)
	s := b.Start(b.FastEnv(map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": collector.URL}))
	rcv := harness.NewReceiver(t, 500, 200)
	s.RegisterEndpoint(t, "g", map[string]any{"url": rcv.URL, "topics": []string{"t"}, "retryDelay": "1ms"})
	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	req, _ := http.NewRequest("POST", s.URL+"/v1/events", strings.NewReader(`{"topic":"t","data":1}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", "00-"+traceID+"-"+parentID+"-01")
	req.Header.Set("tracestate", "vendor=x")
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 202 {
		t.Fatalf("publish = %v, %v", resp, err)
	}
	resp.Body.Close()
	testwait.Eventually(t, 20*time.Second, "two attempts", func() bool { return len(rcv.Received()) == 2 })
	var spanIDs []string
	for i, r := range rcv.Received() {
		parts := strings.Split(r.Header.Get("traceparent"), "-")
		if len(parts) != 4 || parts[1] != traceID || parts[2] == parentID {
			t.Fatalf("POST %d carries traceparent %q, want a child span of trace %s", i+1, r.Header.Get("traceparent"), traceID)
		}
		if r.Header.Get("tracestate") != "vendor=x" {
			t.Errorf("POST %d carries tracestate %q", i+1, r.Header.Get("tracestate"))
		}
		spanIDs = append(spanIDs, parts[2])
	}
	if spanIDs[0] == spanIDs[1] {
		t.Errorf("both attempts carry span %s; want one span per attempt", spanIDs[0])
	}
	testwait.Eventually(t, 20*time.Second, "the publish span and two attempt spans exported", func() bool {
		return len(collector.named("publish")) == 1 && len(collector.named("deliver t")) == 2
	})
	pub := collector.named("publish")[0]
	if hex.EncodeToString(pub.TraceId) != traceID || hex.EncodeToString(pub.ParentSpanId) != parentID {
		t.Errorf("publish span in trace %x with parent %x", pub.TraceId, pub.ParentSpanId)
	}
	for _, sp := range collector.named("deliver t") {
		if hex.EncodeToString(sp.TraceId) != traceID || string(sp.ParentSpanId) != string(pub.SpanId) {
			t.Errorf("attempt span %x in trace %x with parent %x, want a child of the publish span %x", sp.SpanId, sp.TraceId, sp.ParentSpanId, pub.SpanId)
		}
		id := hex.EncodeToString(sp.SpanId)
		if id != spanIDs[0] && id != spanIDs[1] {
			t.Errorf("attempt span %s is not one a POST carried (%v)", id, spanIDs)
		}
		got := map[string]string{}
		for _, kv := range sp.Attributes {
			got[kv.Key] = kv.Value.String()
		}
		if !strings.Contains(got["pulse.consumer_group"], `"g"`) || got["pulse.attempt"] == "" || got["http.response.status_code"] == "" || got["pulse.outcome"] == "" {
			t.Errorf("attempt span attributes %v", got)
		}
	}
}
