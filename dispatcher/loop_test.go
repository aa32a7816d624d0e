package dispatcher

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pulse-sidecar/pulse/internal/testwait"
	"github.com/pulse-sidecar/pulse/pulsetype"
	"github.com/pulse-sidecar/pulse/webhook"
)

// startDispatcher starts a Dispatcher over store and snd with workers worker slots; a POST never gives its
// slot back early (slowAfter is an hour), so slot counts are exact.
func startDispatcher(t *testing.T, store *memStore, snd *sender, workers int) *Dispatcher {
	t.Helper()
	d := New(store, snd, noReconciler{}, idleKeeper(), Options{Owner: "me", Workers: workers, PollInterval: 20 * time.Millisecond,
		LeaseTimeout: time.Minute, ShutdownTimeout: 5 * time.Second, Logger: zerolog.Nop()})
	d.loop.slots.slowAfter = time.Hour
	if err := d.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)
	return d
}

func events(prefix, topic string, n int) []*pulsetype.Event {
	out := make([]*pulsetype.Event, n)
	for i := range out {
		out[i] = &pulsetype.Event{ID: fmt.Sprintf("%s%02d", prefix, i), Topic: topic, Data: []byte(`{}`),
			CreatedAt: time.Now().Add(time.Duration(i) * time.Millisecond)}
	}
	return out
}

// succeeded counts the deliveries of group that ended in success.
func (s *memStore) succeeded(group string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, d := range s.deliveries {
		if d.ConsumerGroup == group && d.status == pulsetype.StatusSuccess {
			n++
		}
	}
	return n
}

// The loop claims the due attempts it finds by polling (created by another replica) and delivers them.
func TestLoopClaimsDueWork(t *testing.T) {
	t.Parallel()
	store := newMemStore(endpoint(t, "g", []string{"t"}))
	store.publish(events("e", "t", 5)...)
	snd := &sender{}
	startDispatcher(t, store, snd, 4)
	testwait.Eventually(t, 10*time.Second, "5 deliveries to succeed", func() bool { return store.succeeded("g") == 5 })
	if started, _ := snd.posts(); started != 5 {
		t.Fatalf("%d POSTs for 5 deliveries, want 5", started)
	}
}

// Events published here are fanned out and POSTed with the event in memory: no event is read back. Once
// their groups are known, their first attempts are inserted leased: no claim follows the fan-out.
func TestLoopRunsPublishedEvents(t *testing.T) {
	t.Parallel()
	store := newMemStore(endpoint(t, "g", []string{"t"}), endpoint(t, "h", []string{"t"}))
	snd := &sender{}
	d := startDispatcher(t, store, snd, 8)
	d.Published(events("e", "t", 3))
	testwait.Eventually(t, 10*time.Second, "6 deliveries to succeed", func() bool { return store.succeeded("g")+store.succeeded("h") == 6 })
	// The fan-out inserts leased only what the free worker slots admit; a slot is given back after its
	// result is written, so wait for all of them rather than publish while one is still held.
	testwait.Eventually(t, 10*time.Second, "every worker slot to be free", func() bool { return d.loop.slots.free() == 8 })
	claims := store.count("ClaimAttempts")
	d.Published(events("f", "t", 3))
	testwait.Eventually(t, 10*time.Second, "12 deliveries to succeed", func() bool { return store.succeeded("g")+store.succeeded("h") == 12 })
	if n := store.count("ClaimAttempts"); n != claims || store.count("GetEvent")+store.count("GetEvents") != 0 {
		t.Fatalf("%d ClaimAttempts for the second batch, %d GetEvent, %d GetEvents; want its attempts inserted leased, no event read",
			n-claims, store.count("GetEvent"), store.count("GetEvents"))
	}
	d.Stop()
	if store.count("ClearFanOut") == 0 {
		t.Fatal("Stop did not clear the fanout marks it owed")
	}
}

// release opens the gate for POSTs until every one of want deliveries of groups succeeded.
func release(t *testing.T, store *memStore, snd *sender, want int, groups ...string) {
	t.Helper()
	testwait.Eventually(t, 20*time.Second, fmt.Sprintf("%d deliveries to succeed", want), func() bool {
		done := 0
		for _, g := range groups {
			done += store.succeeded(g)
		}
		if done == want {
			return true
		}
		select { // let one more POST go, or check again
		case snd.gate <- struct{}{}:
		case <-time.After(5 * time.Millisecond):
		}
		return false
	})
}

