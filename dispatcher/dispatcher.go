package dispatcher

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/pulse-sidecar/pulse/lease"
	"github.com/pulse-sidecar/pulse/pulsetype"
	"github.com/pulse-sidecar/pulse/webhook"
)

// Store is the storage the dispatcher needs; package mongo implements it.
type Store interface {
	FanOut(ctx context.Context, events []*pulsetype.Event) ([]*pulsetype.Attempt, error)
	ClearFanOut(ctx context.Context, eventIDs []string) error
	ClaimAttempts(ctx context.Context, owner string, attempts []*pulsetype.Attempt) ([]*pulsetype.Attempt, error)
	ClaimBatch(ctx context.Context, owner string, exclude []string, limit int) ([]*pulsetype.Attempt, error)
	ClaimHead(ctx context.Context, owner string, line pulsetype.Line) (*pulsetype.Attempt, time.Duration, error)
	OrderingKeys(ctx context.Context, group, topic string) ([]string, error)
	ReleaseAttempt(ctx context.Context, a *pulsetype.Attempt) error
	FinishAttempts(ctx context.Context, cs []pulsetype.Completion) ([]bool, error)
	FollowUps(ctx context.Context, cs []pulsetype.Completion) error
	GetEvent(ctx context.Context, id string) (*pulsetype.Event, error)
	GetEvents(ctx context.Context, ids []string) (map[string]*pulsetype.Event, error)
	ListEndpoints(ctx context.Context) ([]*pulsetype.Endpoint, error)
	GetEndpoint(ctx context.Context, group string) (*pulsetype.Endpoint, error)
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
	Tracer          trace.Tracer  // makes a span per attempt, child of the event's publish span; nil: none
	Workers         int           // POSTs in flight at most, across consumer groups
	PollInterval    time.Duration // longest sleep without a wake-up; also the reaper's period
	RepairInterval  time.Duration // period of the partial-state repair scan (default: PollInterval)
	LockTimeout     time.Duration // lease length; the reaper runs every max(PollInterval, LockTimeout/4)
	ShutdownTimeout time.Duration // grace for in-flight POSTs in Stop
	Observer        Observer
	Logger          zerolog.Logger
	// Now returns the database's current time (lease.Clock.Now), against which an event's expiresAt is
	// checked before each POST; nil uses time.Now.
	Now func() time.Time
}

// Limits of the loop's batches.
const (
	// maxClaimBatch bounds the attempts leased in one polling claim round trip.
	maxClaimBatch = 16
	// maxReadyClaim bounds the locally created attempts leased in one round trip.
	maxReadyClaim = 64
	// maxReady and maxReadyBytes bound the locally created, not yet claimed attempts kept in memory with
	// their events; beyond them attempts are left to polling.
	maxReady      = 4096
	maxReadyBytes = 64 << 20
	// markFlushBatch bounds how many fanned-out events keep their fanout mark before one updateMany clears
	// them; a quarter of the lock timeout bounds how long (the reconciler repairs marks older than a lock
	// timeout).
	markFlushBatch = 1024
	// maxRecordBatch bounds the results recorded by one bulk write.
	maxRecordBatch = 256
)

// Fairness between consumer groups. Worker slots (Options.Workers) are shared by every group, each group
// capped by its maxConcurrency; two rules keep slow, hanging or failing endpoints, however many, from
// holding up a healthy one:
//
//   - The overflow: a POST still running after slowAfter gives its worker slot back and counts against an
//     overflow of overflowShare × Workers, so slots never stay held by hanging receivers for longer than
//     slowAfter. At most (1 + overflowShare) × Workers POSTs are in flight (each group still capped by its
//     maxConcurrency); once the overflow is full, slow POSTs keep their slots.
//   - The reserve: the last Workers/reserveShare free slots (at least one) go only to groups with nothing
//     in flight and no POST that outlasted slowAfter within slowMemory. A healthy group's due attempt
//     therefore finds a slot at once unless as many distinct healthy groups as there are reserved slots
//     are busy at the same moment, or the overflow is full.
const (
	reserveShare  = 4
	overflowShare = 16
	slowAfter     = time.Second
	slowMemory    = time.Minute
)

