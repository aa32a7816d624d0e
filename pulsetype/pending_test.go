package pulsetype_test

import (
	"strings"
	"testing"
	"time"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// PendingReasonOf names each reason a pending delivery waits, the first that holds winning, with its time
// in UTC in the message.
func TestPendingReasonOf(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 12, 32, 14, 0, time.UTC)
	past, future := now.Add(-time.Minute), now.Add(time.Minute)
	leased := now.Add(30 * time.Second)
	expired := now.Add(-time.Second)
	active := &pulsetype.Endpoint{ConsumerGroup: "g", State: pulsetype.EndpointActive}
	paused := &pulsetype.Endpoint{ConsumerGroup: "g", State: pulsetype.EndpointPaused, StateReason: "paused", StateSince: &past}
	disabled := &pulsetype.Endpoint{ConsumerGroup: "g", State: pulsetype.EndpointDisabled, StateReason: "gone", StateSince: &past}
	ordered := &pulsetype.Endpoint{ConsumerGroup: "g", Ordered: true}
	limited := &pulsetype.Endpoint{ConsumerGroup: "g", RateLimit: 2.5}
	due := &pulsetype.Attempt{Number: 1, Status: pulsetype.StatusPending, NextAttemptAt: past}
	retry := &pulsetype.Attempt{Number: 3, Status: pulsetype.StatusPending, NextAttemptAt: future}
	first := &pulsetype.Attempt{Number: 1, Status: pulsetype.StatusPending, NextAttemptAt: future}
	running := &pulsetype.Attempt{Number: 2, Status: pulsetype.StatusPending, NextAttemptAt: past, StartedAt: &past, LeasedUntil: &leased}
	lost := &pulsetype.Attempt{Number: 2, Status: pulsetype.StatusPending, NextAttemptAt: past, StartedAt: &past, LeasedUntil: &expired}
	for _, tt := range []struct {
		name     string
		in       pulsetype.PendingInput
		code     pulsetype.PendingCode
		at       time.Time
		contains string
	}{
		{"no endpoint", pulsetype.PendingInput{Attempt: due}, pulsetype.PendingNoEndpoint, time.Time{}, "no endpoint"},
		{"no attempt", pulsetype.PendingInput{Endpoint: active}, pulsetype.PendingCreating, time.Time{}, "being created"},
		{"in flight", pulsetype.PendingInput{Endpoint: active, Attempt: running}, pulsetype.PendingInFlight, past, "POST in flight since 2026-12-01 12:31:14 UTC"},
		{"in flight while paused", pulsetype.PendingInput{Endpoint: paused, Attempt: running}, pulsetype.PendingInFlight, past, "in flight"},
		{"lease expired", pulsetype.PendingInput{Endpoint: active, Attempt: lost}, pulsetype.PendingLeaseExpired, expired, "worker_lost"},
		{"paused", pulsetype.PendingInput{Endpoint: paused, Attempt: retry}, pulsetype.PendingPaused, past, "paused since 2026-12-01 12:31:14 UTC"},
		{"disabled", pulsetype.PendingInput{Endpoint: disabled, Attempt: due}, pulsetype.PendingDisabled, past, "disabled the endpoint (gone)"},
		{"retry", pulsetype.PendingInput{Endpoint: active, Attempt: retry}, pulsetype.PendingRetry, future, "attempt 3: waiting for its retry at 2026-12-01 12:33:14 UTC"},
		{"first due later", pulsetype.PendingInput{Endpoint: active, Attempt: first}, pulsetype.PendingScheduled, future, "due at"},
		{"behind the head", pulsetype.PendingInput{DeliveryID: "d2", Endpoint: ordered, Attempt: due, LineHead: "d1"}, pulsetype.PendingBehindHead, time.Time{}, "delivery d1 goes first"},
		{"the head itself", pulsetype.PendingInput{DeliveryID: "d1", Endpoint: ordered, Attempt: due, LineHead: "d1"}, pulsetype.PendingDue, past, "waiting for a worker"},
		{"rate limited", pulsetype.PendingInput{Endpoint: limited, Attempt: due}, pulsetype.PendingRateLimited, past, "rate limited to 2.5 POSTs a second"},
		{"due", pulsetype.PendingInput{Endpoint: active, Attempt: due}, pulsetype.PendingDue, past, "due since 2026-12-01 12:31:14 UTC"},
	} {
		tt.in.Now = now
		got := pulsetype.PendingReasonOf(tt.in)
		if got.Code != tt.code || !strings.Contains(got.Message, tt.contains) {
			t.Errorf("%s: %s %q, want %s containing %q", tt.name, got.Code, got.Message, tt.code, tt.contains)
		}
		switch {
		case tt.at.IsZero() && got.At != nil:
			t.Errorf("%s: at %v, want none", tt.name, got.At)
		case !tt.at.IsZero() && (got.At == nil || !got.At.Equal(tt.at)):
			t.Errorf("%s: at %v, want %v", tt.name, got.At, tt.at)
		}
		if tt.code == pulsetype.PendingBehindHead && got.Head != "d1" {
			t.Errorf("%s: head %q, want d1", tt.name, got.Head)
		}
	}
}