// No more POSTs run at once than there are worker slots, and the last one (the reserve) goes to a group
// with nothing in flight.
func TestLoopRespectsWorkerSlots(t *testing.T) {
	t.Parallel()
	store := newMemStore(endpoint(t, "busy", []string{"t"}), endpoint(t, "idle", []string{"u"}))
	store.publish(events("e", "t", 20)...)
	snd := &sender{gate: make(chan struct{})}
	startDispatcher(t, store, snd, 4)
	testwait.Eventually(t, 10*time.Second, "3 POSTs to run", func() bool { _, running := snd.posts(); return running == 3 })
	store.publish(events("f", "u", 1)...)
	testwait.Eventually(t, 10*time.Second, "the idle group's POST to run", func() bool { _, running := snd.posts(); return running == 4 })
	release(t, store, snd, 21, "busy", "idle")
	if all, byGroup := snd.peaks(); all != 4 || byGroup["busy"] != 3 {
		t.Fatalf("at most %d POSTs ran at once (%v by group) with 4 worker slots, want 4 (3 of the busy group)", all, byGroup)
	}
}

// A consumer group never has more POSTs in flight than its maxConcurrency, while another group uses the
// slots it leaves.
func TestLoopRespectsMaxConcurrency(t *testing.T) {
	t.Parallel()
	capped := endpoint(t, "capped", []string{"t"}, func(ep *pulsetype.Endpoint) { ep.MaxConcurrency = new(2) })
	store := newMemStore(capped, endpoint(t, "free", []string{"t"}))
	store.publish(events("e", "t", 10)...)
	snd := &sender{gate: make(chan struct{})}
	startDispatcher(t, store, snd, 16)
	testwait.Eventually(t, 10*time.Second, "12 POSTs to run", func() bool { _, running := snd.posts(); return running == 12 })
	release(t, store, snd, 20, "capped", "free")
	if _, byGroup := snd.peaks(); byGroup["capped"] != 2 || byGroup["free"] != 10 {
		t.Fatalf("peaks %v, want capped 2 (its maxConcurrency) and free 10", byGroup)
	}
}

// A failed attempt is retried once its delay comes due, and the retry is delivered.
func TestLoopRetries(t *testing.T) {
	t.Parallel()
	fast := func(ep *pulsetype.Endpoint) {
		ep.RetryDelay, ep.MaxRetryDelay = new(pulsetype.Duration(time.Millisecond)), new(pulsetype.Duration(time.Millisecond))
	}
	store := newMemStore(endpoint(t, "g", []string{"t"}, fast))
	snd := &sender{}
	snd.answer = func(r webhook.Request) webhook.Result {
		if r.Attempt == 1 {
			return webhook.Result{Outcome: webhook.OutcomeRetry, HTTPStatus: 500, Message: "HTTP 500"}
		}
		return webhook.Result{Outcome: webhook.OutcomeSuccess, HTTPStatus: 200}
	}
	d := startDispatcher(t, store, snd, 4)
	d.Published(events("e", "t", 1))
	testwait.Eventually(t, 10*time.Second, "the delivery to succeed", func() bool { return store.succeeded("g") == 1 })
	if status, n := store.delivery("g/e00"); status != pulsetype.StatusSuccess || n != 2 {
		t.Fatalf("delivery %s after %d attempts, want success after 2", status, n)
	}
}

// An ordered group's line is POSTed one attempt at a time, oldest event first, through head-of-line claims.
func TestLoopOrderedLine(t *testing.T) {
	t.Parallel()
	store := newMemStore(endpoint(t, "o", []string{"t"}, func(ep *pulsetype.Endpoint) { ep.Ordered = true }))
	evs := events("e", "t", 5)
	store.publish(evs...)
	snd := &sender{}
	startDispatcher(t, store, snd, 8)
	testwait.Eventually(t, 10*time.Second, "5 deliveries to succeed", func() bool { return store.succeeded("o") == 5 })
	snd.mu.Lock()
	defer snd.mu.Unlock()
	var got []string
	for _, r := range snd.requests {
		got = append(got, r.EventID)
	}
	want := []string{"e00", "e01", "e02", "e03", "e04"}
	if !slices.Equal(got, want) || snd.peakAll != 1 {
		t.Fatalf("POSTed %v with up to %d at once, want %v one at a time", got, snd.peakAll, want)
	}
	if store.count("ClaimHeads") == 0 {
		t.Fatal("the ordered line was not claimed by its head")
	}
}

