package httpapi

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

var fixedWidth = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$`)

// Every timestamp of a delivery, an attempt and an endpoint is written as pulsetype.FormatTime: RFC 3339
// UTC with three fraction digits; strings are not HTML-escaped.
func TestTimestampsHaveThreeFractionDigits(t *testing.T) {
	t.Parallel()
	at := time.Date(2025, 3, 1, 12, 0, 15, 500_000_000, time.UTC)
	ended := at.Add(20 * time.Millisecond)
	for name, v := range map[string]any{
		"delivery": deliveryOf(&pulsetype.Delivery{ID: "d", EventCreatedAt: at, CreatedAt: at, UpdatedAt: at, EndedAt: &ended}),
		"attempt":  attemptOf(&pulsetype.Attempt{Number: 1, CreatedAt: at, NextAttemptAt: at, StartedAt: &at, EndedAt: &ended}),
		"endpoint": EndpointOf(&pulsetype.Endpoint{ConsumerGroup: "g", CreatedAt: at, UpdatedAt: at, Headers: map[string]string{"A": "<x&y>"}}),
	} {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var fields map[string]any
		if err := json.Unmarshal(b, &fields); err != nil {
			t.Fatalf("%s: %s: %v", name, b, err)
		}
		n := 0
		for k, f := range fields {
			if strings.HasSuffix(k, "At") {
				n++
				if s, _ := f.(string); !fixedWidth.MatchString(s) {
					t.Errorf("%s: %s = %v, want RFC 3339 UTC with three fraction digits", name, k, f)
				}
			}
		}
		if n < 2 {
			t.Errorf("%s: %s has %d timestamps, want at least 2", name, b, n)
		}
	}
}

func TestDurationJSON(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in      string
		want    time.Duration
		wantErr bool
	}{
		{in: `"1s"`, want: time.Second},
		{in: `"1h30m"`, want: 90 * time.Minute},
		{in: `1500`, want: 1500 * time.Millisecond},
		{in: `"soon"`, wantErr: true},
		{in: `true`, wantErr: true},
	}
	for _, tt := range tests {
		var d Duration
		err := json.Unmarshal([]byte(tt.in), &d)
		if (err != nil) != tt.wantErr {
			t.Errorf("Unmarshal(%s) error = %v, wantErr %v", tt.in, err, tt.wantErr)
			continue
		}
		if !tt.wantErr && time.Duration(d) != tt.want {
			t.Errorf("Unmarshal(%s) = %s, want %s", tt.in, time.Duration(d), tt.want)
		}
	}
	b, err := json.Marshal(Duration(90 * time.Second))
	if err != nil || string(b) != `"1m30s"` {
		t.Errorf("Marshal(90s) = %s, %v; want \"1m30s\"", b, err)
	}
}

// A read shows the end of a rotation's overlap, never the previous secret.
func TestRedactedEndpointJSON(t *testing.T) {
	t.Parallel()
	until := time.Date(2025, 3, 1, 13, 0, 0, 0, time.UTC)
	e := pulsetype.Endpoint{Secret: "whsec_new", PreviousSecret: "whsec_old", PreviousSecretExpiresAt: &until}
	out, err := json.Marshal(redacted(&e))
	if err != nil || strings.Contains(string(out), "whsec_old") || !strings.Contains(string(out), `"previousSecretExpiresAt":"2025-03-01T13:00:00.000Z"`) {
		t.Errorf("Redacted endpoint = %s (%v), want no previous secret and the end of the overlap", out, err)
	}
}
