package httpapi

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// An attempt whose POST took under a millisecond shows durationMs 0; one without a POST shows none.
func TestAttemptDurationShownWhenAPOSTRan(t *testing.T) {
	for _, c := range []struct {
		ms   *int64
		want string // a substring of the answer, or "" for none with durationMs
	}{
		{new(int64(0)), `"durationMs":0,`},
		{new(int64(12)), `"durationMs":12,`},
		{nil, ""},
	} {
		b, err := json.Marshal(attemptOf(&pulsetype.Attempt{Number: 1, Status: pulsetype.StatusSuccess, HTTPStatus: 200, DurationMs: c.ms}))
		if err != nil {
			t.Fatal(err)
		}
		got := string(b)
		if c.want != "" && !strings.Contains(got, c.want) || c.want == "" && strings.Contains(got, "durationMs") {
			t.Errorf("attempt with DurationMs %v answered %s, want %q", c.ms, got, c.want)
		}
	}
}
