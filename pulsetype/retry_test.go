package pulsetype_test

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// defaultPolicy is the policy of an at-least-once endpoint with the contract's defaults.
func defaultPolicy() pulsetype.RetryPolicy {
	return pulsetype.RetryPolicy{
		MaxRetries: pulsetype.DefaultMaxRetries,
		Delay:      pulsetype.DefaultRetryDelay,
		Multiplier: pulsetype.DefaultRetryBackoffMultiplier,
		MaxDelay:   pulsetype.DefaultMaxRetryDelay,
	}
}

func TestRetryPolicyNextStops(t *testing.T) {
	t.Parallel()
	atMostOnce := defaultPolicy()
	atMostOnce.AtMostOnce, atMostOnce.MaxRetries = true, 0
	noRetries := defaultPolicy()
	noRetries.MaxRetries = 0
	tests := []struct {
		name      string
		policy    pulsetype.RetryPolicy
		number    int
		code      pulsetype.ErrorCode
		terminal  bool
		wantRetry bool
	}{
		{name: "first failure retries", policy: defaultPolicy(), number: 1, code: pulsetype.CodeHandlerError, wantRetry: true},
		{name: "last retry still allowed", policy: defaultPolicy(), number: pulsetype.DefaultMaxRetries, code: pulsetype.CodeHandlerError, wantRetry: true},
		{name: "retries used up", policy: defaultPolicy(), number: pulsetype.DefaultMaxRetries + 1, code: pulsetype.CodeHandlerError},
		{name: "maxRetries 0", policy: noRetries, number: 1, code: pulsetype.CodeHandlerError},
		{name: "at-most-once", policy: atMostOnce, number: 1, code: pulsetype.CodeHandlerError},
		{name: "event expired", policy: defaultPolicy(), number: 1, code: pulsetype.CodeEventExpired},
		{name: "terminal response", policy: defaultPolicy(), number: 1, code: pulsetype.CodeHandlerError, terminal: true},
		{name: "worker lost retries", policy: defaultPolicy(), number: 2, code: pulsetype.CodeWorkerLost, wantRetry: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			retry, delay := tt.policy.Next(tt.number, tt.code, tt.terminal, 0)
			if retry != tt.wantRetry {
				t.Fatalf("Next(%d, %q, terminal=%v) retry = %v, want %v", tt.number, tt.code, tt.terminal, retry, tt.wantRetry)
			}
			if !retry && delay != 0 {
				t.Errorf("Next without retry returned delay %s, want 0", delay)
			}
			if retry && delay <= 0 {
				t.Errorf("Next with retry returned delay %s, want > 0", delay)
			}
		})
	}
}

func TestRetryPolicyNextBackoff(t *testing.T) {
	t.Parallel()
	const samples = 200
	tests := []struct {
		name   string
		policy pulsetype.RetryPolicy
		number int
		base   time.Duration // the delay before jitter
	}{
		{"attempt 1", defaultPolicy(), 1, time.Second},
		{"attempt 2", defaultPolicy(), 2, 2 * time.Second},
		{"attempt 3", defaultPolicy(), 3, 4 * time.Second},
		{"attempt 6", defaultPolicy(), 6, 32 * time.Second},
		{"multiplier 3", pulsetype.RetryPolicy{MaxRetries: 10, Delay: 100 * time.Millisecond, Multiplier: 3, MaxDelay: time.Hour}, 4, 2700 * time.Millisecond},
		{"multiplier 1 is constant", pulsetype.RetryPolicy{MaxRetries: 10, Delay: 500 * time.Millisecond, Multiplier: 1, MaxDelay: time.Hour}, 7, 500 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			lo := time.Duration(float64(tt.base) * (1 - pulsetype.Jitter))
			hi := time.Duration(float64(tt.base) * (1 + pulsetype.Jitter))
			seen := map[time.Duration]bool{}
			for range samples {
				retry, delay := tt.policy.Next(tt.number, pulsetype.CodeHandlerError, false, 0)
				if !retry {
					t.Fatalf("Next(%d) retry = false, want true", tt.number)
				}
				if delay < lo || delay > hi {
					t.Fatalf("Next(%d) delay = %s, want within ±20%% of %s [%s, %s]", tt.number, delay, tt.base, lo, hi)
				}
				seen[delay] = true
			}
			if len(seen) < 2 {
				t.Errorf("Next(%d) returned the same delay %d times: no jitter", tt.number, samples)
			}
		})
	}
}