// reserve returns how many of the worker slots are kept for groups with nothing in flight.
func (d *Dispatcher) reserve() int { return max(1, d.opts.Workers/reserveShare) }

// admitLocked reports whether group may take one more worker slot now, with taken slots already promised to
// it in the batch being built and free slots left before this one; d.mu is held.
func (d *Dispatcher) admitLocked(group string, taken, free int) bool {
	busy := d.inflight[group] + taken
	if free <= 0 || busy >= d.limitLocked(group) {
		return false
	}
	return free > d.reserve() || busy == 0 && !time.Now().Before(d.slowUntil[group])
}

// Dispatcher claims and executes attempts. Start it once; Stop it once (it is safe twice).
type Dispatcher struct {
	store     Store
	sender    Sender
	recoverer Recoverer
	keeper    *lease.Keeper
	opts      Options
	log       zerolog.Logger

	wake        chan struct{} // poll the database now (change stream, retry timer, endpoint change)
	kick        chan struct{} // local work: events published here, a freed worker slot
	completions chan *completion
	recorded    chan struct{} // closed when the recorder returned

	mu            sync.Mutex
	queued        []*pulsetype.Event // published here, not fanned out yet
	ready         []job              // created here by fan-out, not claimed yet (a nil lease)
	readyBytes    int
	backlog       bool // the database may hold due attempts this process had no capacity for
	unmarked      []string
	unmarkedSince time.Time
	inflight      map[string]int       // POSTs in flight by consumer group (maxConcurrency counts these)
	total         int                  // worker slots in use (PULSE_WORKERS counts these); see fairness
	overflow      int                  // POSTs that outlasted slowAfter and gave their slot back
	slowUntil     map[string]time.Time // groups with a POST that outlasted slowAfter: no reserve slot until then
	eps           map[string]cachedEndpoint
	ordered       map[string][]string // ordered consumer groups and their topics, refreshed every poll interval
	orderedNext   time.Time           // when the endpoints are listed again (jittered)
	orderedKick   map[string]bool     // groups whose head of line may have moved (an attempt ended or was created)

	lastPoll   time.Time
	cancelLoop context.CancelFunc
	loopDone   chan struct{}
	execCtx    context.Context // cancelled only when the shutdown grace runs out
	abortExec  context.CancelFunc
	running    sync.WaitGroup
	stopOnce   sync.Once
}

// job is an attempt to run and, when known, its event: evKnown with a nil ev means the event is gone
// (retention); without evKnown the worker reads the event itself.
type job struct {
	a       *pulsetype.Attempt
	ev      *pulsetype.Event
	evKnown bool
}

type cachedEndpoint struct {
	ep        *pulsetype.Endpoint // nil: the group has no endpoint
	fetched   time.Time           // when the read that gave ep began
	changedAt time.Time           // when the group last changed through this process (EndpointChanged)
}

