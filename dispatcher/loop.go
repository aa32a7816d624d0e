package dispatcher

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// loop finds and claims work: it fans out the events published here, clears their fanout marks, claims the
// heads of ordered lines, the attempts its fan-out created and the due attempts found by polling, and hands
// each leased attempt to the executor. One goroutine runs it, and a second the reconciliation (reconcile);
// only Published is called from others.
type loop struct {
	store     Store
	rec       Reconciler
	owner     string
	opts      Options
	endpoints *endpointCache
	slots     *slots
	limits    *rateLimits
	ready     *readyQueue
	marks     *fanOutMarks
	moved     *moved
	exec      *executor
	wake      <-chan struct{} // poll the database now (change stream, retry timer, endpoint change)
	pollNow   func()          // sends on wake (Dispatcher.Wake)
	kick      chan struct{}   // local work: events published here, a freed worker slot
	log       zerolog.Logger
	// lag returns how long the writes that keep leases take now (lease.Keeper.Lag); nil: no backpressure.
	lag func() time.Duration

	mu     sync.Mutex
	queued []*pulsetype.Event // published here, not fanned out yet

	// fanning is held by a fan-out of this process and by a Repair: the repair scan removes a queue document
	// whose delivery does not exist once it is a lease timeout old, taking it for the leftover of a fan-out
	// that died, and a fan-out of thousands of events on a slow database can take longer than that between
	// its queue documents and its deliveries (its attempt then stays pending with no queue document, which
	// no claim and no repair finds). They ran in one goroutine before the reconciliation had its own.
	fanning sync.Mutex

	// turning and reconciling say since when a turn and a reconciliation pass run (Dispatcher.Stalled).
	turning, reconciling busy

	// Owned by the loop's goroutine.
	backlog  bool // the database may hold due attempts this process had no capacity for
	window   dueWindow
	lastPoll time.Time
	// lineAfter is, per (consumer group, topic) of an ordered group with more lines than one ClaimHeads
	// reads, the ordering key its next claim continues after ("": after the line without a key).
	lineAfter map[[2]string]*string
	lastRound map[string]round // the latest round of head claims of each ordered group (see roundGap)
	// settlingHere holds the events of ordered groups fanned out here lately, with when (see lookAgain).
	settlingHere map[string]time.Time
	prunedAt     time.Time // when settlingHere was last pruned (fannedOut)

	// Owned by the reconciliation's goroutine (reconcile).
	reap   chore
	repair chore
}

// chore is a step of the reconciliation that runs every period (jittered), sooner while it finds work.
type chore struct {
	period time.Duration
	// stretch bounds how much later than a period the spacing by its duration (choreShare) puts the next
	// run: a run's duration counts a database that stalled as well as one that scanned, and a stall must
	// not keep the reaper away for ten times its length. 0: no bound.
	stretch time.Duration
	next    time.Time
}

// choreShare bounds the share of time a chore's queries keep the database busy: a run that found nothing
// is followed by the next one no sooner than choreShare times as long as it took. On a server that reads
// the whole queue for the reaper's and the repair's queries (FerretDB: each is seconds with a backlog of
// tens of thousands), each of the two then costs at most about a tenth of the database's time per replica
// while it finds nothing (a run that found work is followed at once), until the spacing reaches its bound
// (chore.stretch: a lease timeout past the period, so that a lost lease is still reaped within about two
// lease timeouts and a reaper's period, however long a stalled database made the last run); on MongoDB,
// whose indexes answer them in milliseconds, the periods are unchanged.
const choreShare = 10

// due reports whether the chore runs at now.
func (c *chore) due(now time.Time) bool { return !now.Before(c.next) }

// ran schedules the next run after one that started at start and ended at end: at once when it worked, else
// a period (jittered) after start, and at least choreShare times its duration, but no more than the period
// plus stretch after start.
func (c *chore) ran(start, end time.Time, worked bool) {
	if worked {
		c.next = end
		return
	}
	spaced := choreShare * end.Sub(start)
	if c.stretch > 0 {
		spaced = min(spaced, c.period+c.stretch)
	}
	c.next = start.Add(max(pulsetype.Jittered(c.period), spaced))
}

