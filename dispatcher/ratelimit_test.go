package dispatcher

import (
	"math"
	"testing"
	"time"

	"github.com/pulse-sidecar/pulse/internal/testwait"
	"github.com/pulse-sidecar/pulse/pulsetype"
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

// A group's rate limit holds from its first POST: a group registered through this process a moment before
// its events are published (its endpoint not yet in the dispatcher's cache) gets one POST, not one POST
// unlimited and then a limiter with a full token.
func TestRateLimitHoldsFromAGroupsFirstPost(t *testing.T) {
	t.Parallel()
	store := newMemStore(endpoint(t, "other", []string{"x"}))
	snd := &sender{}
	d := startDispatcher(t, store, snd, 8)
	testwait.Eventually(t, 10*time.Second, "the loop to poll", func() bool { return store.count("DueAttempts") > 0 })
	store.mu.Lock()
	store.endpoints["rl"] = endpoint(t, "rl", []string{"t"}, func(ep *pulsetype.Endpoint) { ep.RateLimit = 0.01 })
	store.mu.Unlock()
	d.EndpointChanged("rl") // the PUT's notice, then its events at once
	d.Published(events("e", "t", 3))
	testwait.Eventually(t, 10*time.Second, "the first POST", func() bool { started, _ := snd.posts(); return started >= 1 })
	polls := store.count("DueAttempts")
	testwait.Eventually(t, 10*time.Second, "ten more turns of the loop", func() bool { return store.count("DueAttempts") >= polls+10 })
	if started, _ := snd.posts(); started != 1 {
		t.Fatalf("%d POSTs to a group limited to one per 100 s, want 1", started)
	}
}