// Stop waits for the POSTs in flight and records their results.
func TestLoopStopRecordsInFlight(t *testing.T) {
	t.Parallel()
	store := newMemStore(endpoint(t, "g", []string{"t"}))
	store.publish(events("e", "t", 2)...)
	snd := &sender{gate: make(chan struct{})}
	d := startDispatcher(t, store, snd, 4)
	testwait.Eventually(t, 10*time.Second, "2 POSTs to run", func() bool { _, running := snd.posts(); return running == 2 })
	stopped := make(chan struct{})
	go func() { d.Stop(); close(stopped) }()
	snd.gate <- struct{}{}
	snd.gate <- struct{}{}
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("Stop did not return")
	}
	if n := store.succeeded("g"); n != 2 {
		t.Fatalf("%d of the 2 deliveries in flight at Stop were recorded, want 2", n)
	}
	d.Stop() // safe twice
}

// While the writes that keep leases are slow (the keeper's Lag above a sixth of the lease timeout), the loop
// leases nothing new: events published here are fanned out unleased, neither they nor the due work polling
// would find are claimed, nothing is POSTed; once the writes are fast again, everything runs (issue 26).
func TestLoopLeasesNothingWhileLeaseWritesAreSlow(t *testing.T) {
	t.Parallel()
	store := newMemStore(endpoint(t, "g", []string{"t"}))
	store.publish(events("due", "t", 3)...)
	keeper := idleKeeper()
	keeper.Observe(time.Minute) // the dispatcher's lease timeout is a minute: far above a sixth of it
	snd := &sender{}
	d := New(store, snd, noReconciler{}, keeper, Options{Owner: "me", Workers: 8, PollInterval: 20 * time.Millisecond,
		LeaseTimeout: time.Minute, ShutdownTimeout: 5 * time.Second, Logger: zerolog.Nop()})
	if err := d.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)
	d.Published(events("a", "t", 2))
	testwait.Eventually(t, 10*time.Second, "the first fan-out", func() bool { return store.count("FanOut") == 1 })
	// The loop's next fan-out comes in a later turn: by then the first turn's claims, if any, were made.
	d.Published(events("b", "t", 2))
	testwait.Eventually(t, 10*time.Second, "the second fan-out", func() bool { return store.count("FanOut") == 2 })
	if started, _ := snd.posts(); started != 0 || store.count("ClaimAttempts") != 0 || store.count("DueAttempts") != 0 || store.succeeded("g") != 0 {
		t.Fatalf("under slow lease writes: %d POSTs, %d ClaimAttempts, %d DueAttempts, %d deliveries; want nothing leased",
			started, store.count("ClaimAttempts"), store.count("DueAttempts"), store.succeeded("g"))
	}
	keeper.Observe(time.Millisecond)
	d.Wake()
	testwait.Eventually(t, 10*time.Second, "7 deliveries once the lease writes are fast", func() bool { return store.succeeded("g") == 7 })
}

// blockingReconciler is a Reconciler whose Reap blocks until its context ends (a reaper's query that scans
// a deep queue for seconds); entered is closed when the first call began.
type blockingReconciler struct {
	once    sync.Once
	entered chan struct{}
}

func (r *blockingReconciler) Reap(ctx context.Context) (bool, error) {
	r.once.Do(func() { close(r.entered) })
	<-ctx.Done()
	return false, ctx.Err()
}

func (r *blockingReconciler) Repair(context.Context) (int, error) { return 0, nil }

// startReconciling starts a Dispatcher over store with rec as its reconciliation, 4 worker slots and the
// given lease timeout; it is stopped when the test ends.
func startReconciling(t *testing.T, store *memStore, rec Reconciler, leaseTimeout time.Duration) *Dispatcher {
	t.Helper()
	d := New(store, &sender{}, rec, idleKeeper(), Options{Owner: "me", Workers: 4, PollInterval: 20 * time.Millisecond,
		LeaseTimeout: leaseTimeout, ShutdownTimeout: 5 * time.Second, Logger: zerolog.Nop()})
	if err := d.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)
	return d
}

// closedWithin fails the test unless c is closed within 10 s.
func closedWithin(t *testing.T, c <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out after 10s waiting for %s", what)
	}
}

