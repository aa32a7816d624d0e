package pulsetype_test

import (
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
			next := defaultPolicy().Decide(tt.number, tt.res)
			if next.Retry != tt.wantRetry || next.EndStatus != tt.wantEnd || next.EndError != tt.wantErr {
				t.Fatalf("Decide(%d, %+v) = %+v, want retry %v, end %q with %v", tt.number, tt.res, next, tt.wantRetry, tt.wantEnd, tt.wantErr)
			}
			if next.Retry && next.Delay <= 0 {
				t.Fatalf("Decide retries after %s, want > 0", next.Delay)
			}
		})
	}
	// The receiver's Retry-After raises the delay.
	next := defaultPolicy().Decide(1, pulsetype.AttemptResult{Status: pulsetype.StatusError, Error: handler, RetryAfter: 30 * time.Second})
	if !next.Retry || next.Delay != 30*time.Second {
		t.Fatalf("Decide with Retry-After 30s = %+v, want a retry after 30s", next)
	}
}