// New returns a Dispatcher. keeper renews the leases of running attempts.
func New(store Store, sender Sender, recoverer Recoverer, keeper *lease.Keeper, opts Options) *Dispatcher {
	opts.Workers = max(opts.Workers, 1)
	opts.RepairInterval = max(opts.RepairInterval, opts.PollInterval)
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Dispatcher{
		store: store, sender: sender, recoverer: recoverer, keeper: keeper, opts: opts,
		log:  opts.Logger.With().Str("component", "dispatcher").Logger(),
		wake: make(chan struct{}, 1), kick: make(chan struct{}, 1), completions: make(chan *completion, opts.Workers),
		recorded: make(chan struct{}), inflight: map[string]int{}, slowUntil: map[string]time.Time{}, eps: map[string]cachedEndpoint{}, orderedKick: map[string]bool{},
	}
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
func (d *Dispatcher) Published(events []*pulsetype.Event) {
	d.mu.Lock()
	d.queued = append(d.queued, events...)
	d.mu.Unlock()
	signal(d.kick)
}

// Start runs the loop in a goroutine and returns at once.
func (d *Dispatcher) Start(ctx context.Context) error {
	loopCtx, cancel := context.WithCancel(ctx)
	d.cancelLoop = cancel
	d.execCtx, d.abortExec = context.WithCancel(context.WithoutCancel(ctx))
	d.loopDone = make(chan struct{})
	go d.recorder()
	go d.loop(loopCtx)
	return nil
}

// Stop stops claiming, lets in-flight POSTs finish and be recorded within ShutdownTimeout, then aborts the
// rest without recording them (their leases expire and the reaper takes over), and clears the fanout marks
// it still owes. It blocks until done and is safe twice or before Start.
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
		close(d.completions)
		<-d.recorded
		ctx, cancel := context.WithTimeout(context.WithoutCancel(d.execCtx), 2*time.Second) // the marks are only an optimization
		d.flushMarks(ctx, true)
		cancel()
		d.abortExec()
	})
}

func (d *Dispatcher) loop(ctx context.Context) {
	defer close(d.loopDone)
	timer := time.NewTimer(0)
	defer timer.Stop()
	var nextReap, nextRepair time.Time
	poll := true
	for {
		worked := d.turn(ctx, poll, &nextReap, &nextRepair)
		if ctx.Err() != nil {
			return
		}
		if worked {
			poll = true
			continue
		}
		timer.Reset(pulsetype.Jittered(d.opts.PollInterval))
		select {
		case <-ctx.Done():
			return
		case <-d.wake:
			poll = true
		case <-d.kick:
			poll = false
		case <-timer.C:
			poll = true
		}
	}
}

// reapInterval is the reaper's period: a lease cannot be seen expired more precisely than a fraction of
// the lock timeout, so reaping more often than a quarter of it (or the poll interval) only costs queries.
func (d *Dispatcher) reapInterval() time.Duration {
	return max(d.opts.PollInterval, d.opts.LockTimeout/4)
}

// turn runs one pass of the loop and reports whether recovery did work that may have more to do. The
// recovery steps run on their own periods (reap every reap interval, repair every repair interval, sooner
// while they find work). The database is asked for due work when poll is set (a poll interval without
// local work, a wake-up, recovery work), when a backlog may wait there, and at least every reap interval
// while local work keeps the loop busy; local work (fan-out, claims of attempts created here) runs always.
func (d *Dispatcher) turn(ctx context.Context, poll bool, nextReap, nextRepair *time.Time) bool {
	worked := false
	d.fanOut(ctx)
	d.flushMarks(ctx, false)
	if now := time.Now(); !now.Before(*nextReap) {
		reaped, err := d.recoverer.ReapOne(ctx)
		if err != nil {
			d.logErr(ctx, err, "reap")
		}
		if !reaped {
			*nextReap = now.Add(pulsetype.Jittered(d.reapInterval()))
		}
		worked = worked || reaped
	}
	if now := time.Now(); !now.Before(*nextRepair) {
		n, err := d.recoverer.Repair(ctx)
		if err != nil {
			d.logErr(ctx, err, "repair")
		}
		if n == 0 {
			*nextRepair = now.Add(pulsetype.Jittered(d.opts.RepairInterval))
		}
		worked = worked || n > 0
	}
	poll = poll || time.Since(d.lastPoll) >= d.reapInterval()
	ordered := d.claimOrdered(ctx, poll)
	d.claimReady(ctx)
	d.mu.Lock()
	backlog := d.backlog
	d.mu.Unlock()
	if poll || backlog {
		d.lastPoll = time.Now()
		d.claimDue(ctx, ordered)
	}
	return worked
}

