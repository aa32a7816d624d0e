package pulsetype_test

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

var fixedWidth = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$`)

// Every timestamp is RFC 3339 UTC with exactly three fraction digits, whatever the time's zone and however
// many trailing zeros its milliseconds have; digits below the millisecond are cut as BSON cuts them.
func TestTimestampsHaveThreeFractionDigits(t *testing.T) {
	t.Parallel()
	paris := time.FixedZone("CET", 3600)
	tests := []struct {
		in   time.Time
		want string
	}{
		{time.Date(2025, 3, 1, 12, 0, 15, 500_000_000, time.UTC), "2025-03-01T12:00:15.500Z"},
		{time.Date(2025, 3, 1, 12, 0, 15, 140_000_000, time.UTC), "2025-03-01T12:00:15.140Z"},
		{time.Date(2025, 3, 1, 12, 0, 15, 0, time.UTC), "2025-03-01T12:00:15.000Z"},
		{time.Date(2025, 3, 1, 12, 0, 15, 133_999_999, time.UTC), "2025-03-01T12:00:15.133Z"},
		{time.Date(2025, 3, 1, 13, 0, 15, 7_000_000, paris), "2025-03-01T12:00:15.007Z"},
	}
	for _, tt := range tests {
		if got := pulsetype.FormatTime(tt.in); got != tt.want {
			t.Errorf("FormatTime(%v) = %s, want %s", tt.in, got, tt.want)
		}
		env := (&pulsetype.Event{ID: "e", Topic: "t", Data: []byte("1"), CreatedAt: tt.in}).Envelope()
		if want := `"createdAt":"` + tt.want + `"`; !strings.Contains(string(env), want) {
			t.Errorf("Envelope() = %s, want it to hold %s", env, want)
		}
	}

	at := time.Date(2025, 3, 1, 12, 0, 15, 500_000_000, time.UTC)
	ended := at.Add(20 * time.Millisecond)
	for name, v := range map[string]any{
		"delivery": &pulsetype.Delivery{ID: "d", EventCreatedAt: at, CreatedAt: at, UpdatedAt: at, EndedAt: &ended},
		"attempt":  &pulsetype.Attempt{Number: 1, CreatedAt: at, NextAttemptAt: at, StartedAt: &at, EndedAt: &ended},
		"endpoint": pulsetype.Endpoint{ConsumerGroup: "g", CreatedAt: at, UpdatedAt: at, Headers: map[string]string{"A": "<x&y>"}},
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
