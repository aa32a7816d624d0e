package lease

import (
	"context"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/pulse-sidecar/pulse/internal/startstop"
	"github.com/pulse-sidecar/pulse/pulsetype"
)

// RenewFunc renews the given leases with one fenced write and returns the ones that were lost.
type RenewFunc func(ctx context.Context, leases []pulsetype.LeaseKey) (lost []pulsetype.LeaseKey, err error)

// maxRenewals bounds the renewals in flight at once: a renewal that outlasts the heartbeat period does not
// hold the next one back (the next is sent on time beside it), but a database that answers none of them is
// not sent more than this many. Each waits up to a lease timeout, and the heartbeat sends one every
// 0.8–1.2 thirds of it: at most four are due in one lease timeout, so five never hold one back.
const maxRenewals = 5

// Keeper renews the leases this process holds every third of the lease timeout (docs/delivery.md) and
// cancels the work of a lease that was lost. Renewals are sent on that schedule whatever the previous one
// takes: a renewal stuck in the database's write queue does not delay the next (at most maxRenewals run at
// once). Each renewal extends a lease by the lease timeout from the moment it was sent (the database's
// lockedUntil and the local bound alike), and waits up to that long to land. So on a database that runs
// writes in the order they arrive, however long it makes them wait, a reaper's write never finds a lease of
// this process expired: a renewal sent less than a lease timeout before it lands first. The local bound
// counts from answered renewals only, so a lease whose renewals are slow to answer is given up locally
// (no POST starts on it, unless one renewal sent then, Refresh, answers within the lease) before the
// database could take it. A database that reorders writes, or another
// replica's reaper whose writes overtake this one's, is met by the dispatcher's backpressure (no new lease
// while Lag is a large part of the lease timeout), not by this ordering. It is safe for concurrent use.
type Keeper struct {
	renew        RenewFunc
	leaseTimeout time.Duration
	local        func() time.Time
	log          zerolog.Logger

	mu       sync.Mutex
	held     map[pulsetype.LeaseKey]*held
	inFlight map[int64]time.Time // renewals sent and not answered: their local send times
	writing  map[int64]time.Time // result writes reported by Writing and not answered: their local send times
	seq      int64
	lastLag  time.Duration // round trip of the latest answered lease write (renewal or result)
	lagAt    time.Time     // when lastLag was measured
	renewing sync.WaitGroup

	run startstop.Base
}

type held struct {
	cancel context.CancelCauseFunc
	until  time.Time // local time the lease runs out: granted until then, or renewed a lease timeout before it
}

// NewKeeper returns a Keeper; local is the local clock (nil = time.Now).
func NewKeeper(renew RenewFunc, leaseTimeout time.Duration, local func() time.Time, log zerolog.Logger) *Keeper {
	if local == nil {
		local = time.Now
	}
	return &Keeper{renew: renew, leaseTimeout: leaseTimeout, local: local, held: map[pulsetype.LeaseKey]*held{},
		inFlight: map[int64]time.Time{}, writing: map[int64]time.Time{}, log: log.With().Str("component", "heartbeat").Logger()}
}

// Interval returns the heartbeat period: a third of the lease timeout, at least 10 ms.
func (k *Keeper) Interval() time.Duration { return max(k.leaseTimeout/3, 10*time.Millisecond) }

// Hold starts renewing the lease, which has left to run as granted (0: a whole lease timeout); cancel is
// called with pulsetype.ErrLeaseLost if it is lost (taken over by another worker, reaped, or not renewed
// before it runs out).
func (k *Keeper) Hold(l pulsetype.LeaseKey, left time.Duration, cancel context.CancelCauseFunc) {
	if left == 0 {
		left = k.leaseTimeout
	}
	k.mu.Lock()
	k.held[l] = &held{cancel: cancel, until: k.local().Add(left)}
	k.mu.Unlock()
}

// Live reports whether the held lease l has not run out by the local clock (as granted, or a lease timeout
// after the start of its last successful renewal). A lease not held is not live.
func (k *Keeper) Live(l pulsetype.LeaseKey) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	h, ok := k.held[l]
	return ok && k.local().Before(h.until)
}

// Refresh renews the held lease l at once, with a write of its own (as a heartbeat's renewal: it extends the
// lease by the lease timeout from the moment it was sent, waits up to a lease timeout, and counts in Lag),
// and reports whether l is live once it answered. It is for a lease found run out before its work started
// (a claim whose writes waited most of the lease in the database's queue): the renewal's fence (the
// attempt's id and token, status pending) either finds the lease still this process's and extends it, or
// finds it reaped, released or ended and reports it lost, so the work may start exactly when it reports
// true. A lost lease is cancelled with pulsetype.ErrLeaseLost, as by the heartbeat. A lease not held is not
// live, and nothing is written for it.
func (k *Keeper) Refresh(ctx context.Context, l pulsetype.LeaseKey) bool {
	k.mu.Lock()
	if _, ok := k.held[l]; !ok {
		k.mu.Unlock()
		return false
	}
	k.seq++
	id, start := k.seq, k.local()
	k.inFlight[id] = start
	k.renewing.Add(1)
	k.mu.Unlock()
	defer k.renewing.Done()
	k.renewOnce(ctx, id, start, []pulsetype.LeaseKey{l})
	return k.Live(l)
}