// A reconciliation step that takes long (the reaper's query on a server that scans a queue of tens of
// thousands) does not hold up claims: the loop claims and delivers while Reap has not returned.
func TestSlowReconciliationDoesNotHoldClaims(t *testing.T) {
	t.Parallel()
	store := newMemStore(endpoint(t, "g", []string{"t"}))
	rec := &blockingReconciler{entered: make(chan struct{})}
	startReconciling(t, store, rec, time.Minute)
	closedWithin(t, rec.entered, "Reap to be called")
	store.publish(events("e", "t", 5)...)
	testwait.Eventually(t, 10*time.Second, "5 deliveries to succeed while Reap runs", func() bool { return store.succeeded("g") == 5 })
}

// A reconciliation step that found nothing runs again a period later, or choreShare times its duration
// later when that is longer (a scan of seconds on a scanning server); one that found work runs at once.
func TestChoreSpacing(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	c := chore{period: time.Second}
	c.ran(start, start.Add(10*time.Millisecond), false)
	if lo, hi := start.Add(time.Second-time.Duration(float64(time.Second)*pulsetype.Jitter)), start.Add(time.Second+time.Duration(float64(time.Second)*pulsetype.Jitter)); c.next.Before(lo) || c.next.After(hi) {
		t.Fatalf("a quick run: next at %v, want within [%v, %v]", c.next.Sub(start), lo.Sub(start), hi.Sub(start))
	}
	c.ran(start, start.Add(3*time.Second), false)
	if want := start.Add(choreShare * 3 * time.Second); !c.next.Equal(want) {
		t.Fatalf("a run of 3 s: next at %v, want %v", c.next.Sub(start), want.Sub(start))
	}
	c.ran(start, start.Add(3*time.Second), true)
	if want := start.Add(3 * time.Second); !c.next.Equal(want) {
		t.Fatalf("a run that worked: next at %v, want at its end %v", c.next.Sub(start), want.Sub(start))
	}
	// A run of 20 s (a database that stalled) spaces the next no further than the period and the stretch.
	bounded := chore{period: time.Second, stretch: 5 * time.Second}
	bounded.ran(start, start.Add(20*time.Second), false)
	if want := start.Add(6 * time.Second); !bounded.next.Equal(want) {
		t.Fatalf("a run of 20 s with a stretch of 5 s: next at %v, want %v", bounded.next.Sub(start), want.Sub(start))
	}
}

// Review (s3): with slots given back at the POST's end, nothing in the dispatcher bounds how many attempts
// are leased with their results not recorded. While the first result write is held (a database whose
// result writes wait), with 2 worker slots, the loop must not lease more than one full batch of results
// (maxRecordBatch) or what held slots allowed before (17 × Workers with the overflow), whichever is larger:
// every attempt leased and POSTed with no result written is renewed meanwhile, and POSTed again if this
// process dies.
func TestLeasedUnrecordedAttemptsAreBounded(t *testing.T) {
	t.Parallel()
	const workers = 2
	bound := max(maxRecordBatch, (overflowShare+1)*workers)
	store := newMemStore(endpoint(t, "g", []string{"t"}))
	store.finishGate = make(chan struct{})
	store.publish(events("e", "t", bound+64)...)
	snd := &sender{}
	startDispatcher(t, store, snd, workers)
	t.Cleanup(func() { close(store.finishGate) }) // before the dispatcher's Stop (cleanups run last first)
	testwait.Eventually(t, 10*time.Second, "the first result write to start", func() bool { return store.count("FinishAttempts") == 1 })
	// Watch for a while: the violation, if any, comes within milliseconds (POSTs here are instant).
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); {
		if started, _ := snd.posts(); started > bound {
			t.Fatalf("%d attempts POSTed while the first result write is held (0 recorded), want at most %d", started, bound)
		}
		time.Sleep(5 * time.Millisecond) // the pause between two checks
	}
}

