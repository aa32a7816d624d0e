package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pulse-sidecar/pulse/internal/testwait"
	"github.com/pulse-sidecar/pulse/pulsetype"
)

// Clock.Sync measures the database's offset from the local clock, and keeps a tight measurement over a
// later one taken through a slow round trip.
func TestClockFollowsTheDatabase(t *testing.T) {
	t.Parallel()
	local := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return local }
	advance := func(d time.Duration) { mu.Lock(); local = local.Add(d); mu.Unlock() }
	c := NewClock(now)
	// server is a database running ahead of the local clock, whose answer takes oneWay to arrive and as long
	// to come back.
	server := func(ahead, oneWay time.Duration) func(context.Context) (time.Time, error) {
		return func(context.Context) (time.Time, error) {
			advance(oneWay)
			st := now().Add(ahead)
			advance(oneWay)
			return st, nil
		}
	}
	// The server runs 5 minutes ahead; each round trip takes 10ms.
	if err := c.Sync(context.Background(), server(5*time.Minute, 5*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if off := c.Offset(); off != 5*time.Minute {
		t.Fatalf("offset = %s, want 5m", off)
	}
	if got := c.Now().Sub(now()); got != 5*time.Minute {
		t.Fatalf("Now is %s ahead of the local clock, want 5m", got)
	}
	// A measurement through a 3 s round trip (overloaded database) does not replace the tight one.
	if err := c.Sync(context.Background(), server(5*time.Minute+time.Second, 1500*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if off := c.Offset(); off != 5*time.Minute {
		t.Fatalf("offset = %s after a slow sample, want the tight 5m kept", off)
	}
	if err := c.Sync(context.Background(), func(context.Context) (time.Time, error) { return time.Time{}, errors.New("down") }); err == nil {
		t.Fatal("Sync with every sample failing returned nil")
	}
}

// The keeper renews held leases every third of the lease timeout and cancels the work of a lost one.
func TestKeeperRenewsAndCancelsLostLeases(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	renewed := map[pulsetype.LeaseKey]int{}
	lost := map[pulsetype.LeaseKey]bool{}
	kept := pulsetype.LeaseKey{AttemptID: "a1", Token: "t1"}
	stolen := pulsetype.LeaseKey{AttemptID: "a2", Token: "t1"} // one claim batch: same token, other attempt
	renew := func(_ context.Context, tokens []pulsetype.LeaseKey) ([]pulsetype.LeaseKey, error) {
		mu.Lock()
		defer mu.Unlock()
		var out []pulsetype.LeaseKey
		for _, tok := range tokens {
			renewed[tok]++
			if lost[tok] {
				out = append(out, tok)
			}
		}
		return out, nil
	}
	k := NewKeeper(renew, 60*time.Millisecond, nil, zerolog.Nop())
	if k.Interval() != 20*time.Millisecond {
		t.Fatalf("interval = %s, want a third of the lease timeout", k.Interval())
	}
	if err := k.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer k.Stop()
	keptCtx, keptCancel := context.WithCancelCause(context.Background())
	defer keptCancel(nil)
	lostCtx, lostCancel := context.WithCancelCause(context.Background())
	defer lostCancel(nil)
	k.Hold(kept, 0, keptCancel)
	k.Hold(stolen, 0, lostCancel)
	mu.Lock()
	lost[stolen] = true
	mu.Unlock()
	select {
	case <-lostCtx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the lost lease's work was not cancelled")
	}
	if !errors.Is(context.Cause(lostCtx), pulsetype.ErrLeaseLost) {
		t.Fatalf("cause = %v, want pulsetype.ErrLeaseLost", context.Cause(lostCtx))
	}
	testwait.Eventually(t, 10*time.Second, "the kept lease to be renewed 3 times", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return renewed[kept] >= 3
	})
	if keptCtx.Err() != nil {
		t.Fatal("a renewed lease's work was cancelled")
	}
	k.Stop()
	k.Stop() // safe twice
}

// ClockSync measures the database's clock again every interval, until stopped.
func TestClockSyncFollowsTheDatabase(t *testing.T) {
	t.Parallel()
	var ahead atomic.Int64 // the server's lead over the local clock, in ns
	ahead.Store(int64(time.Minute))
	var calls atomic.Int64
	server := func(context.Context) (time.Time, error) {
		calls.Add(1)
		return time.Now().Add(time.Duration(ahead.Load())), nil
	}
	c := NewClock(nil)
	s := NewClockSync(c, server, 10*time.Millisecond, zerolog.Nop())
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	waitOffset := func(want time.Duration) {
		t.Helper()
		testwait.Eventually(t, 10*time.Second, fmt.Sprintf("the offset to be about %s", want), func() bool {
			d := c.Offset() - want
			return d >= -time.Second && d <= time.Second
		})
	}
	waitOffset(time.Minute)
	ahead.Store(int64(-time.Hour)) // the database's clock was set back
	waitOffset(-time.Hour)
	s.Stop()
	n := calls.Load()
	s.Stop() // safe twice
	if err := s.Start(context.Background()); err != nil {
		t.Fatalf("Start after Stop = %v", err)
	}
	testwait.Eventually(t, 10*time.Second, "a restarted ClockSync to sync again", func() bool { return calls.Load() != n })
}

// A renewal stuck in the database's write queue does not hold the next one back: the heartbeat sends the
// next on time beside it, the lease stays held through the later renewals, and Lag reports the stuck one's
// age (issue 26: heartbeats queued behind bulk work lost live leases).
func TestKeeperRenewsBesideAStuckRenewal(t *testing.T) {
	t.Parallel()
	stuck := make(chan struct{})
	var calls, answered atomic.Int64
	renew := func(ctx context.Context, _ []pulsetype.LeaseKey) ([]pulsetype.LeaseKey, error) {
		if calls.Add(1) == 1 {
			select { // the first renewal waits far longer than the lease
			case <-stuck:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			return nil, nil
		}
		answered.Add(1)
		return nil, nil
	}
	const leaseTimeout = 300 * time.Millisecond
	k := NewKeeper(renew, leaseTimeout, nil, zerolog.Nop())
	work, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	l := pulsetype.LeaseKey{AttemptID: "a1", Token: "t1"}
	k.Hold(l, 0, cancel)
	if err := k.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer k.Stop()
	// Six answered renewals span two lease timeouts while the first one is still unanswered.
	testwait.Eventually(t, 20*time.Second, "six renewals answered beside the stuck one", func() bool { return answered.Load() >= 6 })
	if work.Err() != nil {
		t.Fatalf("the lease was lost while later renewals kept it: %v", context.Cause(work))
	}
	if !k.Live(l) {
		t.Fatal("the lease is not live although renewals kept it")
	}
	close(stuck)
	k.Stop()
}

// Lag is the age of a renewal still unanswered, else the round trip of the latest lease write answered.
func TestKeeperLagFollowsTheLeaseWrites(t *testing.T) {
	t.Parallel()
	stuck, sent := make(chan struct{}), make(chan struct{})
	var calls atomic.Int64
	renew := func(ctx context.Context, _ []pulsetype.LeaseKey) ([]pulsetype.LeaseKey, error) {
		if calls.Add(1) == 1 {
			close(sent)
			<-stuck
		}
		return nil, nil
	}
	k := NewKeeper(renew, 30*time.Second, nil, zerolog.Nop())
	k.Hold(pulsetype.LeaseKey{AttemptID: "a1", Token: "t1"}, 0, func(error) {})
	if lag := k.Lag(); lag != 0 {
		t.Fatalf("Lag = %s before any lease write", lag)
	}
	k.beat(context.Background()) // the first renewal, as the ticker sends it
	<-sent
	testwait.Eventually(t, 10*time.Second, "Lag to count the unanswered renewal's age", func() bool { return k.Lag() >= 50*time.Millisecond })
	k.Observe(time.Millisecond) // a fast result write does not hide the renewal still waiting
	if lag := k.Lag(); lag < 50*time.Millisecond {
		t.Fatalf("Lag = %s with a renewal unanswered for at least 50ms", lag)
	}
	close(stuck)
	k.Stop() // waits for the renewal sent
	if lag := k.Lag(); lag < 50*time.Millisecond {
		t.Fatalf("Lag = %s after a renewal answered in at least 50ms", lag)
	}
	k.Observe(time.Millisecond)
	if lag := k.Lag(); lag != time.Millisecond {
		t.Fatalf("Lag = %s after a result write of 1ms", lag)
	}
}

// A result write reported by Writing counts in Lag from when it was sent, like an unanswered renewal: a write
// that hangs presses the dispatcher before it answers. Answered, its round trip is the latest lag; failed, it
// leaves the lag as it was.
func TestLagCountsAResultWriteInFlight(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	k := NewKeeper(func(context.Context, []pulsetype.LeaseKey) ([]pulsetype.LeaseKey, error) { return nil, nil },
		30*time.Second, clock, zerolog.Nop())
	done := k.Writing()
	advance(7 * time.Second)
	if lag := k.Lag(); lag != 7*time.Second {
		t.Fatalf("Lag = %s with a result write unanswered for 7s, want 7s", lag)
	}
	done(true)
	advance(time.Second)
	if lag := k.Lag(); lag != 7*time.Second {
		t.Fatalf("Lag = %s after the write answered in 7s, want 7s", lag)
	}
	k.Observe(time.Millisecond)
	failed := k.Writing()
	advance(2 * time.Second)
	failed(false)
	if lag := k.Lag(); lag != time.Millisecond {
		t.Fatalf("Lag = %s after a failed write, want the last answered one's 1ms", lag)
	}
}

// Refresh renews one held lease at once: a lease that ran out by the local clock is live again when the
// renewal finds it held, cancelled with ErrLeaseLost when it finds it lost; a lease not held costs no write.
func TestKeeperRefreshRenewsALeaseThatRanOut(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var sent [][]pulsetype.LeaseKey
	lostOne := pulsetype.LeaseKey{AttemptID: "reaped", Token: "t2"}
	k := NewKeeper(func(_ context.Context, ls []pulsetype.LeaseKey) ([]pulsetype.LeaseKey, error) {
		mu.Lock()
		defer mu.Unlock()
		sent = append(sent, ls)
		if ls[0] == lostOne {
			return ls, nil
		}
		return nil, nil
	}, time.Minute, nil, zerolog.Nop())
	held := pulsetype.LeaseKey{AttemptID: "a", Token: "t1"}
	var cause error
	k.Hold(held, time.Nanosecond, func(error) {})
	k.Hold(lostOne, time.Nanosecond, func(err error) { cause = err })
	testwait.Eventually(t, time.Minute, "the granted nanosecond to pass", func() bool { return !k.Live(held) })
	if !k.Refresh(t.Context(), held) || !k.Live(held) {
		t.Fatal("a lease that ran out but was renewed is not live")
	}
	if k.Refresh(t.Context(), lostOne) || k.Live(lostOne) || !errors.Is(cause, pulsetype.ErrLeaseLost) {
		t.Fatalf("a lease the renewal found lost: live, or cancelled with %v", cause)
	}
	if k.Refresh(t.Context(), pulsetype.LeaseKey{AttemptID: "never", Token: "held"}) {
		t.Fatal("a lease never held is live")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(sent) != 2 || len(sent[0]) != 1 || sent[0][0] != held || len(sent[1]) != 1 || sent[1][0] != lostOne {
		t.Fatalf("renewals sent %v, want one of each held lease and none for the lease never held", sent)
	}
}