func TestRetryPolicyNextCapsAndRetryAfter(t *testing.T) {
	t.Parallel()
	capped := pulsetype.RetryPolicy{MaxRetries: 20, Delay: time.Second, Multiplier: 10, MaxDelay: 5 * time.Second}
	tests := []struct {
		name       string
		policy     pulsetype.RetryPolicy
		number     int
		retryAfter time.Duration
		lo, hi     time.Duration
	}{
		{name: "growth capped by MaxDelay", policy: capped, number: 3, lo: 4 * time.Second, hi: 5 * time.Second},
		{name: "far attempt capped by MaxDelay", policy: capped, number: 20, lo: 4 * time.Second, hi: 5 * time.Second},
		{name: "Retry-After raises the delay", policy: defaultPolicy(), number: 1, retryAfter: 30 * time.Second, lo: 30 * time.Second, hi: 30 * time.Second},
		{name: "Retry-After never lowers the delay", policy: defaultPolicy(), number: 4, retryAfter: time.Second, lo: 6400 * time.Millisecond, hi: 9600 * time.Millisecond},
		{name: "Retry-After capped by MaxDelay", policy: capped, number: 1, retryAfter: time.Hour, lo: 5 * time.Second, hi: 5 * time.Second},
		{name: "Retry-After capped by the default MaxDelay", policy: defaultPolicy(), number: 1, retryAfter: 48 * time.Hour, lo: time.Hour, hi: time.Hour},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			for range 100 {
				retry, delay := tt.policy.Next(tt.number, pulsetype.CodeHandlerError, false, tt.retryAfter)
				if !retry {
					t.Fatalf("Next(%d) retry = false, want true", tt.number)
				}
				if delay < tt.lo || delay > tt.hi {
					t.Fatalf("Next(%d, retryAfter=%s) delay = %s, want in [%s, %s]", tt.number, tt.retryAfter, delay, tt.lo, tt.hi)
				}
			}
		})
	}
}

// Decide ends a delivery on success, schedules the next attempt while the policy allows, and otherwise ends
// the delivery with the attempt's error.
func TestRetryPolicyDecide(t *testing.T) {
	t.Parallel()
	handler := &pulsetype.ErrorInfo{Code: pulsetype.CodeHandlerError, Message: "HTTP 500"}
	cancelled := &pulsetype.ErrorInfo{Code: pulsetype.CodeCancelled, Message: "cancelled"}
	tests := []struct {
		name      string
		number    int
		res       pulsetype.AttemptResult
		wantRetry bool
		wantEnd   pulsetype.Status
		wantErr   *pulsetype.ErrorInfo
	}{
		{name: "success ends", number: 1, res: pulsetype.AttemptResult{Status: pulsetype.StatusSuccess}, wantEnd: pulsetype.StatusSuccess},
		{name: "error retries", number: 1, res: pulsetype.AttemptResult{Status: pulsetype.StatusError, Error: handler}, wantRetry: true},
		{name: "terminal error ends", number: 1, res: pulsetype.AttemptResult{Status: pulsetype.StatusError, Error: handler, Terminal: true},
			wantEnd: pulsetype.StatusError, wantErr: handler},
		{name: "a cancelled attempt ends as cancelled", number: 1, res: pulsetype.AttemptResult{Status: pulsetype.StatusError, Error: cancelled},
			wantEnd: pulsetype.StatusCancelled, wantErr: cancelled},
		{name: "retries used up end", number: pulsetype.DefaultMaxRetries + 1, res: pulsetype.AttemptResult{Status: pulsetype.StatusError, Error: handler},
			wantEnd: pulsetype.StatusError, wantErr: handler},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			next := defaultPolicy().Decide(tt.number, tt.res, 0)
			if next.Retry != tt.wantRetry || next.EndStatus != tt.wantEnd || next.EndError != tt.wantErr {
				t.Fatalf("Decide(%d, %+v) = %+v, want retry %v, end %q with %v", tt.number, tt.res, next, tt.wantRetry, tt.wantEnd, tt.wantErr)
			}
			if next.Retry && next.Delay <= 0 {
				t.Fatalf("Decide retries after %s, want > 0", next.Delay)
			}
		})
	}
	// The receiver's Retry-After raises the delay.
	next := defaultPolicy().Decide(1, pulsetype.AttemptResult{Status: pulsetype.StatusError, Error: handler, RetryAfter: 30 * time.Second}, 0)
	if !next.Retry || next.Delay != 30*time.Second {
		t.Fatalf("Decide with Retry-After 30s = %+v, want a retry after 30s", next)
	}
}

