package e2e

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pulse-sidecar/pulse/e2e/internal/harness"
)

var fixedWidthTime = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$`)

// checkTimes fails the test for every string under a key ending in "At" (at any depth of raw) that is not
// RFC 3339 UTC with exactly three fraction digits, and returns how many it checked.
func checkTimes(t *testing.T, what string, raw []byte) int {
	t.Helper()
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	n := 0
	var walk func(key string, v any)
	walk = func(key string, v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, f := range x {
				walk(k, f)
			}
		case []any:
			for _, f := range x {
				walk(key, f)
			}
		case string:
			if strings.HasSuffix(key, "At") {
				n++
				if !fixedWidthTime.MatchString(x) {
					t.Errorf("%s: %s = %q, want RFC 3339 UTC with three fraction digits", what, key, x)
				}
			}
		}
	}
	walk("", v)
	return n
}

// Every timestamp of the API and the webhook body's createdAt have one fixed width, and the webhook body is
// byte-identical on the first attempt (built from the event in memory) and a retry (read back from the
// database).
func TestTimestampsAreFixedWidthEverywhere(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv())
	rcv := harness.NewReceiver(t, 500, 200)
	s.RegisterEndpoint(t, "g", map[string]any{"url": rcv.URL, "topics": []string{"t"}, "retryDelay": "50ms"})
	var raw json.RawMessage
	if code := harness.Do(t, "POST", s.URL+"/v1/events", `[{"topic":"t","data":1}]`, &raw); code != 202 {
		t.Fatalf("publish = %d %s", code, raw)
	}
	var published []struct{ ID, CreatedAt string }
	_ = json.Unmarshal(raw, &published)
	checked := checkTimes(t, "publish answer", raw)
	id := published[0].ID
	d := s.WaitDelivery(t, id, "g", 30*time.Second)
	got := rcv.Received()
	if len(got) != 2 || !bytes.Equal(got[0].Body, got[1].Body) {
		t.Fatalf("%d POSTs; bodies differ between attempts:\n%s\n%s", len(got), got[0].Body, got[len(got)-1].Body)
	}
	var body struct{ CreatedAt string }
	_ = json.Unmarshal(got[0].Body, &body)
	if body.CreatedAt != published[0].CreatedAt {
		t.Errorf("webhook createdAt %q differs from the publish answer's %q", body.CreatedAt, published[0].CreatedAt)
	}
	checked += checkTimes(t, "webhook body", got[0].Body)
	for _, path := range []string{"/v1/events/" + id, "/v1/deliveries/" + d.ID, "/v1/deliveries?consumerGroup=g", "/v1/endpoints/g", "/v1/endpoints"} {
		raw = nil
		if code := harness.Do(t, "GET", s.URL+path, nil, &raw); code != 200 {
			t.Fatalf("GET %s = %d", path, code)
		}
		checked += checkTimes(t, "GET "+path, raw)
	}
	if checked < 15 {
		t.Errorf("checked %d timestamps, want every one of the answers (at least 15)", checked)
	}
}
