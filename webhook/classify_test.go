package webhook

import (
	"math"
	"testing"
	"time"
)

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		in   string
		want time.Duration
	}{
		{"", 0},
		{"0", 0},
		{"120", 120 * time.Second},
		{" 7 ", 7 * time.Second},
		{"99999999999999999999", time.Duration(math.MaxInt64)},
		{"-5", 0},
		{"+5", 0},
		{"1.5", 0},
		{"soon", 0},
		{"Sat, 01 Mar 2025 12:01:30 GMT", 90 * time.Second},    // IMF-fixdate
		{"Saturday, 01-Mar-25 12:00:10 GMT", 10 * time.Second}, // RFC 850
		{"Sat Mar  1 12:00:05 2025", 5 * time.Second},          // asctime
		{"Sat, 01 Mar 2025 11:59:59 GMT", 0},                   // past
		{"Sat, 01 Mar 2025 12:00:00 GMT", 0},                   // now
		{"2025-03-01T12:05:00Z", 0},                            // not an HTTP-date
	}
	for _, tt := range tests {
		if got := parseRetryAfter(tt.in, now); got != tt.want {
			t.Errorf("parseRetryAfter(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
}

func TestClassifyStatus(t *testing.T) {
	t.Parallel()
	terminal := map[int]bool{400: true, 404: true, 405: true, 410: true, 413: true, 415: true, 422: true, 501: true}
	for code := 100; code <= 599; code++ {
		want := OutcomeRetry
		switch {
		case code >= 200 && code <= 299:
			want = OutcomeSuccess
		case terminal[code]:
			want = OutcomeTerminal
		}
		if got := classifyStatus(code); got != want {
			t.Errorf("classifyStatus(%d) = %v, want %v", code, got, want)
		}
	}
}

func TestOutcomeString(t *testing.T) {
	t.Parallel()
	for o, want := range map[Outcome]string{
		OutcomeSuccess: "success", OutcomeRetry: "retry", OutcomeTerminal: "terminal", Outcome(7): "Outcome(7)",
	} {
		if got := o.String(); got != want {
			t.Errorf("Outcome(%d).String() = %q, want %q", int(o), got, want)
		}
	}
}