// Review (s3): Stop lets the POSTs in flight finish and be recorded within ShutdownTimeout, then aborts the
// rest (Dispatcher.Stop). A result that waits for the completer is not aborted: Stop waits until it is
// written. With slots given back at the POST's end, the results waiting are as many as the loop leased
// meanwhile, so Stop takes a batch write per maxRecordBatch of them past the grace. Here each result write
// takes about 400 ms: Stop must return within the grace plus two of them.
func TestStopWaitsNoLongerThanTheGraceAndABatch(t *testing.T) {
	t.Parallel()
	const workers, pace, grace = 2, 400 * time.Millisecond, 300 * time.Millisecond
	store := newMemStore(endpoint(t, "g", []string{"t"}))
	store.finishGate = make(chan struct{})
	paced := make(chan struct{})
	go func() { // each result write waits a pace: a database whose writes are slow
		ticker := time.NewTicker(pace)
		defer ticker.Stop()
		for {
			select {
			case <-paced:
				close(store.finishGate)
				return
			case <-ticker.C:
				select {
				case store.finishGate <- struct{}{}:
				case <-paced:
					close(store.finishGate)
					return
				}
			}
		}
	}()
	t.Cleanup(func() { close(paced) })
	store.publish(events("e", "t", 3000)...)
	snd := &sender{}
	d := New(store, snd, noReconciler{}, idleKeeper(), Options{Owner: "me", Workers: workers, PollInterval: 20 * time.Millisecond,
		LeaseTimeout: time.Minute, ShutdownTimeout: grace, Logger: zerolog.Nop()})
	d.loop.slots.slowAfter = time.Hour
	if err := d.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	// Stop once 1024 results wait for the completer (4 batches), or after 6 result writes when the loop leases
	// no more than it records.
	testwait.Eventually(t, 30*time.Second, "1024 results waiting, or 6 result writes", func() bool {
		started, _ := snd.posts()
		store.mu.Lock()
		recorded := 0
		for _, ids := range store.finished {
			recorded += len(ids)
		}
		store.mu.Unlock()
		return started-recorded >= 1024 || store.count("FinishAttempts") >= 6
	})
	start := time.Now()
	d.Stop()
	took := time.Since(start)
	started, _ := snd.posts()
	t.Logf("Stop took %v; %d POSTs started, %d result writes", took.Round(time.Millisecond), started, store.count("FinishAttempts"))
	if limit := grace + 2*pace; took > limit {
		t.Fatalf("Stop took %v with %d POSTs started and %d result writes, want at most %v (the grace and two result writes)",
			took.Round(time.Millisecond), started, store.count("FinishAttempts"), limit)
	}
}

// Review (s3): the brake the slots' change relies on ("no new attempt is leased while those writes lag",
// loop.pressed) reads lease.Keeper.Lag, which counts a result write only once it was answered: a result
// write in flight for longer than a sixth of the lease timeout does not press the loop.
func TestPressedWhileAResultWriteHangs(t *testing.T) {
	t.Parallel()
	const lease = 600 * time.Millisecond // pressed above 100 ms of lag
	store := newMemStore(endpoint(t, "g", []string{"t"}))
	store.finishGate = make(chan struct{})
	store.publish(events("e", "t", 1)...)
	d := New(store, &sender{}, noReconciler{}, idleKeeper(), Options{Owner: "me", Workers: 2, PollInterval: 20 * time.Millisecond,
		LeaseTimeout: lease, ShutdownTimeout: 5 * time.Second, Logger: zerolog.Nop()})
	if err := d.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)
	t.Cleanup(func() { close(store.finishGate) }) // before Stop
	testwait.Eventually(t, 10*time.Second, "the result write to start", func() bool { return store.count("FinishAttempts") == 1 })
	testwait.Eventually(t, 5*time.Second, "the loop pressed by a result write held for seconds", d.loop.pressed)
}

// Review (s3), a check that holds: with slots given back at the POST's end, an ordered line's next head is
// still not POSTed while the previous head's result write is held (the store's head claim skips a line whose
// head is leased or ended, and the loop looks again only once the result was recorded).
func TestOrderedNextHeadWaitsForTheRecordedResult(t *testing.T) {
	t.Parallel()
	store := newMemStore(endpoint(t, "o", []string{"t"}, func(ep *pulsetype.Endpoint) { ep.Ordered = true }))
	store.finishGate = make(chan struct{})
	store.publish(events("e", "t", 3)...)
	snd := &sender{}
	startDispatcher(t, store, snd, 4)
	t.Cleanup(func() { close(store.finishGate) }) // before the dispatcher's Stop
	testwait.Eventually(t, 10*time.Second, "the first head's result write", func() bool { return store.count("FinishAttempts") == 1 })
	polls := store.count("ClaimHeads")
	testwait.Eventually(t, 10*time.Second, "more head claims while the write is held", func() bool { return store.count("ClaimHeads") >= polls+5 })
	if started, _ := snd.posts(); started != 1 {
		t.Fatalf("%d POSTs of the line while its first result is not recorded, want 1", started)
	}
	store.finishGate <- struct{}{}
	testwait.Eventually(t, 10*time.Second, "the second head's POST once the first is recorded", func() bool {
		started, _ := snd.posts()
		return started == 2
	})
}

