package pulsetype

import (
	"fmt"
	"math"
	"time"

	"github.com/cenkalti/backoff/v4"
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
// that failed keeps its own error; the delivery carries this code. A retry launched past the window (held
// back by a disabled or paused endpoint) ends with it too, attempt and delivery, without a POST.
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

// MaxBackoff bounds the delays and caps Backoff computes with (30 days, above the 7 days maxRetryDelay may
// be): within it the exponential backoff's arithmetic, jitter included, stays far from overflowing a Duration.
const MaxBackoff = 30 * 24 * time.Hour

// Backoff returns the delay after failed attempt number (1-based), before Retry-After counts: the exponential
// backoff of cenkalti/backoff (Delay × Multiplier^(number−1), capped by MaxDelay, varied by ±Jitter), capped
// by MaxDelay again. Delay and MaxDelay count as at least a millisecond and at most MaxBackoff, a Multiplier
// below 1 (or NaN) as 1, an infinite one as the largest float64, so no multiplier, count or delay overflows
// it; the backoff is stepped only until it reaches its cap, so its cost does not grow with number beyond
// that. It is safe for concurrent use.
func (p RetryPolicy) Backoff(number int) time.Duration {
	initial := min(max(p.Delay, time.Millisecond), MaxBackoff)
	ceiling := min(max(p.MaxDelay, time.Millisecond), MaxBackoff)
	m := p.Multiplier
	switch {
	case !(m >= 1): // NaN too
		m = 1
	case math.IsInf(m, 1):
		m = math.MaxFloat64
	}
	b := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(initial),
		backoff.WithMultiplier(m),
		backoff.WithMaxInterval(ceiling),
		backoff.WithRandomizationFactor(Jitter),
		backoff.WithMaxElapsedTime(0),
	)
	// After steps the interval is at its cap and stays there: at most log_m(ceiling/initial) + 1 of them.
	steps := 1
	if m > 1 && ceiling > initial {
		steps = int(min(math.Ceil(math.Log(float64(ceiling)/float64(initial))/math.Log(m)), 64)) + 1
	}
	var delay time.Duration
	for range min(max(number, 1), steps) {
		delay = b.NextBackOff()
	}
	return min(delay, ceiling)
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
	if next.Retry && p.MaxDuration > 0 {
		next.Window = p.MaxDuration // the store caps the successor's due time at the window's end (DeliveryRef.DueBy)
	}
	return next
}
