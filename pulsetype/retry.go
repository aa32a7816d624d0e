package pulsetype

import (
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
}

// Jitter is the randomization factor applied to every backoff delay (±20%).
const Jitter = 0.2

// Next returns whether attempt number (1-based), failed with code, gets a successor, and the delay before it.
// It returns retry=false when the failure is terminal: a terminal response, at-most-once, event_expired,
// endpoint_deleted, unsubscribed, or retries used up. The delay is the exponential backoff of cenkalti/backoff with ±20% jitter, capped by
// MaxDelay, then raised (never lowered) to retryAfter, and capped by MaxDelay again.
func (p RetryPolicy) Next(number int, code ErrorCode, terminal bool, retryAfter time.Duration) (retry bool, delay time.Duration) {
	if terminal || p.AtMostOnce || code.Ended() || number > p.MaxRetries {
		return false, 0
	}
	b := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(max(p.Delay, time.Millisecond)),
		backoff.WithMultiplier(max(p.Multiplier, 1)),
		backoff.WithMaxInterval(max(p.MaxDelay, time.Millisecond)),
		backoff.WithRandomizationFactor(Jitter),
		backoff.WithMaxElapsedTime(0),
	)
	for range number {
		delay = b.NextBackOff()
	}
	delay = min(max(delay, retryAfter), p.MaxDelay)
	return true, delay
}

// Decide returns what follows attempt number (1-based; Attempt.Counted, so that attempts that disabled their
// endpoint do not count) that ended with res (docs/delivery.md, "Lifecycle"): success ends the delivery; an
// attempt ended by a cancel (code cancelled) ends it as cancelled; an attempt answered 410 Gone (code
// endpoint_gone, which disabled the endpoint) gets attempt number+1 at once, Uncounted (it waits for the
// endpoint's resume), except with at-most-once, where it ends the delivery; another
// error gets attempt number+1 while Next allows it (res.Terminal, res.Error's code and res.RetryAfter
// count), and otherwise ends the delivery with res.Error. It reads nothing and writes nothing.
func (p RetryPolicy) Decide(number int, res AttemptResult) NextStep {
	if res.Status == StatusSuccess {
		return NextStep{EndStatus: StatusSuccess}
	}
	if res.Error.CodeOrEmpty() == CodeCancelled { // a cancel that stopped before ending its delivery
		return NextStep{EndStatus: StatusCancelled, EndError: res.Error}
	}
	if res.Error.CodeOrEmpty() == CodeEndpointGone && !p.AtMostOnce {
		return NextStep{Retry: true, Uncounted: true}
	}
	if retry, delay := p.Next(number, res.Error.CodeOrEmpty(), res.Terminal, res.RetryAfter); retry {
		return NextStep{Retry: true, Delay: delay}
	}
	return NextStep{EndStatus: StatusError, EndError: res.Error}
}