// fanOut creates the deliveries and first attempts of the events published here since the last turn, in
// one batch, and keeps the attempts in memory with their events for claimReady.
func (d *Dispatcher) fanOut(ctx context.Context) {
	d.mu.Lock()
	events := d.queued
	d.queued = nil
	d.mu.Unlock()
	if len(events) == 0 {
		return
	}
	attempts, err := d.store.FanOut(ctx, events)
	if err != nil {
		if ctx.Err() == nil {
			d.log.Error().Err(err).Int("events", len(events)).Msg("fan-out failed; the reconciler will retry it")
		}
		return
	}
	// Every group's limits (maxConcurrency, ordered) are known before its attempts are admitted: a group
	// registered through another replica a moment ago is read now.
	for _, a := range attempts {
		d.mu.Lock()
		_, known := d.eps[a.ConsumerGroup]
		d.mu.Unlock()
		if !known {
			if _, err := d.endpoint(ctx, a.ConsumerGroup, false); err != nil {
				d.logErr(ctx, err, "read the endpoint of a fanned-out attempt")
			}
		}
	}
	byID := make(map[string]*pulsetype.Event, len(events))
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, e := range events {
		byID[e.ID] = e
		d.unmarked = append(d.unmarked, e.ID)
	}
	if d.unmarkedSince.IsZero() {
		d.unmarkedSince = time.Now()
	}
	for _, a := range attempts {
		if c, ok := d.eps[a.ConsumerGroup]; ok && c.ep != nil && c.ep.Ordered {
			d.orderedKick[a.ConsumerGroup] = true // only the head-of-line claim may take it
			continue
		}
		ev := byID[a.EventID]
		if len(d.ready) >= maxReady || d.readyBytes+len(ev.Data) > maxReadyBytes {
			d.backlog = true // left to polling
			continue
		}
		d.ready = append(d.ready, job{a: a, ev: ev, evKnown: true})
		d.readyBytes += len(ev.Data)
	}
}

// flushMarks clears the fanout marks of fanned-out events with one write once markFlushBatch of them wait
// or the oldest waited a quarter of the lock timeout (or when force is set). A failed clear is left to the reconciler, whose repeated
// fan-out is a no-op.
func (d *Dispatcher) flushMarks(ctx context.Context, force bool) {
	d.mu.Lock()
	if len(d.unmarked) == 0 || !force && len(d.unmarked) < markFlushBatch && time.Since(d.unmarkedSince) < d.opts.LockTimeout/4 {
		d.mu.Unlock()
		return
	}
	ids := d.unmarked
	d.unmarked, d.unmarkedSince = nil, time.Time{}
	d.mu.Unlock()
	if err := d.store.ClearFanOut(ctx, ids); err != nil {
		d.logErr(ctx, err, "clear fanout marks")
	}
}

// claimReady leases, one round trip per batch, the attempts fanned out here that fit the free capacity, and
// runs them with the events they were published with.
func (d *Dispatcher) claimReady(ctx context.Context) {
	for ctx.Err() == nil {
		batch := d.takeReady()
		if len(batch) == 0 {
			return
		}
		attempts := make([]*pulsetype.Attempt, len(batch))
		events := make(map[string]*pulsetype.Event, len(batch))
		for i, j := range batch {
			attempts[i] = j.a
			events[j.a.EventID] = j.ev
		}
		leased, err := d.store.ClaimAttempts(ctx, d.opts.Owner, attempts)
		if err != nil {
			d.logErr(ctx, err, "claim attempts created here")
			d.mu.Lock()
			d.backlog = true // left to polling
			d.mu.Unlock()
			return
		}
		jobs := make([]job, len(leased))
		for i, a := range leased {
			jobs[i] = job{a: a, ev: events[a.EventID], evKnown: true}
		}
		d.launchAll(ctx, jobs)
	}
}

