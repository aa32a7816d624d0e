package pulsetype_test

import (
	"testing"
	"time"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// Every timestamp is RFC 3339 UTC with exactly three fraction digits, whatever the time's zone and however
// many trailing zeros its milliseconds have; digits below the millisecond are cut as BSON cuts them. The
// webhook body (webhook.Envelope) and the API's answers (httpapi.Timestamp) write times with FormatTime.
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
	}
}
