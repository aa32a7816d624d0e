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

// Keeper renews the leases this process holds every third of the lease timeout (docs/delivery.md) and
// cancels the work of a lease that was lost. It is safe for concurrent use.
type Keeper struct {
	renew        RenewFunc
	leaseTimeout time.Duration
	local        func() time.Time
	log          zerolog.Logger

	mu   sync.Mutex
	held map[pulsetype.LeaseKey]*held

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
		log: log.With().Str("component", "heartbeat").Logger()}
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

// Release stops renewing the lease (its work finished).
func (k *Keeper) Release(l pulsetype.LeaseKey) {
	k.mu.Lock()
	delete(k.held, l)
	k.mu.Unlock()
}

// Start runs the heartbeat in a goroutine and returns at once; it returns startstop.ErrStarted when the
// keeper runs already.
func (k *Keeper) Start(ctx context.Context) error {
	return k.run.StartTicking(ctx, 0, k.Interval, k.beat)
}

// Stop ends the heartbeat and blocks until its goroutine returned. It is safe twice and before Start.
func (k *Keeper) Stop() { k.run.Stop() }

func (k *Keeper) beat(ctx context.Context) {
	k.mu.Lock()
	tokens := make([]pulsetype.LeaseKey, 0, len(k.held))
	for t := range k.held {
		tokens = append(tokens, t)
	}
	k.mu.Unlock()
	if len(tokens) == 0 {
		return
	}
	start := k.local()
	// A renewal may take until the lease would expire anyway: giving up earlier under load would abandon
	// leases the database still grants.
	rctx, cancel := context.WithTimeout(ctx, max(k.Interval(), k.leaseTimeout*2/3))
	lost, err := k.renew(rctx, tokens)
	cancel()
	k.mu.Lock()
	defer k.mu.Unlock()
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
		h.until = start.Add(k.leaseTimeout)
	}
}