// publish queues events stored by this process for the next turn's fan-out.
func (l *loop) publish(events []*pulsetype.Event) {
	l.mu.Lock()
	l.queued = append(l.queued, events...)
	l.mu.Unlock()
	signal(l.kick)
}

// run runs turns until ctx ends, sleeping at most a poll interval (jittered) between turns without work,
// and the reconciliation beside them (reconcile). It returns once both ended.
func (l *loop) run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { l.reconcile(ctx) })
	timer := time.NewTimer(0)
	defer timer.Stop()
	poll := true
	for {
		l.turn(ctx, poll)
		if ctx.Err() != nil {
			return
		}
		timer.Reset(pulsetype.Jittered(l.opts.PollInterval))
		select {
		case <-ctx.Done():
			return
		case <-l.wake:
			poll = true
		case <-l.kick:
			poll = false
		case <-timer.C:
			poll = true
		}
	}
}

// reapInterval is the reaper's period: a lease cannot be seen expired more precisely than a fraction of
// the lease timeout, so reaping more often than a quarter of it (or the poll interval) only costs queries.
func reapInterval(opts Options) time.Duration {
	return max(opts.PollInterval, opts.LeaseTimeout/4)
}

// turn runs one pass of the loop. The database is asked for due work when poll
// is set (a poll interval without local work, a wake-up, reconciliation work), when a backlog may wait
// there, and at least every reap interval while local work keeps the loop busy; local work (fan-out, claims
// of attempts created here) runs always.
func (l *loop) turn(ctx context.Context, poll bool) {
	l.turning.begin()
	defer l.turning.end()
	l.fanOut(ctx)
	l.flushMarks(ctx, false)
	poll = poll || time.Since(l.lastPoll) >= reapInterval(l.opts)
	if l.pressed() {
		l.backlog = true // claimed once the lease writes are fast again
		return
	}
	ordered := l.claimOrdered(ctx, poll)
	l.claimReady(ctx)
	if poll || l.backlog {
		l.lastPoll = time.Now()
		l.claimDue(ctx, ordered, poll)
	}
}

// reconcile runs the reconciliation until ctx ends, in a goroutine of its own beside the loop's turns: Reap
// every reap interval and Repair every repair interval (each jittered, and spaced by choreShare times its
// duration), each again at once while it finds work. On a server that reads the whole queue for their
// queries (the embedded database, FerretDB) a pass takes seconds once a backlog of tens of thousands
// waits; run in the loop, it held up every claim meanwhile (issue 26: the drain stalled 10-45 s a minute).
// Work found (an attempt reaped, a delivery repaired) wakes the loop, whose poll claims what became due.
func (l *loop) reconcile(ctx context.Context) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		worked := false
		l.reconciling.begin()
		if start := time.Now(); l.reap.due(start) {
			reaped, err := l.rec.Reap(ctx)
			if err != nil {
				l.logErr(ctx, err, "reap")
			}
			l.reap.ran(start, time.Now(), reaped)
			worked = reaped
		}
		if start := time.Now(); l.repair.due(start) {
			l.fanning.Lock() // see fanning
			n, err := l.rec.Repair(ctx)
			l.fanning.Unlock()
			if err != nil {
				l.logErr(ctx, err, "repair")
			}
			l.repair.ran(start, time.Now(), n > 0)
			worked = worked || n > 0
		}
		l.reconciling.end()
		if worked {
			l.pollNow()
		}
		next := l.reap.next
		if l.repair.next.Before(next) {
			next = l.repair.next
		}
		timer.Reset(time.Until(next))
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
	}
}

