package dispatcher

import (
	"context"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/pulse-sidecar/pulse/internal/startstop"
	"github.com/pulse-sidecar/pulse/lease"
	"github.com/pulse-sidecar/pulse/pulsetype"
	"github.com/pulse-sidecar/pulse/webhook"
)

// Store is the storage the dispatcher needs; package mongo implements it.
type Store interface {
	FanOutClaiming(ctx context.Context, owner string, events []*pulsetype.Event, claim func(group string) bool) ([]*pulsetype.Attempt, error)
	ClearFanOut(ctx context.Context, eventIDs []string) error
	ClaimAttempts(ctx context.Context, owner string, attempts []*pulsetype.Attempt) ([]*pulsetype.Attempt, error)
	DueAttempts(ctx context.Context, groups []string, limit int) ([]*pulsetype.Attempt, error)
	ClaimHeads(ctx context.Context, p pulsetype.ClaimHeadsParams) (pulsetype.HeadClaims, error)
	ReleaseAttempt(ctx context.Context, a *pulsetype.Attempt) error
	FinishAttempts(ctx context.Context, cs []pulsetype.Completion) ([]bool, error)
	FollowUps(ctx context.Context, cs []pulsetype.Completion) error
	GetEvent(ctx context.Context, id string) (*pulsetype.Event, error)
	GetEvents(ctx context.Context, ids []string) (map[string]*pulsetype.Event, error)
	ListEndpoints(ctx context.Context) ([]*pulsetype.Endpoint, error)
	GetEndpoint(ctx context.Context, group string) (*pulsetype.Endpoint, error)
	InactiveGroups(ctx context.Context, groups []string) (map[string]bool, error)
	DisableEndpoint(ctx context.Context, group string, reason pulsetype.StateReason, failingBefore time.Time) (bool, error)
	RecordHealth(ctx context.Context, failed map[string]time.Duration, succeeded []string) ([]string, error)
}

// Sender POSTs one attempt to a webhook; *webhook.Client implements it.
type Sender interface {
	Send(ctx context.Context, r webhook.Request) webhook.Result
}

// Reconciler is the reconciliation the loop runs on its periods; *reconciler.Reconciler implements it.
// Reap records one expired lease as worker_lost and reports whether it found one; Repair mends a batch of
// partial states and returns how many.
type Reconciler interface {
	Reap(ctx context.Context) (bool, error)
	Repair(ctx context.Context) (int, error)
}

// Observer is told about deliveries as they happen; metrics hook in here. It may be nil.
type Observer interface {
	AttemptDone(group string, outcome string, d time.Duration) // outcome: success, retry, error
	LeaseLost(group string)
	EndpointDisabled(group string, reason pulsetype.StateReason) // by this process: 410 Gone or disableAfter
}

// FailureObserver is an Observer that is also told of each delivery that this process ended in error (not of
// deliveries ended by a delete or a PUT: those are no failure of the receiver): attempt a ended with res, and
// end is the delivery's error (the attempt's, or retry_window_exceeded). opsevents.Emitter implements it.
type FailureObserver interface {
	DeliveryFailed(a *pulsetype.Attempt, res pulsetype.AttemptResult, end *pulsetype.ErrorInfo)
}

// Options configure a Dispatcher.
type Options struct {
	Owner           string        // this process's lease owner id (UUIDv7)
	Tracer          trace.Tracer  // makes a span per attempt, child of the event's publish span; nil: none
	Workers         int           // POSTs in flight at most, across consumer groups
	PollInterval    time.Duration // longest sleep without a wake-up; also the reaper's period
	RepairInterval  time.Duration // period of the partial-state repair scan (default: PollInterval)
	LeaseTimeout    time.Duration // lease length; the reaper runs every max(PollInterval, LockTimeout/4)
	ShutdownTimeout time.Duration // grace for in-flight POSTs in Stop
	Observer        Observer
	Logger          zerolog.Logger
	// Now returns the database's current time (lease.Clock.Now), against which an event's expiresAt is
	// checked before each POST; nil uses time.Now.
	Now func() time.Time
}

// Limits of the loop's batches.
const (
	// maxClaimBatch bounds the attempts leased in one polling claim round trip: claims by id from the due
	// window, as many as those of the attempts created here (maxReadyClaim). A drain's claims run one after
	// the other (the claim, the lease copy, the events' read, the state gate), so the batch sets how many
	// attempts each such sequence of round trips starts.
	maxClaimBatch = 64
	// maxReadyClaim bounds the locally created attempts leased in one round trip.
	maxReadyClaim = 64
	// maxLineClaim bounds the heads of an ordered group's lines leased in one round (ClaimHeads).
	maxLineClaim = 64
	// maxReady and maxReadyBytes bound the locally created, not yet claimed attempts kept in memory with
	// their events; beyond them attempts are left to polling.
	maxReady      = 4096
	maxReadyBytes = 64 << 20
	// markFlushBatch bounds how many fanned-out events keep their fanout mark before one updateMany clears
	// them; a quarter of the lease timeout bounds how long (the reconciler repairs marks older than a lease
	// timeout).
	markFlushBatch = 1024
	// maxRecordBatch bounds the results recorded by one bulk write.
	maxRecordBatch = 256
	// maxLeaseLag: no attempt is leased while the writes that keep leases take longer than the lease
	// timeout divided by it (a renewal sent every third of the lease timeout then still lands with time to
	// spare; see loop.pressed).
	maxLeaseLag = 6
)