// Backoff never overflows: extreme multipliers, counts, delays and caps give a delay in [0, MaxDelay], the
// cap itself once the product passes it, and Next still answers at once for the largest count.
func TestRetryPolicyBackoffExtremes(t *testing.T) {
	t.Parallel()
	const maxDur = time.Duration(math.MaxInt64)
	tests := []struct {
		name   string
		policy pulsetype.RetryPolicy
		number int
		lo, hi time.Duration
	}{
		{"huge multiplier", pulsetype.RetryPolicy{Delay: time.Second, Multiplier: math.MaxFloat64, MaxDelay: time.Hour}, 3,
			time.Duration(float64(time.Hour) * (1 - pulsetype.Jitter)), time.Hour},
		{"infinite multiplier", pulsetype.RetryPolicy{Delay: time.Second, Multiplier: math.Inf(1), MaxDelay: time.Hour}, 2,
			time.Duration(float64(time.Hour) * (1 - pulsetype.Jitter)), time.Hour},
		{"NaN multiplier counts as 1", pulsetype.RetryPolicy{Delay: time.Second, Multiplier: math.NaN(), MaxDelay: time.Hour}, 50,
			800 * time.Millisecond, 1200 * time.Millisecond},
		{"largest count", pulsetype.RetryPolicy{Delay: time.Second, Multiplier: 100, MaxDelay: 7 * 24 * time.Hour}, math.MaxInt,
			time.Duration(float64(7*24*time.Hour) * (1 - pulsetype.Jitter)), 7 * 24 * time.Hour},
		{"largest delay and cap", pulsetype.RetryPolicy{Delay: maxDur, Multiplier: 100, MaxDelay: maxDur}, math.MaxInt,
			time.Duration(float64(pulsetype.MaxBackoff) * (1 - pulsetype.Jitter)), pulsetype.MaxBackoff},
		{"largest delay, first retry", pulsetype.RetryPolicy{Delay: maxDur, Multiplier: 2, MaxDelay: maxDur}, 1,
			time.Duration(float64(pulsetype.MaxBackoff) * (1 - pulsetype.Jitter)), pulsetype.MaxBackoff},
		{"delay above the cap", pulsetype.RetryPolicy{Delay: 48 * time.Hour, Multiplier: 2, MaxDelay: time.Hour}, 1,
			time.Duration(float64(time.Hour) * (1 - pulsetype.Jitter)), time.Hour},
		{"negative delay and cap", pulsetype.RetryPolicy{Delay: -time.Hour, Multiplier: 3, MaxDelay: -time.Hour}, 10,
			time.Duration(float64(time.Millisecond) * (1 - pulsetype.Jitter)), time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			for range 100 {
				if d := tt.policy.Backoff(tt.number); d < tt.lo || d > tt.hi {
					t.Fatalf("Backoff(%d) = %s, want in [%s, %s]", tt.number, d, tt.lo, tt.hi)
				}
			}
			p := tt.policy
			p.MaxRetries = math.MaxInt
			retry, delay := p.Next(tt.number, pulsetype.CodeHandlerError, false, maxDur)
			if want := p.MaxDelay; !retry || delay != want {
				t.Fatalf("Next(%d, Retry-After max) = %v, %s, want a retry after MaxDelay %s", tt.number, retry, delay, want)
			}
		})
	}
}