// pressed reports whether the writes that keep leases (renewals, results) take longer than maxLeaseLag of
// the lease timeout now: then no new attempt is leased (claims, heads of lines, the fan-out's leased
// inserts), so that the database's write queue drains before more work waits on it. An attempt leased is
// one that must be POSTed and recorded within its lease, renewed meanwhile through that queue; the
// attempts held already keep their leases and finish.
func (l *loop) pressed() bool {
	return l.lag != nil && l.opts.LeaseTimeout > 0 && l.lag() > l.opts.LeaseTimeout/maxLeaseLag
}

// fanOut creates the deliveries and first attempts of the events published here since the last turn, in
// one batch: the attempts claimAtInsert admits are inserted leased and run at once (none while the lease
// writes are slow, see pressed), the others are kept in the ready queue with their events for claimReady.
func (l *loop) fanOut(ctx context.Context) {
	l.mu.Lock()
	events := l.queued
	l.queued = nil
	l.mu.Unlock()
	if len(events) == 0 {
		return
	}
	var claim func(string) bool
	if !l.pressed() {
		claim = l.claimAtInsert()
	}
	l.fanning.Lock()
	attempts, err := l.store.FanOutClaiming(ctx, l.owner, events, claim)
	l.fanning.Unlock()
	if err != nil {
		if ctx.Err() == nil {
			l.log.Error().Err(err).Int("events", len(events)).Msg("fan-out failed; the reconciler will retry it")
		}
		return
	}
	// Every group's limits (maxConcurrency, ordered) are known before its attempts are admitted: a group
	// registered through another replica a moment ago is read now.
	for _, a := range attempts {
		if !l.endpoints.known(a.ConsumerGroup) {
			if _, err := l.endpoints.get(ctx, a.ConsumerGroup, false); err != nil {
				l.logErr(ctx, err, "read the endpoint of a fanned-out attempt")
			}
		}
	}
	byID := make(map[string]*pulsetype.Event, len(events))
	ids := make([]string, len(events))
	for i, e := range events {
		byID[e.ID] = e
		ids[i] = e.ID
	}
	now := time.Now()
	l.marks.add(ids, now)
	var leased []job
	for _, a := range attempts {
		if a.FencingToken != "" { // inserted leased: run it now
			leased = append(leased, job{a: a, ev: byID[a.EventID], evKnown: true, token: l.limits.holds(a.ConsumerGroup)})
			continue
		}
		if l.endpoints.isInactive(a.ConsumerGroup) {
			continue // paused or disabled: polling finds it after the resume
		}
		if l.endpoints.isOrdered(a.ConsumerGroup) {
			l.moved.add(a.ConsumerGroup) // only the head-of-line claim may take it
			l.fannedOut(a.EventID, now)
			continue
		}
		if !l.ready.push(job{a: a, ev: byID[a.EventID], evKnown: true}) {
			l.backlog = true // left to polling
		}
	}
	l.launchAll(ctx, leased)
}

// claimAtInsert returns the claim function of this turn's fan-out (mongo's FanOutClaiming): it admits, up to
// maxReadyClaim in all, the first attempts that claimReady would lease at once, those of consumer groups
// known active and unordered that the free capacity and the rate limits admit (as takeReady admits them),
// and only while the ready queue is empty (else they would overtake it). The fan-out inserts them leased,
// so they cost no claim.
func (l *loop) claimAtInsert() func(group string) bool {
	if l.ready.len() > 0 {
		return nil
	}
	taken, all := map[string]int{}, 0
	return func(group string) bool {
		if all >= maxReadyClaim || !l.endpoints.known(group) || l.endpoints.isInactive(group) || l.endpoints.isOrdered(group) ||
			!l.slots.admit(group, taken[group], all) || !l.limits.allows(group, taken[group]) {
			return false
		}
		taken[group]++
		all++
		return true
	}
}

