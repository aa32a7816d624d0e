package dispatcher

import (
	"fmt"
	"sync/atomic"
	"time"
)

// busy records since when a piece of the loop's work (a turn, a reconciliation pass) has run: the Unix
// time in nanoseconds it began, 0 while none runs. The zero value is idle; it is safe for concurrent use.
type busy struct{ since atomic.Int64 }

// begin marks the work as running from now on; end marks it done.
func (b *busy) begin() { b.since.Store(time.Now().UnixNano()) }
func (b *busy) end()   { b.since.Store(0) }

// age returns how long the work has run, 0 when none runs.
func (b *busy) age(now time.Time) time.Duration {
	if s := b.since.Load(); s != 0 {
		return now.Sub(time.Unix(0, s))
	}
	return 0
}

// Stalled returns an error naming the loop's work that has run for longer than bound without completing: a
// turn (fan-out, claims, the poll) or a reconciliation pass (the reaper, the repair scan). Each of their
// database calls has a deadline, so only work stuck outside one (a connection that never answers, past a
// deadline's reach) outlives a bound of a few of them. It returns nil when none has, for /readyz.
func (d *Dispatcher) Stalled(bound time.Duration) error {
	now := time.Now()
	if age := d.loop.turning.age(now); age > bound {
		return fmt.Errorf("the dispatcher's turn (fan-out, claims, poll) has run for %s without completing (bound %s)", age.Round(time.Second), bound)
	}
	if age := d.loop.reconciling.age(now); age > bound {
		return fmt.Errorf("the reconciliation pass (reaper, repair scan) has run for %s without completing (bound %s)", age.Round(time.Second), bound)
	}
	return nil
}
