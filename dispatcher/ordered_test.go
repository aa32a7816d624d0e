package dispatcher

import (
	"testing"
	"time"
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