// flushMarks clears the fanout marks of fanned-out events with one write once markFlushBatch of them wait
// or the oldest waited a quarter of the lease timeout (or when force is set). A failed clear is left to the
// reconciler, whose repeated fan-out is a no-op.
func (l *loop) flushMarks(ctx context.Context, force bool) {
	ids := l.marks.due(time.Now(), force)
	if len(ids) == 0 {
		return
	}
	if err := l.store.ClearFanOut(ctx, ids); err != nil {
		l.logErr(ctx, err, "clear fanout marks")
	}
}

// claimReady leases, one round trip per batch, the attempts fanned out here that fit the free capacity, and
// runs them with the events they were published with.
func (l *loop) claimReady(ctx context.Context) {
	for ctx.Err() == nil {
		batch := l.takeReady()
		if len(batch) == 0 {
			return
		}
		attempts := make([]*pulsetype.Attempt, len(batch))
		events := make(map[string]*pulsetype.Event, len(batch))
		tokens := map[string]bool{}
		for i, j := range batch {
			attempts[i] = j.a
			events[j.a.EventID] = j.ev
			tokens[j.a.ID] = j.token
		}
		leased, err := l.store.ClaimAttempts(ctx, l.owner, attempts)
		if err != nil {
			l.logErr(ctx, err, "claim attempts created here")
			l.backlog = true // left to polling
			return
		}
		jobs := make([]job, len(leased))
		for i, a := range leased {
			jobs[i] = job{a: a, ev: events[a.EventID], evKnown: true, token: tokens[a.ID]}
		}
		l.launchAll(ctx, jobs)
	}
}

// takeReady removes from the ready queue up to maxReadyClaim attempts that the free capacity admits: the
// worker slots left, each consumer group's maxConcurrency and the reserve (see slots.admit), and the tokens
// of rate-limited groups.
func (l *loop) takeReady() []job {
	if l.slots.free() <= 0 || l.ready.len() == 0 {
		return nil
	}
	jobs := l.ready.take(maxReadyClaim, func(group string, takenGroup, takenAll int) bool {
		return l.slots.admit(group, takenGroup, takenAll) && l.limits.allows(group, takenGroup)
	})
	// The tokens are taken now, so that the claim's round trips overlap the next token's wait (the
	// rate reached is then not cut by them); a job that is not claimed after all leaves its token unused.
	for i := range jobs {
		jobs[i].token = l.limits.holds(jobs[i].a.ConsumerGroup)
	}
	return jobs
}