// takeReady removes from the ready queue up to maxReadyClaim attempts that the free capacity admits: the
// worker slots left, each consumer group's maxConcurrency and the reserve (see admitLocked).
func (d *Dispatcher) takeReady() []job {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.opts.Workers-d.total <= 0 || len(d.ready) == 0 {
		return nil
	}
	taken := map[string]int{}
	var take, keep []job
	for _, j := range d.ready {
		g := j.a.ConsumerGroup
		if len(take) < maxReadyClaim && d.admitLocked(g, taken[g], d.opts.Workers-d.total-len(take)) {
			take = append(take, j)
			d.readyBytes -= len(j.ev.Data)
			taken[g]++
		} else {
			keep = append(keep, j)
		}
	}
	d.ready = keep
	return take
}

// claimDue leases due attempts found by polling the database, a batch per round trip while capacity lasts,
// and reads their events with one query per batch. ordered groups are left to the head-of-line claim.
func (d *Dispatcher) claimDue(ctx context.Context, ordered []string) {
	for ctx.Err() == nil {
		exclude, free := d.capacity()
		exclude = append(exclude, ordered...)
		if free == 0 {
			d.mu.Lock()
			d.backlog = true
			d.mu.Unlock()
			return
		}
		batch, err := d.store.ClaimBatch(ctx, d.opts.Owner, exclude, min(free, maxClaimBatch))
		if err != nil {
			d.logErr(ctx, err, "claim")
			return
		}
		if len(batch) == 0 {
			d.mu.Lock()
			d.backlog = false
			d.mu.Unlock()
			return
		}
		ids := make([]string, len(batch))
		for i, a := range batch {
			ids[i] = a.EventID
		}
		events, err := d.store.GetEvents(ctx, ids)
		if err != nil {
			d.logErr(ctx, err, "read events of claimed attempts") // each worker reads its own
		}
		jobs := make([]job, len(batch))
		for i, a := range batch {
			jobs[i] = job{a: a, ev: events[a.EventID], evKnown: err == nil}
		}
		// Groups found ordered only now stay out of this turn's claims: their attempts were given back and
		// would be claimed again at once.
		ordered = append(ordered, d.launchAll(ctx, jobs)...)
	}
}

// launchAll runs leased attempts, except those of a group this process did not know as ordered yet
// (registered or changed through another replica), given back for the head-of-line claim, and those beyond
// their group's maxConcurrency (claimed before the limit was known), given back for a later claim; their
// groups are returned.
func (d *Dispatcher) launchAll(ctx context.Context, jobs []job) (released []string) {
	for _, j := range jobs {
		ep, err := d.endpoint(ctx, j.a.ConsumerGroup, false)
		d.mu.Lock()
		over := d.inflight[j.a.ConsumerGroup] >= d.limitLocked(j.a.ConsumerGroup)
		d.mu.Unlock()
		if err == nil && ep != nil && ep.Ordered || over {
			if err := d.store.ReleaseAttempt(ctx, j.a); err != nil {
				d.logErr(ctx, err, "release attempt of an ordered group")
			}
			d.mu.Lock()
			d.orderedNext = time.Time{}
			d.mu.Unlock()
			if !slices.Contains(released, j.a.ConsumerGroup) {
				released = append(released, j.a.ConsumerGroup)
			}
			continue
		}
		d.launch(j)
	}
	return released
}

func (d *Dispatcher) logErr(ctx context.Context, err error, step string) {
	if ctx.Err() != nil || errors.Is(err, context.Canceled) {
		return
	}
	d.log.Error().Err(err).Str("step", step).Msg("worker loop step failed")
}

// claimOrdered claims the head-of-line attempt of every line (topic and ordering key) of every ordered
// consumer group that has a due, unleased head, and returns the ordered groups (the unordered claims must skip them). Without poll it looks
// only at groups whose head may have moved since the last turn.
func (d *Dispatcher) claimOrdered(ctx context.Context, poll bool) []string {
	d.mu.Lock()
	stale := !time.Now().Before(d.orderedNext)
	ordered := d.ordered
	kicked := d.orderedKick
	d.orderedKick = map[string]bool{}
	d.mu.Unlock()
	if stale {
		listStart := time.Now()
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
				d.cacheLocked(ep.ConsumerGroup, ep, listStart)
			}
			d.ordered, d.orderedNext = ordered, now.Add(pulsetype.Jittered(max(d.opts.PollInterval, endpointCacheTTL)))
			d.mu.Unlock()
		}
	}
	groups := make([]string, 0, len(ordered))
	for group, topics := range ordered {
		groups = append(groups, group)
		if !poll && !kicked[group] {
			continue
		}
		for _, topic := range topics {
			if !d.claimLines(ctx, group, topic) {
				break
			}
		}
	}
	return groups
}