// Decide schedules no attempt after maxRetryDuration: a retry due inside the window is scheduled, one due
// after it ends the delivery with CodeRetryWindow and keeps nothing of the attempt's own error code; a 410
// Gone retry (delay 0) is no exception once the window has passed, and no window (0) never ends one.
func TestRetryPolicyDecideWindow(t *testing.T) {
	t.Parallel()
	handler := &pulsetype.ErrorInfo{Code: pulsetype.CodeHandlerError, Message: "HTTP 500"}
	failed := pulsetype.AttemptResult{Status: pulsetype.StatusError, Error: handler}
	gone := pulsetype.AttemptResult{Status: pulsetype.StatusError, Error: &pulsetype.ErrorInfo{Code: pulsetype.CodeEndpointGone, Message: "HTTP 410"}}
	// Delay 10 s, constant: the next attempt is due elapsed + 10 s (±20%: 8 s to 12 s).
	p := pulsetype.RetryPolicy{MaxRetries: 100, Delay: 10 * time.Second, Multiplier: 1, MaxDelay: time.Hour, MaxDuration: time.Minute}
	tests := []struct {
		name      string
		policy    pulsetype.RetryPolicy
		res       pulsetype.AttemptResult
		elapsed   time.Duration
		wantRetry bool
	}{
		{name: "due well inside the window", policy: p, res: failed, elapsed: 10 * time.Second, wantRetry: true},
		{name: "due after the window even at the shortest jitter", policy: p, res: failed, elapsed: 53 * time.Second},
		{name: "window already passed", policy: p, res: failed, elapsed: time.Hour},
		{name: "410 Gone inside the window", policy: p, res: gone, elapsed: 59 * time.Second, wantRetry: true},
		{name: "410 Gone after the window", policy: p, res: gone, elapsed: 61 * time.Second},
		{name: "no window", policy: func() pulsetype.RetryPolicy { q := p; q.MaxDuration = 0; return q }(), res: failed,
			elapsed: 365 * 24 * time.Hour, wantRetry: true},
		{name: "largest elapsed", policy: p, res: failed, elapsed: time.Duration(math.MaxInt64)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			for range 50 {
				next := tt.policy.Decide(1, tt.res, tt.elapsed)
				if next.Retry != tt.wantRetry {
					t.Fatalf("Decide(elapsed %s) = %+v, want retry %v", tt.elapsed, next, tt.wantRetry)
				}
				if next.Retry {
					if due := tt.elapsed + next.Delay; tt.policy.MaxDuration > 0 && due > tt.policy.MaxDuration {
						t.Fatalf("Decide scheduled a retry due %s after the first attempt, past the window %s", due, tt.policy.MaxDuration)
					}
					continue
				}
				if next.EndStatus != pulsetype.StatusError || next.EndError.CodeOrEmpty() != pulsetype.CodeRetryWindow ||
					!strings.Contains(next.EndError.Message, "maxRetryDuration 1m0s") || !strings.Contains(next.EndError.Message, tt.res.Error.Message) {
					t.Fatalf("Decide past the window = %+v (error %+v), want error %s naming the window and the last error", next, next.EndError, pulsetype.CodeRetryWindow)
				}
			}
		})
	}
	// Retries used up inside the window end with the attempt's own error, not the window's.
	q := p
	q.MaxRetries = 1
	if next := q.Decide(2, failed, time.Second); next.Retry || next.EndError != handler {
		t.Fatalf("Decide with retries used up = %+v, want the end with the attempt's error", next)
	}
}
