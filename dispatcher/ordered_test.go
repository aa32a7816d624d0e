package dispatcher

import (
	"testing"
	"time"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// An ordered group's next round of head claims waits while heads its last round leased here run, as long
// after that round as it took, at most maxRoundGap; with nothing of the group in flight, or after the wait,
// it starts at once.
func TestRoundGapWaitsForTheLastRoundsHeads(t *testing.T) {
	t.Parallel()
	l := &loop{slots: newSlots(8, func(string) int { return 8 }, func() {})}
	if gap := l.roundGap("g"); gap != 0 {
		t.Errorf("gap before any round = %v, want 0", gap)
	}
	l.lastRound = map[string]round{"g": {ended: time.Now(), took: 100 * time.Millisecond}}
	if gap := l.roundGap("g"); gap != 0 {
		t.Errorf("gap with nothing in flight = %v, want 0", gap)
	}
	release := l.slots.acquire("g")
	defer release()
	if gap := l.roundGap("g"); gap <= 0 || gap > 100*time.Millisecond {
		t.Errorf("gap with a head in flight after a round of 100ms = %v, want in (0, 100ms]", gap)
	}
	l.lastRound["g"] = round{ended: time.Now(), took: time.Hour}
	if gap := l.roundGap("g"); gap <= 0 || gap > maxRoundGap {
		t.Errorf("gap after a round of an hour = %v, want in (0, %v]", gap, maxRoundGap)
	}
	l.lastRound["g"] = round{ended: time.Now().Add(-time.Second), took: 100 * time.Millisecond}
	if gap := l.roundGap("g"); gap > 0 {
		t.Errorf("gap a second after a round of 100ms = %v, want none", gap)
	}
	if gap := l.roundGap("other"); gap != 0 {
		t.Errorf("gap of a group without a round = %v, want 0", gap)
	}
}

// After a round that found heads settling, the lines are looked at again when the first head published
// here settles, or foreignSettleGrace after the first one published through another replica settles,
// whichever comes first; a wait of another kind that comes first is kept, and without settling heads the
// round's wait is.
func TestLookAgainLetsThePublishingReplicaClaimFirst(t *testing.T) {
	t.Parallel()
	l := &loop{}
	l.fannedOut("here", time.Now())
	ms := time.Millisecond
	cases := []struct {
		name string
		c    pulsetype.HeadClaims
		want time.Duration
	}{
		{"published here", pulsetype.HeadClaims{Wait: 30 * ms, Settling: map[string]time.Duration{"here": 30 * ms}}, 30 * ms},
		{"published elsewhere", pulsetype.HeadClaims{Wait: 10 * ms, Settling: map[string]time.Duration{"there": 10 * ms}}, 10*ms + foreignSettleGrace},
		{"both, here later", pulsetype.HeadClaims{Wait: 10 * ms, Settling: map[string]time.Duration{"there": 10 * ms, "here": 40 * ms}}, 40 * ms},
		{"both, here much later", pulsetype.HeadClaims{Wait: 10 * ms, Settling: map[string]time.Duration{"there": 10 * ms, "here": time.Second}},
			10*ms + foreignSettleGrace},
		{"a line that moved first", pulsetype.HeadClaims{Wait: ms, Settling: map[string]time.Duration{"there": 10 * ms}}, ms},
		{"nothing settling", pulsetype.HeadClaims{Wait: 5 * ms}, 5 * ms},
	}
	for _, c := range cases {
		if got := l.lookAgain(c.c); got != c.want {
			t.Errorf("%s: lookAgain = %v, want %v", c.name, got, c.want)
		}
	}
}

// fannedOut forgets the events it noted more than settleMemory ago.
func TestFannedOutForgetsOldEvents(t *testing.T) {
	t.Parallel()
	l := &loop{}
	start := time.Now()
	l.fannedOut("old", start)
	l.fannedOut("new", start.Add(settleMemory+time.Second))
	if _, ok := l.settlingHere["old"]; ok {
		t.Error("an event noted more than settleMemory ago is still remembered")
	}
	if _, ok := l.settlingHere["new"]; !ok {
		t.Error("the event just noted is not remembered")
	}
}