// stallingReconciler is a Reconciler whose first Reap is held up for stall (a database that stops answering
// for a while: a failover, a paused process) and finds nothing; later calls answer at once. It records when
// each Reap call began and when the first one returned.
type stallingReconciler struct {
	stall    time.Duration
	mu       sync.Mutex
	calls    []time.Time
	returned time.Time
}

func (r *stallingReconciler) Reap(ctx context.Context) (bool, error) {
	r.mu.Lock()
	r.calls = append(r.calls, time.Now())
	first := len(r.calls) == 1
	r.mu.Unlock()
	if first {
		select {
		case <-time.After(r.stall):
		case <-ctx.Done():
		}
		r.mu.Lock()
		r.returned = time.Now()
		r.mu.Unlock()
	}
	return false, nil
}

func (r *stallingReconciler) Repair(context.Context) (int, error) { return 0, nil }

// A reap held up by a database that stalled for a while (and so found nothing) does not blind the reaper for
// ten times the stall: a replica that died meanwhile must still have its leases reaped within about a lease
// timeout once the database answers again. Here the first Reap waits 1.5 s on the database (lease timeout
// 400 ms, reap interval 100 ms); the next must begin within two lease timeouts of its return, not 15 s later.
func TestReapAfterADatabaseStallIsNotDeferred(t *testing.T) {
	t.Parallel()
	store := newMemStore(endpoint(t, "g", []string{"t"}))
	rec := &stallingReconciler{stall: 1500 * time.Millisecond}
	const leaseTimeout = 400 * time.Millisecond
	startReconciling(t, store, rec, leaseTimeout)
	calls := func() (int, time.Time) {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return len(rec.calls), rec.returned
	}
	testwait.Eventually(t, 10*time.Second, "the stalled Reap to return", func() bool { _, r := calls(); return !r.IsZero() })
	deadline := time.Now().Add(5 * time.Second)
	for {
		n, returned := calls()
		if n >= 2 {
			rec.mu.Lock()
			next := rec.calls[1]
			rec.mu.Unlock()
			if gap := next.Sub(returned); gap > 2*leaseTimeout {
				t.Fatalf("next Reap %v after the stalled one returned, want within %v", gap, 2*leaseTimeout)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no Reap within %v of the stalled one's return (%d calls), want within %v",
				time.Since(returned).Round(time.Millisecond), n, 2*leaseTimeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// heldRepair is a Reconciler whose first Repair holds until release is closed; repairing is closed when it
// began.
type heldRepair struct {
	once               sync.Once
	repairing, release chan struct{}
}

func (r *heldRepair) Reap(context.Context) (bool, error) { return false, nil }

func (r *heldRepair) Repair(ctx context.Context) (int, error) {
	first := false
	r.once.Do(func() { first = true; close(r.repairing) })
	if first {
		select {
		case <-r.release:
		case <-ctx.Done():
		}
	}
	return 0, nil
}

// A fan-out of this process never runs while its Repair does: the repair scan takes a fan-out's queue
// documents without deliveries, older than a lease timeout, for a dead fan-out's and removes them (the
// attempt would then stay pending with no queue document). Published events wait for the repair, then are
// fanned out and delivered.
func TestFanOutWaitsForARepair(t *testing.T) {
	t.Parallel()
	store := newMemStore(endpoint(t, "g", []string{"t"}))
	rec := &heldRepair{repairing: make(chan struct{}), release: make(chan struct{})}
	d := startReconciling(t, store, rec, time.Minute)
	closedWithin(t, rec.repairing, "Repair to be called")
	d.Published(events("e", "t", 3))
	// The loop takes the events and blocks on the fan-out: wait until they left the queue of published events.
	testwait.Eventually(t, 10*time.Second, "the loop to take the published events", func() bool {
		d.loop.mu.Lock()
		defer d.loop.mu.Unlock()
		return len(d.loop.queued) == 0
	})
	if n := store.count("FanOut"); n != 0 {
		t.Fatalf("%d fan-outs while Repair ran, want 0", n)
	}
	close(rec.release)
	testwait.Eventually(t, 10*time.Second, "3 deliveries after the repair", func() bool { return store.succeeded("g") == 3 })
}
