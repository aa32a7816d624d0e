package dispatcher

import (
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pulse-sidecar/pulse/internal/testwait"
)

// Two replicas started in the same instant do not poll in lockstep: their poll intervals are jittered, so
// most polls of one fall well apart from every poll of the other.
func TestReplicasStartedTogetherPollApart(t *testing.T) {
	t.Parallel()
	const poll = 50 * time.Millisecond
	stores := []*memStore{newMemStore(), newMemStore()}
	ds := make([]*Dispatcher, len(stores))
	for i, s := range stores {
		ds[i] = New(s, &sender{}, noReconciler{}, idleKeeper(), Options{Owner: "o", Workers: 4, PollInterval: poll, LeaseTimeout: time.Second,
			ShutdownTimeout: time.Second, Logger: zerolog.Nop()})
	}
	for _, d := range ds {
		_ = d.Start(t.Context())
	}
	testwait.Eventually(t, 20*time.Second, "each loop to poll 40 times", func() bool {
		return len(stores[0].times()) >= 40 && len(stores[1].times()) >= 40
	})
	for _, d := range ds {
		d.Stop()
	}
	a, b := stores[0].times(), stores[1].times()
	together := 0
	for _, x := range a[:40] {
		for _, y := range b {
			if d := x.Sub(y); d > -3*time.Millisecond && d < 3*time.Millisecond {
				together++
				break
			}
		}
	}
	t.Logf("%d of 40 polls of one replica fell within 3 ms of a poll of the other", together)
	if together > 20 {
		t.Fatalf("%d of 40 polls of two replicas started together coincide: they poll in lockstep", together)
	}
}