// lineClaimers bounds the head-of-line claims of one (group, topic) that run at once: each costs a few
// database round trips, and a group with many ordering keys would otherwise claim its lines one after another.
const lineClaimers = 8

// claimLines claims the head of every line (ordering key) of an ordered group's topic that has pending
// deliveries, up to lineClaimers at once, starting at a random key so that lines past the group's free slots
// are not always the same ones. Claims in progress count against the group's slots (a claim that finds a
// head moves to in flight, one that finds none gives its slot back). It blocks until every claim it started
// has returned, and reports false when the group has no free slot left (or ctx ended).
func (d *Dispatcher) claimLines(ctx context.Context, group, topic string) bool {
	keys, err := d.store.OrderingKeys(ctx, group, topic)
	if err != nil {
		d.logErr(ctx, err, "list ordering keys")
		return true
	}
	var (
		wg       sync.WaitGroup
		claiming int // claims running; guarded by d.mu
	)
	defer wg.Wait()
	sem := make(chan struct{}, lineClaimers)
	start := rand.IntN(len(keys))
	for i := range keys {
		sem <- struct{}{}
		for {
			d.mu.Lock()
			admit := d.admitLocked(group, claiming, d.opts.Workers-d.total-claiming)
			if admit {
				claiming++
			}
			busy := claiming
			d.mu.Unlock()
			if admit {
				break
			}
			if busy == 0 || ctx.Err() != nil {
				<-sem
				return false
			}
			wg.Wait() // the running claims may give their slots back
		}
		line := pulsetype.Line{ConsumerGroup: group, Topic: topic, OrderingKey: keys[(start+i)%len(keys)]}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			a, wait, err := d.store.ClaimHead(ctx, d.opts.Owner, line)
			if a != nil {
				d.launch(job{a: a})
			}
			d.mu.Lock()
			claiming--
			d.mu.Unlock()
			if err != nil {
				d.logErr(ctx, err, "claim head of line")
			}
			if wait > 0 { // the head settles by itself: look again then
				time.AfterFunc(wait, func() {
					d.mu.Lock()
					d.orderedKick[group] = true
					d.mu.Unlock()
					signal(d.kick)
				})
			}
		}()
	}
	return true
}

// limitLocked returns a consumer group's maxConcurrency as cached (the default when unknown); d.mu is held.
func (d *Dispatcher) limitLocked(group string) int {
	if c, ok := d.eps[group]; ok && c.ep != nil {
		return *c.ep.MaxConcurrency
	}
	return pulsetype.DefaultMaxConcurrency
}

// capacity returns the consumer groups that may not take a worker slot now and how many attempts the next
// claim may lease. Above the reserve a batch takes up to the free slots above it (never a group past its
// maxConcurrency); within the reserve it takes one attempt of a group with nothing in flight (see
// admitLocked).
func (d *Dispatcher) capacity() (exclude []string, free int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	slots := d.opts.Workers - d.total
	if slots <= 0 {
		return nil, 0
	}
	free = min(max(slots-d.reserve(), 1), maxClaimBatch)
	groups := map[string]bool{}
	for group := range d.eps {
		groups[group] = true
	}
	for group := range d.inflight {
		groups[group] = true
	}
	for group := range groups {
		if !d.admitLocked(group, 0, slots) {
			exclude = append(exclude, group)
		} else {
			free = min(free, d.limitLocked(group)-d.inflight[group]) // a batch never takes a group past its limit
		}
	}
	return exclude, free
}
