package dispatcher

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/pulse-sidecar/pulse/lease"
	"github.com/pulse-sidecar/pulse/pulsetype"
	"github.com/pulse-sidecar/pulse/reconciler"
	"github.com/pulse-sidecar/pulse/webhook"
)

// Store is the storage the dispatcher needs; package mongo implements it.
type Store interface {
	reconciler.FollowUpStore
	ClaimBatch(ctx context.Context, owner string, exclude []string, limit int) ([]*pulsetype.Attempt, error)
	ClaimHead(ctx context.Context, owner, group, topic string) (*pulsetype.Attempt, error)
	ReleaseAttempt(ctx context.Context, a *pulsetype.Attempt) error
	ListEndpoints(ctx context.Context) ([]*pulsetype.Endpoint, error)
	FinishAttempt(ctx context.Context, a *pulsetype.Attempt, r pulsetype.AttemptResult) error
	GetEvent(ctx context.Context, id string) (*pulsetype.Event, error)
	GetEndpoint(ctx context.Context, group string) (*pulsetype.Endpoint, error)
	FanOut(ctx context.Context, events []*pulsetype.Event) (int, error)
}

// Sender POSTs one attempt to a webhook; *webhook.Client implements it.
type Sender interface {
	Send(ctx context.Context, r webhook.Request) webhook.Result
}

// Recoverer runs the recovery steps; *reconciler.Reconciler implements it.
type Recoverer interface {
	ReapOne(ctx context.Context) (bool, error)
	Repair(ctx context.Context) (int, error)
}

// Observer is told about deliveries as they happen; metrics hook in here. It may be nil.
type Observer interface {
	AttemptDone(group string, outcome string, d time.Duration) // outcome: success, retry, error
	LeaseLost(group string)
}

// Options configure a Dispatcher.
type Options struct {
	Owner           string        // this process's lock owner id (UUIDv7)
	Workers         int           // POSTs in flight at most, across consumer groups
	PollInterval    time.Duration // longest sleep without a wake-up; also the reaper's period
	RepairInterval  time.Duration // period of the partial-state repair scan (default: PollInterval)
	LockTimeout     time.Duration // lease length; the reaper runs every max(PollInterval, LockTimeout/4)
	ShutdownTimeout time.Duration // grace for in-flight POSTs in Stop
	Observer        Observer
	Logger          zerolog.Logger
}

// Dispatcher claims and executes attempts. Start it once; Stop it once (it is safe twice).
type Dispatcher struct {
	store     Store
	sender    Sender
	recoverer Recoverer
	keeper    *lease.Keeper
	opts      Options
	log       zerolog.Logger

	wake chan struct{}

	mu        sync.Mutex
	queued    []*pulsetype.Event
	inflight  map[string]int // by consumer group
	total     int
	eps       map[string]cachedEndpoint
	ordered   map[string][]string // ordered consumer groups and their topics, refreshed every poll interval
	orderedAt time.Time

	cancelLoop context.CancelFunc
	loopDone   chan struct{}
	execCtx    context.Context // cancelled only when the shutdown grace runs out
	abortExec  context.CancelFunc
	running    sync.WaitGroup
	stopOnce   sync.Once
}

type cachedEndpoint struct {
	ep      *pulsetype.Endpoint // nil: the group has no endpoint
	fetched time.Time
}

// New returns a Dispatcher. keeper renews the leases of running attempts.
func New(store Store, sender Sender, recoverer Recoverer, keeper *lease.Keeper, opts Options) *Dispatcher {
	opts.Workers = max(opts.Workers, 1)
	opts.RepairInterval = max(opts.RepairInterval, opts.PollInterval)
	return &Dispatcher{
		store: store, sender: sender, recoverer: recoverer, keeper: keeper, opts: opts,
		log:  opts.Logger.With().Str("component", "dispatcher").Logger(),
		wake: make(chan struct{}, 1), inflight: map[string]int{}, eps: map[string]cachedEndpoint{},
	}
}

// Wake makes the loop look for work now. It never blocks.
func (d *Dispatcher) Wake() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// Published hands events just stored by this process to the loop, which fans them out and wakes at once.
// It never blocks. An event lost here (crash) is fanned out later by the reconciler.
func (d *Dispatcher) Published(events []*pulsetype.Event) {
	d.mu.Lock()
	d.queued = append(d.queued, events...)
	d.mu.Unlock()
	d.Wake()
}

// Start runs the loop in a goroutine and returns at once.
func (d *Dispatcher) Start(ctx context.Context) error {
	loopCtx, cancel := context.WithCancel(ctx)
	d.cancelLoop = cancel
	d.execCtx, d.abortExec = context.WithCancel(context.WithoutCancel(ctx))
	d.loopDone = make(chan struct{})
	go d.loop(loopCtx)
	return nil
}

// Stop stops claiming, lets in-flight POSTs finish and be recorded within ShutdownTimeout, then aborts the
// rest without recording them (their leases expire and the reaper takes over). It blocks until done and is
// safe twice or before Start.
func (d *Dispatcher) Stop() {
	d.stopOnce.Do(func() {
		if d.cancelLoop == nil {
			return
		}
		d.cancelLoop()
		<-d.loopDone
		finished := make(chan struct{})
		go func() { d.running.Wait(); close(finished) }()
		select {
		case <-finished:
		case <-time.After(d.opts.ShutdownTimeout):
			d.log.Warn().Msg("shutdown grace ran out: aborting in-flight deliveries, their leases will expire")
			d.abortExec()
			<-finished
		}
		d.abortExec()
	})
}