// claimDue leases due attempts found by polling the database, a batch per round trip while capacity lasts,
// and reads their events with one query per batch. The attempts come from the due window (dueWindow): one
// read of the database (Store.DueAttempts) for the consumer groups that may take part, every known group
// but the ordered ones (left to the head-of-line claim) and the paused or disabled ones, or every group
// when none is left out; each batch is then claimed from it by id (Store.ClaimAttempts), without the groups
// that may not take a worker slot now (maxConcurrency, the reserve, rate limits). When the window holds
// attempts of those groups only, one more read finds the due attempts of the others (on a poll only, so at
// most once a poll interval): it joins the window.
func (l *loop) claimDue(ctx context.Context, ordered []string, poll bool) {
	for ctx.Err() == nil {
		known := l.endpoints.groups()
		out := append(slices.Clone(ordered), l.endpoints.inactive()...)
		var wanted map[string]bool // nil: every group
		if len(out) > 0 {
			wanted = make(map[string]bool, len(known))
			for _, g := range known {
				wanted[g] = true
			}
			for _, g := range out {
				delete(wanted, g)
			}
		}
		exclude, free := l.slots.capacity(known)
		// A rate-limited group takes part while it has tokens, and a batch never takes more of its attempts
		// than it has tokens (as with maxConcurrency).
		for _, g := range l.limits.limited(known) {
			if n := l.limits.available(g); n == 0 {
				exclude = append(exclude, g)
			} else if !slices.Contains(exclude, g) {
				free = min(free, n)
			}
		}
		if free == 0 {
			l.backlog = true
			return
		}
		admit := func(group string) bool { return (wanted == nil || wanted[group]) && !slices.Contains(exclude, group) }
		w := &l.window
		now := time.Now()
		if !w.covers(wanted, now) {
			if wanted != nil && len(wanted) == 0 {
				w.fill(nil, wanted, now, now)
				l.backlog = false
				return
			}
			due, err := l.store.DueAttempts(ctx, groupList(wanted), w.size())
			if err != nil {
				l.logErr(ctx, err, "read due attempts")
				return
			}
			w.fill(due, wanted, now, time.Now())
		}
		w.keep(wanted)
		batch := w.take(min(free, maxClaimBatch), admit)
		if len(batch) == 0 && len(w.items) > 0 && poll {
			// Every attempt left is of a group that may not take a slot now: find the others' due ones.
			others := map[string]bool{}
			for _, g := range known {
				if admit(g) {
					others[g] = true
				}
			}
			if len(others) > 0 {
				due, err := l.store.DueAttempts(ctx, groupList(others), w.size())
				if err != nil {
					l.logErr(ctx, err, "read due attempts")
					return
				}
				w.merge(due)
				batch = w.take(min(free, maxClaimBatch), admit)
			}
			poll = false
		}
		if len(batch) == 0 {
			l.backlog = len(w.items) > 0 // claimed from the window once a slot or a token is free
			return
		}
		leased, err := l.store.ClaimAttempts(ctx, l.owner, batch)
		if err != nil {
			l.logErr(ctx, err, "claim")
			return
		}
		if len(leased) == 0 {
			if len(w.items) == 0 {
				return // read again on the next poll, as a read that finds nothing
			}
			continue // others leased them first, or they ended: the next picks of the window
		}
		ids := make([]string, len(leased))
		for i, a := range leased {
			ids[i] = a.EventID
		}
		events, err := l.store.GetEvents(ctx, ids)
		if err != nil {
			l.logErr(ctx, err, "read events of claimed attempts") // each executor reads its own
		}
		jobs := make([]job, len(leased))
		for i, a := range leased {
			jobs[i] = job{a: a, ev: events[a.EventID], evKnown: err == nil}
		}
		// Groups found ordered only now stay out of this turn's claims: their attempts were given back and
		// would be claimed again at once.
		ordered = append(ordered, l.launchAll(ctx, jobs)...)
	}
}

// groupList returns the groups of a set, sorted (nil for nil: every group).
func groupList(groups map[string]bool) []string {
	if groups == nil {
		return nil
	}
	return slices.Sorted(maps.Keys(groups))
}

// launchAll hands leased attempts to the executor, except those of a group this process did not know as
// ordered yet (registered or changed through another replica), given back for the head-of-line claim, and
// those beyond their group's maxConcurrency or rate limit (claimed before the limit was known), given back
// for a later claim; their groups are returned.
func (l *loop) launchAll(ctx context.Context, jobs []job) (released []string) {
	var launch []job
	for _, j := range jobs {
		ep, err := l.endpoints.get(ctx, j.a.ConsumerGroup, false)
		if err == nil && ep != nil && ep.Ordered || l.slots.full(j.a.ConsumerGroup) || !j.token && !l.limits.take(j.a.ConsumerGroup) {
			if err := l.store.ReleaseAttempt(ctx, j.a); err != nil {
				l.logErr(ctx, err, "release attempt of an ordered, full or rate-limited group")
			}
			l.endpoints.relist()
			if !slices.Contains(released, j.a.ConsumerGroup) {
				released = append(released, j.a.ConsumerGroup)
			}
			continue
		}
		j.release = l.exec.slots.acquire(j.a.ConsumerGroup) // now: the next job's checks count it
		launch = append(launch, j)
	}
	// One read of the state gate answers the whole batch (asked after the leases, before the POSTs).
	l.exec.launchBatch(ctx, launch)
	return released
}

func (l *loop) logErr(ctx context.Context, err error, step string) {
	if ctx.Err() != nil || errors.Is(err, context.Canceled) {
		return
	}
	l.log.Error().Err(err).Str("step", step).Msg("worker loop step failed")
}
