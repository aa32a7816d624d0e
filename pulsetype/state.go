package pulsetype

import "time"

// EndpointState is whether a consumer group's endpoint receives POSTs (docs/operating.md, "Pausing and disabling an
// endpoint").
type EndpointState string

// States of an endpoint. Only an active endpoint is POSTed to; the due deliveries of a paused or disabled
// one wait, their attempts unconsumed, until POST .../resume makes it active again.
const (
	EndpointActive   EndpointState = "active"
	EndpointPaused   EndpointState = "paused"   // by POST /v1/endpoints/{consumerGroup}/pause
	EndpointDisabled EndpointState = "disabled" // by the sidecar: see StateReason
)

// StateReason says why an endpoint is not active.
type StateReason string

// Reasons of a paused or disabled endpoint.
const (
	ReasonPaused  StateReason = "paused"  // paused through the API
	ReasonGone    StateReason = "gone"    // the receiver answered 410 Gone
	ReasonFailing StateReason = "failing" // every attempt failed for the endpoint's disableAfter
)

// CodeEndpointGone is the error of an attempt answered with 410 Gone: it disabled its endpoint, and its
// delivery waits for POST .../resume without the attempt counting against maxRetries.
const CodeEndpointGone ErrorCode = "endpoint_gone"

// MaxDisableAfter bounds an endpoint's disableAfter.
const MaxDisableAfter = 30 * 24 * time.Hour

// MaxRateLimit bounds an endpoint's rateLimit, in POSTs per second.
const MaxRateLimit = 10000

// Active reports whether the endpoint may be POSTed to (state active, or none stored).
func (e *Endpoint) Active() bool { return e.State == "" || e.State == EndpointActive }

// Counted returns the attempt's number less the earlier attempts of its delivery that do not count against
// maxRetries (CodeEndpointGone): the number the retry policy decides with.
func (a *Attempt) Counted() int { return a.Number - a.Uncounted }

// NextRef returns the reference that attempt a's successor is created with when next (a retry) follows it:
// a's, with Uncounted one more when next.Uncounted, FirstAttemptAt a's FirstStart (the retry window goes on),
// and DueBy the end of that window when next has one.
func NextRef(a *Attempt, next NextStep) DeliveryRef {
	ref := a.Ref()
	ref.FirstAttemptAt = a.FirstStart()
	if next.Window > 0 {
		ref.DueBy = ref.FirstAttemptAt.Add(next.Window)
	}
	if next.Uncounted {
		ref.Uncounted++
	}
	return ref
}