// Release stops renewing the lease (its work finished).
func (k *Keeper) Release(l pulsetype.LeaseKey) {
	k.mu.Lock()
	delete(k.held, l)
	k.mu.Unlock()
}

// Lag returns how long the writes that keep leases take now: the round trip of the latest one (a renewal,
// answered or timed out, or a result write reported by Observe or Writing) if it was measured within the
// last lease timeout, or the age of the oldest renewal or result write still unanswered when that is longer. It is what the
// dispatcher's backpressure reads: no new lease is taken while it is a large part of the lease timeout; a
// measurement older than a lease timeout no longer counts, so a process that holds nothing (and so renews
// nothing) claims again. It never blocks on the database.
func (k *Keeper) Lag() time.Duration {
	k.mu.Lock()
	defer k.mu.Unlock()
	now := k.local()
	var lag time.Duration
	if now.Sub(k.lagAt) < k.leaseTimeout {
		lag = k.lastLag
	}
	for _, sent := range k.inFlight {
		lag = max(lag, now.Sub(sent))
	}
	for _, sent := range k.writing {
		lag = max(lag, now.Sub(sent))
	}
	return lag
}

// Writing reports a write that held leases wait on (a batch of results) sent now: until done is called, Lag
// counts its age like an unanswered renewal's, so a result write that hangs presses the dispatcher before it
// answers; done(true) records its round trip as Observe does, done(false) (it failed) records nothing.
func (k *Keeper) Writing() (done func(answered bool)) {
	k.mu.Lock()
	k.seq++
	id, start := k.seq, k.local()
	k.writing[id] = start
	k.mu.Unlock()
	return func(answered bool) {
		k.mu.Lock()
		defer k.mu.Unlock()
		delete(k.writing, id)
		if answered {
			k.observeLocked(k.local().Sub(start))
		}
	}
}

// Observe reports the round trip d of a write that a held lease waits on (the recording of results), for Lag.
func (k *Keeper) Observe(d time.Duration) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.observeLocked(d)
}

// observeLocked records d as the latest lease write's round trip, measured now; k.mu is held.
func (k *Keeper) observeLocked(d time.Duration) { k.lastLag, k.lagAt = d, k.local() }

// Start runs the heartbeat in a goroutine and returns at once; it returns startstop.ErrStarted when the
// keeper runs already.
func (k *Keeper) Start(ctx context.Context) error {
	return k.run.StartTicking(ctx, 0, k.Interval, k.beat)
}

// Stop ends the heartbeat and blocks until its goroutine and the renewals it sent returned. It is safe twice
// and before Start.
func (k *Keeper) Stop() {
	k.run.Stop()
	k.renewing.Wait()
}

// beat sends one renewal of every held lease, in a goroutine of its own, unless maxRenewals are in flight
// already; it returns at once.
func (k *Keeper) beat(ctx context.Context) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.held) == 0 || len(k.inFlight) >= maxRenewals {
		return
	}
	tokens := make([]pulsetype.LeaseKey, 0, len(k.held))
	for t := range k.held {
		tokens = append(tokens, t)
	}
	k.seq++
	id, start := k.seq, k.local()
	k.inFlight[id] = start
	k.renewing.Add(1)
	go func() {
		defer k.renewing.Done()
		k.renewOnce(ctx, id, start, tokens)
	}()
}

// renewOnce renews tokens with one write sent at start and applies its answer.
func (k *Keeper) renewOnce(ctx context.Context, id int64, start time.Time, tokens []pulsetype.LeaseKey) {
	// A renewal may take until the lease it extends would run out: it extends the lease from the moment it
	// was sent, so it is still worth its write until then, and one given up earlier is one fewer renewal in
	// the database's queue ahead of a reaper's write sent after it (a driver that gives up closes its
	// connection, and the request may never run).
	rctx, cancel := context.WithTimeout(ctx, max(k.Interval(), k.leaseTimeout))
	lost, err := k.renew(rctx, tokens)
	cancel()
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.inFlight, id)
	k.lagAt = k.local()
	k.lastLag = k.lagAt.Sub(start) // a renewal that timed out measured a lag too
	if err != nil {
		if ctx.Err() == nil {
			k.log.Warn().Err(err).Int("leases", len(tokens)).Msg("heartbeat failed")
		}
		// Not renewed: a lease whose last renewal is older than the lease timeout may already be reaped.
		for t, h := range k.held {
			if !k.local().Before(h.until) {
				h.cancel(pulsetype.ErrLeaseLost)
				delete(k.held, t)
			}
		}
		return
	}
	isLost := map[pulsetype.LeaseKey]bool{}
	for _, t := range lost {
		isLost[t] = true
	}
	for _, t := range tokens {
		h, ok := k.held[t]
		if !ok {
			continue
		}
		if isLost[t] {
			h.cancel(pulsetype.ErrLeaseLost)
			delete(k.held, t)
			continue
		}
		// A later renewal may have been answered first: the lease runs from the latest send.
		if until := start.Add(k.leaseTimeout); until.After(h.until) {
			h.until = until
		}
	}
}
