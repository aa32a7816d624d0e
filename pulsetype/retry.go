package pulsetype

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// RetryPolicy decides whether a failed attempt gets a successor and when. Defaults and the delay formula
// (delay × multiplier^(attempt−1)) are those of docs/delivery.md, "Retries".
type RetryPolicy struct {
	AtMostOnce bool
	MaxRetries int           // retries after the first attempt
	Delay      time.Duration // delay before attempt 2
	Multiplier float64       // growth per attempt, ≥ 1
	MaxDelay   time.Duration // cap of any delay, Retry-After included
	// MaxDuration is the retry window (the endpoint's maxRetryDuration): no attempt is scheduled later than
	// this after the delivery's first attempt started (Attempt.FirstStart). 0 is no window.
	MaxDuration time.Duration
}

// Jitter is the randomization factor applied to every backoff delay (±20%).
const Jitter = 0.2

// CodeRetryWindow ends a delivery whose next attempt would have been due after its endpoint's
// maxRetryDuration, counted from the delivery's first attempt (docs/delivery.md, "Retries"). The attempt
// that failed keeps its own error; the delivery carries this code.
const CodeRetryWindow ErrorCode = "retry_window_exceeded"

// Next returns whether attempt number (1-based), failed with code, gets a successor, and the delay before it.
// It returns retry=false when the failure is terminal: a terminal response, at-most-once, event_expired,
// endpoint_deleted, unsubscribed, or retries used up. It does not apply the retry window (Decide does).
// The delay is Backoff's, then raised (never lowered) to retryAfter, and capped by MaxDelay again.
func (p RetryPolicy) Next(number int, code ErrorCode, terminal bool, retryAfter time.Duration) (retry bool, delay time.Duration) {
	if terminal || p.AtMostOnce || code.Ended() || number > p.MaxRetries {
		return false, 0
	}
	return true, min(max(p.Backoff(number), retryAfter), p.MaxDelay)
}

// Backoff returns the delay after failed attempt number (1-based), before Retry-After counts:
// Delay × Multiplier^(number−1), capped by MaxDelay, varied by ±Jitter uniformly and capped by MaxDelay
// again. Delay and MaxDelay below a millisecond count as a millisecond, a Multiplier below 1 (or NaN) as 1.
// It is computed in closed form in floating point and clamped before it becomes a Duration, so no
// multiplier, count or delay overflows it (an infinite product is MaxDelay) and its cost does not grow with
// number. It is safe for concurrent use.
func (p RetryPolicy) Backoff(number int) time.Duration {
	initial := float64(max(p.Delay, time.Millisecond))
	ceiling := float64(max(p.MaxDelay, time.Millisecond))
	m := p.Multiplier
	if !(m >= 1) { // NaN too
		m = 1
	}
	base := ceiling
	if n := max(number, 1) - 1; n == 0 || m == 1 {
		base = min(initial, ceiling)
	} else if growth := math.Pow(m, float64(n)); !math.IsInf(growth, 1) && growth < ceiling/initial {
		base = initial * growth
	}
	jittered := base * (1 - Jitter + 2*Jitter*rand.Float64())
	return clampDuration(min(jittered, ceiling))
}

// clampDuration converts f nanoseconds to a Duration, clamped to [0, math.MaxInt64]: float64(MaxInt64)
// rounds up to 2⁶³, which does not convert.
func clampDuration(f float64) time.Duration {
	switch {
	case !(f > 0):
		return 0
	case f >= math.MaxInt64:
		return math.MaxInt64
	default:
		return time.Duration(f)
	}
}

// Decide returns what follows attempt number (1-based; Attempt.Counted, so that attempts that disabled their
// endpoint do not count) that ended with res, elapsed after the delivery's first attempt started
// (Attempt.FirstStart; docs/delivery.md, "Lifecycle"): success ends the delivery; an
// attempt ended by a cancel (code cancelled) ends it as cancelled; an attempt answered 410 Gone (code
// endpoint_gone, which disabled the endpoint) gets attempt number+1 at once, Uncounted (it waits for the
// endpoint's resume), except with at-most-once, where it ends the delivery; another
// error gets attempt number+1 while Next allows it (res.Terminal, res.Error's code and res.RetryAfter
// count), and otherwise ends the delivery with res.Error. A successor that would be due (elapsed plus its
// delay) after MaxDuration is not scheduled: the delivery ends with CodeRetryWindow. It reads nothing and
// writes nothing.
func (p RetryPolicy) Decide(number int, res AttemptResult, elapsed time.Duration) NextStep {
	if res.Status == StatusSuccess {
		return NextStep{EndStatus: StatusSuccess}
	}
	if res.Error.CodeOrEmpty() == CodeCancelled { // a cancel that stopped before ending its delivery
		return NextStep{EndStatus: StatusCancelled, EndError: res.Error}
	}
	next := NextStep{EndStatus: StatusError, EndError: res.Error}
	if res.Error.CodeOrEmpty() == CodeEndpointGone && !p.AtMostOnce {
		next = NextStep{Retry: true, Uncounted: true}
	} else if retry, delay := p.Next(number, res.Error.CodeOrEmpty(), res.Terminal, res.RetryAfter); retry {
		next = NextStep{Retry: true, Delay: delay}
	}
	if next.Retry && p.MaxDuration > 0 && elapsed > p.MaxDuration-next.Delay { // elapsed+delay, without overflow
		last := "the attempt failed"
		if res.Error != nil {
			last = fmt.Sprintf("last error %s: %s", res.Error.Code, res.Error.Message)
		}
		return NextStep{EndStatus: StatusError, EndError: &ErrorInfo{Code: CodeRetryWindow, Message: fmt.Sprintf(
			"%s after the first attempt, a retry in %s would pass maxRetryDuration %s (%s)",
			elapsed.Round(time.Millisecond), next.Delay.Round(time.Millisecond), p.MaxDuration, last)}}
	}
	return next
}
