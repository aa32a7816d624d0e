package pulsetype

import (
	"fmt"
	"strconv"
	"time"
)

// PendingCode says in one word why a pending delivery has not ended yet (PendingReason).
type PendingCode string

// The reasons of a pending delivery, in the order PendingReasonOf asks them.
const (
	PendingNoEndpoint   PendingCode = "no_endpoint"     // its group has no endpoint: the delivery is being ended
	PendingCreating     PendingCode = "creating"        // no attempt yet: the fan-out or its repair creates it
	PendingInFlight     PendingCode = "in_flight"       // a worker holds the lease: the POST runs since At
	PendingLeaseExpired PendingCode = "lease_expired"   // the lease expired at At: the reaper records worker_lost
	PendingPaused       PendingCode = "paused"          // the endpoint is paused (since At)
	PendingDisabled     PendingCode = "disabled"        // the sidecar disabled the endpoint (since At)
	PendingRetry        PendingCode = "retry_scheduled" // a retry waits until At
	PendingScheduled    PendingCode = "scheduled"       // the first attempt is due at At
	PendingBehindHead   PendingCode = "behind_head"     // an earlier delivery of its ordered line goes first
	PendingRateLimited  PendingCode = "rate_limited"    // due since At, behind the endpoint's rateLimit
	PendingDue          PendingCode = "due"             // due since At, waiting for a worker
)

// PendingReason is why a pending delivery waits, in words: the code, a sentence that says it with its times
// in UTC ("paused since 2026-12-01 12:32:14 UTC"), the time the sentence names (when it names one) and, for
// PendingBehindHead, the delivery at the head of the line.
type PendingReason struct {
	Code    PendingCode
	Message string
	At      *time.Time
	Head    string
}

// PendingInput is what PendingReasonOf reads: the delivery's id, its group's endpoint (nil when the group
// has none), its latest attempt (nil when none exists yet; its LeaseState, when set, is taken as the lease's
// state, else it is judged at Now), the id of the head of its ordered line (for an ordered endpoint; "" when
// unknown) and the time to judge at.
type PendingInput struct {
	DeliveryID string
	Endpoint   *Endpoint
	Attempt    *Attempt
	LineHead   string
	Now        time.Time
}

// UTCTime is the format of the times PendingReason's messages name, as the console shows every time.
const UTCTime = "2006-01-02 15:04:05 UTC"

// PendingReasonOf returns why a pending delivery waits. The first that holds wins: no endpoint; no attempt
// yet; a POST in flight (a paused endpoint lets it finish); a lease that expired; the endpoint paused or
// disabled; a retry (or first attempt) not due yet; an earlier delivery at the head of its ordered line;
// the endpoint's rateLimit (the limit is per replica and its wait is not stored: the reason names the limit
// that holds a due attempt back, not an observed wait); and otherwise due, waiting for a worker.
func PendingReasonOf(in PendingInput) PendingReason {
	at := func(code PendingCode, t time.Time, format string, args ...any) PendingReason {
		t = t.UTC()
		return PendingReason{Code: code, Message: fmt.Sprintf(format, append(args, t.Format(UTCTime))...), At: &t}
	}
	a, ep := in.Attempt, in.Endpoint
	switch {
	case ep == nil:
		return PendingReason{Code: PendingNoEndpoint, Message: "its consumer group has no endpoint: the delivery is being ended"}
	case a == nil:
		return PendingReason{Code: PendingCreating, Message: "its first attempt is being created"}
	}
	lease := a.LeaseState // as the store judged it, at the database's clock
	if lease == "" {
		lease = a.LeaseStateAt(in.Now)
	}
	switch lease {
	case LeaseActive:
		since := a.CreatedAt
		if a.StartedAt != nil {
			since = *a.StartedAt
		}
		return at(PendingInFlight, since, "attempt %d: POST in flight since %s", a.Number)
	case LeaseExpired:
		return at(PendingLeaseExpired, *a.LeasedUntil, "attempt %d: its worker stopped renewing the lease, which expired at %s; the reaper records it as worker_lost", a.Number)
	}
	switch ep.State {
	case EndpointPaused, EndpointDisabled:
		code, word := PendingPaused, "the endpoint is paused"
		if ep.State == EndpointDisabled {
			code, word = PendingDisabled, "the sidecar disabled the endpoint ("+string(ep.StateReason)+")"
		}
		if ep.StateSince != nil {
			return at(code, *ep.StateSince, word+" since %s")
		}
		return PendingReason{Code: code, Message: word}
	}
	if a.NextAttemptAt.After(in.Now) {
		if a.Number > 1 {
			return at(PendingRetry, a.NextAttemptAt, "attempt %d: waiting for its retry at %s", a.Number)
		}
		return at(PendingScheduled, a.NextAttemptAt, "attempt %d is due at %s", a.Number)
	}
	if ep.Ordered && in.LineHead != "" && in.LineHead != in.DeliveryID {
		return PendingReason{Code: PendingBehindHead, Message: "behind the head of its ordered line: delivery " + in.LineHead + " goes first", Head: in.LineHead}
	}
	if ep.RateLimit > 0 {
		return at(PendingRateLimited, a.NextAttemptAt, "attempt %d: due since %s, rate limited to "+strconv.FormatFloat(ep.RateLimit, 'f', -1, 64)+" POSTs a second per replica", a.Number)
	}
	return at(PendingDue, a.NextAttemptAt, "attempt %d: due since %s, waiting for a worker", a.Number)
}
