package dispatcher

import (
	"math"
	"testing"
	"time"
)

// A rate-limited group has one token (the burst) and takes one per POST; without a token it is left out
// and the loop is woken at its next token; a group without a limit is never held back, and a changed rate
// applies at once.
func TestRateLimitsAdmitByToken(t *testing.T) {
	t.Parallel()
	rates := map[string]float64{"slow": 20}
	woken := make(chan struct{}, 10)
	r := newRateLimits(func(g string) float64 { return rates[g] }, func() { woken <- struct{}{} })
	if n := r.available("fast"); n != math.MaxInt || !r.take("fast") {
		t.Fatalf("a group without a limit has %d tokens, want no limit", n)
	}
	if !r.allows("slow", 0) || r.allows("slow", 1) {
		t.Fatal("a rate-limited group admits other than one POST (its burst)")
	}
	if !r.take("slow") || r.take("slow") {
		t.Fatal("a rate-limited group took other than its one token")
	}
	if r.available("slow") != 0 {
		t.Fatal("a token is left after the burst")
	}
	select {
	case <-woken: // the next token comes 50 ms later
	case <-time.After(5 * time.Second):
		t.Fatal("the loop was not woken at the next token")
	}
	if !r.take("slow") {
		t.Fatal("no token after the wake-up")
	}
	rates["slow"] = 0
	if n := r.available("slow"); n != math.MaxInt {
		t.Fatalf("a removed limit still holds the group back (%d)", n)
	}
}
