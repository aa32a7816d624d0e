package dispatcher

import (
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pulse-sidecar/pulse/internal/testwait"
	"github.com/pulse-sidecar/pulse/pulsetype"
	"github.com/pulse-sidecar/pulse/webhook"
)

// A backlog is drained from due windows: a few reads of the database (the first small, the next of the
// largest window once the first was full) feed every claim, where a read per claim would cost one read per
// batch.
func TestLoopDrainsABacklogFromFewReads(t *testing.T) {
	t.Parallel()
	store := newMemStore(endpoint(t, "g", []string{"t"}), endpoint(t, "h", []string{"t"}))
	store.publish(events("e", "t", 300)...) // 600 due attempts
	snd := &sender{}
	// Polls an hour apart: every read the drain makes is its own, none an idle poll's.
	d := New(store, snd, noReconciler{}, idleKeeper(), Options{Owner: "me", Workers: 32, PollInterval: time.Hour,
		LeaseTimeout: time.Minute, ShutdownTimeout: 5 * time.Second, Logger: zerolog.Nop()})
	if err := d.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)
	testwait.Eventually(t, 20*time.Second, "600 deliveries to succeed", func() bool { return store.succeeded("g")+store.succeeded("h") == 600 })
	reads, claims := store.count("DueAttempts"), store.count("ClaimAttempts")
	t.Logf("600 deliveries: %d reads of due attempts, %d claims", reads, claims)
	if claims < 600/maxClaimBatch {
		t.Fatalf("%d claims for 600 attempts, want at least %d (batches of at most %d)", claims, 600/maxClaimBatch, maxClaimBatch)
	}
	// Windows of 64 and then maxDueWindow hold the 600; the read that finds the window empty at the end is
	// one more.
	if reads > 4 || 4*reads > claims {
		t.Fatalf("%d reads of due attempts for %d claims, want at most 4 and a quarter of the claims", reads, claims)
	}
}

// A window that holds only attempts of a group at its maxConcurrency does not hold up the others: a poll
// reads the other groups' due attempts.
func TestLoopClaimsOtherGroupsPastASaturatedWindow(t *testing.T) {
	t.Parallel()
	one := 1
	store := newMemStore(endpoint(t, "slow", []string{"s"}, func(ep *pulsetype.Endpoint) { ep.MaxConcurrency = &one }),
		endpoint(t, "g", []string{"t"}))
	store.publish(events("s", "s", 2*minDueWindow)...) // more than the first window: it holds slow's only
	release := make(chan struct{})
	snd := &sender{answer: func(r webhook.Request) webhook.Result {
		if r.ConsumerGroup == "slow" {
			<-release
		}
		return webhook.Result{Outcome: webhook.OutcomeSuccess, HTTPStatus: 200}
	}}
	startDispatcher(t, store, snd, 8)
	t.Cleanup(func() { close(release) }) // before the dispatcher's Stop, which waits for the POSTs
	testwait.Eventually(t, 10*time.Second, "slow's first POST", func() bool { started, _ := snd.posts(); return started == 1 })
	store.publish(events("t", "t", 3)...)
	testwait.Eventually(t, 10*time.Second, "g's 3 deliveries to succeed while slow is at its limit", func() bool { return store.succeeded("g") == 3 })
	if _, peak := snd.peaks(); peak["slow"] != 1 {
		t.Fatalf("slow ran %d POSTs at once, want its maxConcurrency 1", peak["slow"])
	}
}