// Dispatcher claims and executes attempts: a loop finds and claims work, an executor POSTs each leased
// attempt, a completer records the results in batches. It has the lifecycle of internal/startstop: Start
// once, Stop (safe twice, concurrently and before Start).
type Dispatcher struct {
	opts      Options
	wake      chan struct{}
	endpoints *endpointCache
	loop      *loop
	exec      *executor
	completer *completer

	mu      sync.Mutex // held by Start and Stop
	loopRun startstop.Base
}

// New returns a Dispatcher. rec runs the reconciliation; keeper renews the leases of running attempts.
func New(store Store, sender Sender, rec Reconciler, keeper *lease.Keeper, opts Options) *Dispatcher {
	opts.Workers = max(opts.Workers, 1)
	opts.RepairInterval = max(opts.RepairInterval, opts.PollInterval)
	if opts.Now == nil {
		opts.Now = time.Now
	}
	log := opts.Logger.With().Str("component", "dispatcher").Logger()
	d := &Dispatcher{opts: opts, wake: make(chan struct{}, 1)}
	kick := make(chan struct{}, 1)
	moved := &moved{}
	d.endpoints = newEndpointCache(store, max(opts.PollInterval, endpointCacheTTL))
	slots := newSlots(opts.Workers, d.endpoints.limit, func() { signal(kick) })
	d.completer = newCompleter(store, opts.Observer, d.Wake, d.endpoints, log)
	d.completer.timeout, d.completer.writing = opts.LeaseTimeout, keeper.Writing
	d.exec = &executor{store: store, sender: sender, endpoints: d.endpoints, gate: newStateGate(store), keeper: keeper, completer: d.completer,
		slots: slots, tracer: opts.Tracer, now: opts.Now, observer: opts.Observer, log: log, windowGrace: windowGrace(opts.PollInterval),
		ended: func(group string) {
			moved.add(group) // an ordered group's next head may be claimable now
			signal(kick)     // a slot is free
		}}
	d.loop = &loop{store: store, rec: rec, owner: opts.Owner, opts: opts, endpoints: d.endpoints, slots: slots,
		limits: newRateLimits(d.endpoints.rateLimit, d.Wake),
		ready:  newReadyQueue(maxReady, maxReadyBytes), marks: &fanOutMarks{batch: markFlushBatch, maxAge: opts.LeaseTimeout / 4},
		moved: moved, exec: d.exec, wake: d.wake, pollNow: d.Wake, kick: kick, log: log, lag: keeper.Lag,
		reap: chore{period: reapInterval(opts), stretch: opts.LeaseTimeout}, repair: chore{period: opts.RepairInterval, stretch: opts.LeaseTimeout}}
	return d
}

// Wake makes the loop look for due work in the database now. It never blocks.
func (d *Dispatcher) Wake() { signal(d.wake) }

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// Published hands events just stored by this process to the loop, which fans them out, claims their first
// attempts and POSTs them at once. It never blocks. An event lost here (crash) is fanned out later by the
// reconciler.
func (d *Dispatcher) Published(events []*pulsetype.Event) { d.loop.publish(events) }

// EndpointChanged drops the cached endpoint of a consumer group after it was registered, replaced or deleted
// through this process, and wakes the loop. It never blocks.
func (d *Dispatcher) EndpointChanged(group string) {
	d.endpoints.changed(group)
	d.Wake()
}

// Start starts the completer and runs the loop in a goroutine, and returns at once; it returns
// startstop.ErrStarted while the dispatcher runs. The loop ends with ctx; POSTs and result writes outlive
// it: Stop ends them.
func (d *Dispatcher) Start(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.completer.Start(ctx); err != nil {
		return err
	}
	d.exec.start(ctx)
	return d.loopRun.StartGo(ctx, d.loop.run)
}

// Stop stops claiming, lets in-flight POSTs finish and be recorded within ShutdownTimeout, then aborts the
// rest without recording them (their leases expire and the reaper takes over), and clears the fanout marks
// it still owes. It blocks until every goroutine it started returned, and is safe twice, concurrently and
// before Start.
func (d *Dispatcher) Stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.loopRun.Stop()
	d.exec.stop(d.opts.ShutdownTimeout)
	d.completer.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second) // the marks are only an optimization
	defer cancel()
	d.loop.flushMarks(ctx, true)
}
