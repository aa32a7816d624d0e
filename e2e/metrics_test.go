package e2e

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/pulse-sidecar/pulse/e2e/internal/harness"
)

func scrape(t *testing.T, s *harness.Sidecar) string {
	t.Helper()
	resp, err := http.Get(s.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("GET /metrics = %d", resp.StatusCode)
	}
	return string(b)
}

// Label sets stay bounded: 1,000 events with distinct topics add no series (the topic is not a label), and a
// registered consumer group's attempt series exist at 0 before its first event.
func TestMetricsLabelSetsAreBounded(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv())
	s.RegisterEndpoint(t, "billing", map[string]any{"url": "http://127.0.0.1:9/hook", "topics": []string{"payment.captured"}})
	before := scrape(t, s)
	var arr []string
	for i := range 1000 {
		arr = append(arr, fmt.Sprintf(`{"topic":"topic.%04d","data":%d}`, i, i))
	}
	if code := harness.Do(t, "POST", s.URL+"/v1/events", "["+strings.Join(arr, ",")+"]", nil); code != 202 {
		t.Fatalf("publish = %d", code)
	}
	after := scrape(t, s)
	t.Logf("/metrics: %d bytes before, %d bytes after 1,000 events with distinct topics", len(before), len(after))
	if strings.Contains(after, "topic.0") {
		t.Errorf("/metrics has per-topic series")
	}
	if len(after)-len(before) > 2048 {
		t.Errorf("/metrics grew by %d bytes with 1,000 topics, want a bounded size", len(after)-len(before))
	}
	for _, want := range []string{
		"pulse_events_published_total 1000\n",
		`pulse_attempts_total{consumer_group="billing",outcome="success"} 0`,
		`pulse_attempts_total{consumer_group="billing",outcome="retry"} 0`,
		`pulse_attempts_total{consumer_group="billing",outcome="error"} 0`,
		`pulse_attempt_duration_seconds_count{consumer_group="billing"} 0`,
		`pulse_deliveries_pending{consumer_group="billing"} 0`,
		`pulse_oldest_pending_delivery_age_seconds{consumer_group="billing"} 0`,
	} {
		if !strings.Contains(before+after, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if strings.Contains(after, "pulse_deliveries_total") {
		t.Errorf("/metrics still has pulse_deliveries_total (it counts attempts: pulse_attempts_total)")
	}
}
