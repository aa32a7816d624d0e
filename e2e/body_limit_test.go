package e2e

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/pulse-sidecar/pulse/config"
	"github.com/pulse-sidecar/pulse/e2e/internal/harness"
)

// The largest event the largest PULSE_MAX_BODY_BYTES admits (longest id and topic, 64 headers with the
// longest keys, data filling the rest of the body) is stored as one document and read back whole; a byte
// more is 413.
func TestLargestEventFitsOneDocument(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv(map[string]string{"PULSE_MAX_BODY_BYTES": strconv.Itoa(config.MaxMaxBodyBytes)}))
	id := strings.Repeat("i", 128)
	headers := map[string]string{}
	for i := range 64 {
		headers[fmt.Sprintf("%03d", i)+strings.Repeat("k", 253)] = "v"
	}
	hj, _ := json.Marshal(headers)
	prefix := `{"id":"` + id + `","topic":"` + strings.Repeat("t", 200) + `","headers":` + string(hj) + `,"data":"`
	fill := config.MaxMaxBodyBytes - len(prefix) - len(`"}`)
	body := prefix + strings.Repeat("x", fill) + `"}`
	if len(body) != config.MaxMaxBodyBytes {
		t.Fatalf("body is %d bytes, want %d", len(body), config.MaxMaxBodyBytes)
	}
	var e errorView
	if code := harness.Do(t, "POST", s.URL+"/v1/events", body[:len(body)-2]+`x"}`, &e); code != 413 || e.Error.Code != "body_too_large" {
		t.Fatalf("a body one byte over the limit = %d %+v, want 413", code, e)
	}
	if code := harness.Do(t, "POST", s.URL+"/v1/events", body, &e); code != 202 {
		t.Fatalf("the largest event = %d %+v, want 202", code, e)
	}
	var ev struct {
		Data    string
		Headers map[string]string
	}
	if code := harness.Do(t, "GET", s.URL+"/v1/events/"+id, nil, &ev); code != 200 || len(ev.Data) != fill || len(ev.Headers) != 64 {
		t.Fatalf("GET the largest event = %d, %d bytes of data and %d headers; want %d and 64", code, len(ev.Data), len(ev.Headers), fill)
	}
}