func (d *Dispatcher) loop(ctx context.Context) {
	defer close(d.loopDone)
	timer := time.NewTimer(0)
	defer timer.Stop()
	var lastReap, lastRepair time.Time
	for {
		worked := d.turn(ctx, &lastReap, &lastRepair)
		if ctx.Err() != nil {
			return
		}
		if worked {
			continue
		}
		timer.Reset(d.opts.PollInterval)
		select {
		case <-ctx.Done():
			return
		case <-d.wake:
		case <-timer.C:
		}
	}
}

// reapInterval is the reaper's period: a lease cannot be seen expired more precisely than a fraction of
// the lock timeout, so reaping more often than a quarter of it (or the poll interval) only costs queries.
func (d *Dispatcher) reapInterval() time.Duration {
	return max(d.opts.PollInterval, d.opts.LockTimeout/4)
}

// turn runs one pass of the loop and reports whether recovery did work that may have more to do. The
// recovery steps run on their own periods (reap every poll interval, repair every repair interval, sooner
// while they find work), so a busy loop does not pay for them on every claim.
func (d *Dispatcher) turn(ctx context.Context, lastReap, lastRepair *time.Time) bool {
	worked := false
	d.mu.Lock()
	events := d.queued
	d.queued = nil
	d.mu.Unlock()
	if len(events) > 0 {
		if _, err := d.store.FanOut(ctx, events); err != nil && ctx.Err() == nil {
			d.log.Error().Err(err).Int("events", len(events)).Msg("fan-out failed; the reconciler will retry it")
		}
	}
	if time.Since(*lastReap) >= d.reapInterval() {
		reaped, err := d.recoverer.ReapOne(ctx)
		if err != nil {
			d.logErr(ctx, err, "reap")
		}
		if !reaped {
			*lastReap = time.Now()
		}
		worked = worked || reaped
	}
	if time.Since(*lastRepair) >= d.opts.RepairInterval {
		n, err := d.recoverer.Repair(ctx)
		if err != nil {
			d.logErr(ctx, err, "repair")
		}
		if n == 0 {
			*lastRepair = time.Now()
		}
		worked = worked || n > 0
	}
	ordered := d.claimOrdered(ctx)
	for ctx.Err() == nil {
		exclude, free := d.capacity()
		exclude = append(exclude, ordered...)
		if free == 0 {
			break
		}
		batch, err := d.store.ClaimBatch(ctx, d.opts.Owner, exclude, min(free, maxClaimBatch))
		if err != nil {
			d.logErr(ctx, err, "claim")
		}
		for _, a := range batch {
			// A group this process did not know as ordered yet (registered or changed through another
			// replica): give the attempt back; the head-of-line claim takes it in order.
			if ep, err := d.endpoint(ctx, a.ConsumerGroup); err == nil && ep != nil && ep.Ordered {
				if err := d.store.ReleaseAttempt(ctx, a); err != nil {
					d.logErr(ctx, err, "release attempt of an ordered group")
				}
				d.mu.Lock()
				d.orderedAt = time.Time{}
				d.mu.Unlock()
				continue
			}
			d.launch(a)
		}
		if len(batch) == 0 || err != nil {
			break
		}
	}
	return worked
}

func (d *Dispatcher) logErr(ctx context.Context, err error, step string) {
	if ctx.Err() != nil || errors.Is(err, context.Canceled) {
		return
	}
	d.log.Error().Err(err).Str("step", step).Msg("worker loop step failed")
}

// claimOrdered claims the head-of-line attempt of every ordered consumer group's topics that has a due,
// unleased head, and returns the ordered groups (the unordered claim must skip them).
func (d *Dispatcher) claimOrdered(ctx context.Context) []string {
	d.mu.Lock()
	stale := time.Since(d.orderedAt) >= max(d.opts.PollInterval, endpointCacheTTL)
	ordered := d.ordered
	d.mu.Unlock()
	if stale {
		eps, err := d.store.ListEndpoints(ctx)
		if err != nil {
			d.logErr(ctx, err, "list endpoints")
		} else {
			ordered = map[string][]string{}
			now := time.Now()
			d.mu.Lock()
			for _, ep := range eps {
				if ep.Ordered {
					ordered[ep.ConsumerGroup] = ep.Topics
				}
				// Every group's limits are known before its attempts are claimed (maxConcurrency).
				d.eps[ep.ConsumerGroup] = cachedEndpoint{ep: ep, fetched: now}
			}
			d.ordered, d.orderedAt = ordered, now
			d.mu.Unlock()
		}
	}
	groups := make([]string, 0, len(ordered))
	for group, topics := range ordered {
		groups = append(groups, group)
		for _, topic := range topics {
			if _, free := d.capacity(); free == 0 || ctx.Err() != nil {
				return groups
			}
			a, err := d.store.ClaimHead(ctx, d.opts.Owner, group, topic)
			if err != nil {
				d.logErr(ctx, err, "claim head of line")
				continue
			}
			if a != nil {
				d.launch(a)
			}
		}
	}
	return groups
}

// maxClaimBatch bounds the attempts leased in one claim round trip.
const maxClaimBatch = 16

// capacity returns the consumer groups at their concurrency limit and how many worker slots are free.
func (d *Dispatcher) capacity() (exclude []string, free int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.total >= d.opts.Workers {
		return nil, 0
	}
	free = min(d.opts.Workers-d.total, maxClaimBatch)
	for group, c := range d.eps {
		limit := pulsetype.DefaultMaxConcurrency
		if c.ep != nil {
			limit = *c.ep.MaxConcurrency
		}
		if room := limit - d.inflight[group]; room <= 0 {
			exclude = append(exclude, group)
		} else {
			free = min(free, room) // a batch never takes a group past its limit
		}
	}
	return exclude, free
}
