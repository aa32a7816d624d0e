package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pulse-sidecar/pulse/internal/testwait"
	"github.com/pulse-sidecar/pulse/lease"
	"github.com/pulse-sidecar/pulse/pulsetype"
	"github.com/pulse-sidecar/pulse/webhook"
)

type executorBundle struct {
	store *memStore
	snd   *sender
	obs   *observer
	exec  *executor
	ended chan string
}

// newTestExecutor returns an executor over store and snd, with its completer started.
func newTestExecutor(t *testing.T, store *memStore, snd *sender) *executorBundle {
	t.Helper()
	b := &executorBundle{store: store, snd: snd, obs: &observer{}, ended: make(chan string, 100)}
	endpoints := newEndpointCache(store, time.Second)
	c := newCompleter(store, b.obs, func() {}, nil, zerolog.Nop())
	if err := c.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	b.exec = &executor{store: store, sender: snd, endpoints: endpoints, keeper: idleKeeper(), completer: c,
		slots: newSlots(4, endpoints.limit, func() {}), now: time.Now, observer: b.obs, log: zerolog.Nop(),
		ended: func(group string) { b.ended <- group }}
	b.exec.start(t.Context())
	t.Cleanup(func() { b.exec.stop(time.Second) })
	return b
}

// run runs j as execute does, its lease held by the keeper as granted, and returns what run returns.
func (b *executorBundle) run(ctx context.Context, j job) (pulsetype.Completion, bool) {
	b.exec.keeper.Hold(j.a.Key(), b.exec.leaseLeft(j.a), func(error) {})
	defer b.exec.keeper.Release(j.a.Key())
	return b.exec.run(ctx, j, zerolog.Nop())
}

// claim publishes an event of topic t and leases its attempt for group g.
func (b *executorBundle) claim(t *testing.T, ev *pulsetype.Event) *pulsetype.Attempt {
	t.Helper()
	b.store.publish(ev)
	attempts, err := b.store.ClaimBatch(context.Background(), "me", nil, 1)
	if err != nil || len(attempts) != 1 {
		t.Fatalf("ClaimBatch = %v, %v; want one attempt", attempts, err)
	}
	return attempts[0]
}

// The executor turns the POST's result into what follows it by the group's retry policy, and ends without a
// POST an attempt its group no longer wants or whose event expired.
func TestExecutorDecides(t *testing.T) {
	t.Parallel()
	past := time.Now().Add(-time.Minute)
	handler := func(r webhook.Result) func(webhook.Request) webhook.Result {
		return func(webhook.Request) webhook.Result { return r }
	}
	tests := []struct {
		name      string
		endpoint  func(*pulsetype.Endpoint)
		event     pulsetype.Event
		answer    func(webhook.Request) webhook.Result
		unknownEv bool // the job does not carry the event: the executor reads it
		wantPOST  bool
		wantRetry bool
		wantDelay time.Duration // when wantRetry and not 0
		wantEnd   pulsetype.Status
		wantCode  pulsetype.ErrorCode
	}{
		{name: "success ends the delivery", wantPOST: true, wantEnd: pulsetype.StatusSuccess},
		{name: "a failure is retried", answer: handler(webhook.Result{Outcome: webhook.OutcomeRetry, HTTPStatus: 500, Message: "HTTP 500"}),
			wantPOST: true, wantRetry: true},
		{name: "Retry-After sets the delay", answer: handler(webhook.Result{Outcome: webhook.OutcomeRetry, HTTPStatus: 429, RetryAfter: 30 * time.Second}),
			wantPOST: true, wantRetry: true, wantDelay: 30 * time.Second},
		{name: "a terminal answer ends the delivery", answer: handler(webhook.Result{Outcome: webhook.OutcomeTerminal, HTTPStatus: 404}),
			wantPOST: true, wantEnd: pulsetype.StatusError, wantCode: pulsetype.CodeHandlerError},
		{name: "no retries left", endpoint: func(ep *pulsetype.Endpoint) { ep.MaxRetries = new(0) },
			answer: handler(webhook.Result{Outcome: webhook.OutcomeRetry, HTTPStatus: 500}), wantPOST: true,
			wantEnd: pulsetype.StatusError, wantCode: pulsetype.CodeHandlerError},
		{name: "another incarnation of the group", endpoint: func(ep *pulsetype.Endpoint) { ep.Incarnation = "registered again" },
			wantEnd: pulsetype.StatusError, wantCode: pulsetype.CodeEndpointDeleted},
		{name: "the group dropped the topic", endpoint: func(ep *pulsetype.Endpoint) { ep.Topics = []string{"other"} },
			wantEnd: pulsetype.StatusError, wantCode: pulsetype.CodeUnsubscribed},
		{name: "the event expired", event: pulsetype.Event{ExpiresAt: &past},
			wantEnd: pulsetype.StatusError, wantCode: pulsetype.CodeEventExpired},
		{name: "the event is read when not carried", unknownEv: true, wantPOST: true, wantEnd: pulsetype.StatusSuccess},
		{name: "the group is deleted while the POST runs", wantPOST: true, wantEnd: pulsetype.StatusError, wantCode: pulsetype.CodeEndpointDeleted},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			store := newMemStore(endpoint(t, "g", []string{"t"}))
			snd := &sender{answer: tt.answer}
			if tt.name == "the group is deleted while the POST runs" {
				snd.answer = func(webhook.Request) webhook.Result {
					store.mu.Lock()
					delete(store.endpoints, "g")
					store.mu.Unlock()
					return webhook.Result{Outcome: webhook.OutcomeRetry, HTTPStatus: 503}
				}
			}
			b := newTestExecutor(t, store, snd)
			ev := tt.event
			ev.ID, ev.Topic, ev.Data = "e1", "t", []byte(`{"n":1}`)
			a := b.claim(t, &ev)
			if tt.endpoint != nil { // changed after the fan-out
				ep := endpoint(t, "g", []string{"t"}, tt.endpoint)
				store.mu.Lock()
				store.endpoints["g"] = ep
				store.mu.Unlock()
			}
			j := job{a: a, ev: &ev, evKnown: true}
			if tt.unknownEv {
				j = job{a: a}
			}
			c, ok := b.run(t.Context(), j)
			if !ok {
				t.Fatal("the attempt was abandoned")
			}
			if started, _ := snd.posts(); started != map[bool]int{true: 1}[tt.wantPOST] {
				t.Fatalf("%d POSTs, want POST %v", started, tt.wantPOST)
			}
			if c.Attempt != a || c.Next.Retry != tt.wantRetry || !tt.wantRetry && c.Next.EndStatus != tt.wantEnd {
				t.Fatalf("completion %+v, want retry %v or end %s", c, tt.wantRetry, tt.wantEnd)
			}
			if tt.wantRetry && (c.Next.Delay <= 0 || tt.wantDelay != 0 && c.Next.Delay != tt.wantDelay) {
				t.Fatalf("retry after %s, want %s (or > 0)", c.Next.Delay, tt.wantDelay)
			}
			if tt.wantCode != "" && (c.Next.EndError == nil || c.Next.EndError.Code != tt.wantCode) {
				t.Fatalf("ended with %v, want code %s", c.Next.EndError, tt.wantCode)
			}
			if tt.unknownEv && store.count("GetEvent") != 1 {
				t.Fatalf("%d GetEvent, want 1", store.count("GetEvent"))
			}
		})
	}
}

// A 410 Gone disables the endpoint before the delivery moves on, and the delivery waits: its next attempt
// follows at once without counting against maxRetries (with at-most-once the delivery ends instead). An
// attempt of a paused endpoint is given back unstarted, without a POST.
func TestExecutorGoneAndPaused(t *testing.T) {
	t.Parallel()
	gone := func(webhook.Request) webhook.Result {
		return webhook.Result{Outcome: webhook.OutcomeTerminal, HTTPStatus: 410, Message: "HTTP 410 Gone"}
	}
	for _, atMostOnce := range []bool{false, true} {
		store := newMemStore(endpoint(t, "g", []string{"t"}, func(ep *pulsetype.Endpoint) {
			ep.MaxRetries = new(0)
			if atMostOnce {
				ep.Delivery = pulsetype.AtMostOnce
			}
		}))
		b := newTestExecutor(t, store, &sender{answer: gone})
		ev := pulsetype.Event{ID: "e1", Topic: "t", Data: []byte(`1`)}
		a := b.claim(t, &ev)
		c, ok := b.run(t.Context(), job{a: a, ev: &ev, evKnown: true})
		if !ok || c.Result.HTTPStatus != 410 || c.Result.Error.CodeOrEmpty() != pulsetype.CodeEndpointGone || c.Result.Terminal {
			t.Fatalf("at-most-once %v: result %+v (ok %v), want HTTP 410 recorded as endpoint_gone", atMostOnce, c.Result, ok)
		}
		if want := !atMostOnce; c.Next.Retry != want || c.Next.Uncounted != want || c.Next.Delay != 0 {
			t.Fatalf("at-most-once %v: next %+v, want retry %v at once, uncounted", atMostOnce, c.Next, want)
		}
		if ep, _ := store.GetEndpoint(t.Context(), "g"); ep.State != pulsetype.EndpointDisabled || ep.StateReason != pulsetype.ReasonGone {
			t.Fatalf("at-most-once %v: endpoint %s/%s, want disabled/gone", atMostOnce, ep.State, ep.StateReason)
		}
		if ref := pulsetype.NextRef(a, c.Next); !atMostOnce && ref.Uncounted != 1 {
			t.Fatalf("the next attempt carries uncounted %d, want 1", ref.Uncounted)
		}
	}

	store := newMemStore(endpoint(t, "g", []string{"t"}))
	snd := &sender{}
	b := newTestExecutor(t, store, snd)
	ev := pulsetype.Event{ID: "e2", Topic: "t", Data: []byte(`1`)}
	a := b.claim(t, &ev)
	store.setState("g", pulsetype.EndpointPaused, pulsetype.ReasonPaused)
	a.Number = 2 // a retry reads its endpoint fresh
	if _, ok := b.run(t.Context(), job{a: a, ev: &ev, evKnown: true}); ok {
		t.Fatal("an attempt of a paused endpoint was run")
	}
	if started, _ := snd.posts(); started != 0 || store.count("ReleaseAttempt") != 1 {
		t.Fatalf("%d POSTs and %d releases, want none and one", started, store.count("ReleaseAttempt"))
	}
	if !b.exec.endpoints.isInactive("g") {
		t.Fatal("the cache does not hold the group as paused")
	}
}

// An attempt whose lease is lost while its POST runs is abandoned: nothing is recorded, the loss is
// reported.
func TestExecutorLeaseLost(t *testing.T) {
	t.Parallel()
	store := newMemStore(endpoint(t, "g", []string{"t"}))
	ctx, cancel := context.WithCancelCause(t.Context())
	snd := &sender{answer: func(webhook.Request) webhook.Result {
		cancel(pulsetype.ErrLeaseLost) // what the keeper does when a renewal finds the lease gone
		return webhook.Result{Outcome: webhook.OutcomeSuccess, HTTPStatus: 200}
	}}
	b := newTestExecutor(t, store, snd)
	ev := &pulsetype.Event{ID: "e1", Topic: "t"}
	a := b.claim(t, ev)
	if _, ok := b.run(ctx, job{a: a, ev: ev, evKnown: true}); ok {
		t.Fatal("an attempt whose lease was lost was not abandoned")
	}
	if _, lost := b.obs.counts(); lost != 1 {
		t.Fatalf("%d leases lost reported, want 1", lost)
	}
}

// launch runs the attempt in a worker slot, records its result through the completer, gives the slot back
// and reports the group as ended.
func TestExecutorLaunchRecords(t *testing.T) {
	t.Parallel()
	store := newMemStore(endpoint(t, "g", []string{"t"}))
	snd := &sender{gate: make(chan struct{})}
	b := newTestExecutor(t, store, snd)
	ev := &pulsetype.Event{ID: "e1", Topic: "t"}
	a := b.claim(t, ev)
	b.exec.launch(job{a: a, ev: ev, evKnown: true})
	if free := b.exec.slots.free(); free != 3 {
		t.Fatalf("free slots while the POST runs = %d, want 3", free)
	}
	snd.gate <- struct{}{}
	select {
	case g := <-b.ended:
		if g != "g" {
			t.Fatalf("ended %q, want g", g)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the attempt did not end")
	}
	if status, _ := store.delivery(a.DeliveryID); status != pulsetype.StatusSuccess {
		t.Fatalf("delivery %s, want success", status)
	}
	if free := b.exec.slots.free(); free != 4 {
		t.Fatalf("free slots after the POST = %d, want 4", free)
	}
}

// stop aborts the attempts still running after the grace period; they record nothing.
func TestExecutorStopAborts(t *testing.T) {
	t.Parallel()
	store := newMemStore(endpoint(t, "g", []string{"t"}))
	snd := &sender{gate: make(chan struct{})} // never opened: the POST ends only by cancellation
	b := newTestExecutor(t, store, snd)
	ev := &pulsetype.Event{ID: "e1", Topic: "t"}
	a := b.claim(t, ev)
	b.exec.launch(job{a: a, ev: ev, evKnown: true})
	testwait.Eventually(t, 10*time.Second, "the POST to start", func() bool { started, _ := snd.posts(); return started == 1 })
	b.exec.stop(10 * time.Millisecond)
	if _, running := snd.posts(); running != 0 {
		t.Fatal("stop returned with a POST running")
	}
	if n := store.count("FinishAttempts"); n != 0 {
		t.Fatalf("an aborted attempt was recorded (%d FinishAttempts)", n)
	}
	if status, _ := store.delivery(a.DeliveryID); status != pulsetype.StatusPending {
		t.Fatalf("delivery %s, want pending (left to lease expiry)", status)
	}
}

// No POST starts on a lease that ran out (as granted, no heartbeat renewed it) before the checks before the
// POST were done, unless a renewal sent then finds it still this process's: one reaped meanwhile is not
// POSTed, one whose renewal fails is given back unstarted (the reaper may end it), and one the renewal finds
// held is renewed and POSTed (without that renewal a claim whose writes waited more than half the lease was
// given back every time: no delivery at all).
func TestExecutorStartsNoPOSTOnALeaseThatRanOut(t *testing.T) {
	t.Parallel()
	store := newMemStore(endpoint(t, "g", []string{"t"}))
	snd := &sender{}
	b := newTestExecutor(t, store, snd)
	n := 0
	ranOut := func(fail error) (*pulsetype.Event, *pulsetype.Attempt) {
		n++
		b.exec.keeper = lease.NewKeeper(store.renew(fail), time.Minute, nil, zerolog.Nop())
		ev := &pulsetype.Event{ID: fmt.Sprint("e", n), Topic: "t", Data: []byte(`1`)}
		a := *b.claim(t, ev)
		past := time.Now().Add(-time.Millisecond)
		a.LeasedUntil = &past
		return ev, &a
	}
	want := func(what string, posts, renewals, releases int) {
		t.Helper()
		if started, _ := snd.posts(); started != posts || store.count("Renew") != renewals || store.count("ReleaseAttempt") != releases {
			t.Fatalf("%s: %d POSTs, %d Renew, %d ReleaseAttempt; want %d, %d, %d", what, started, store.count("Renew"),
				store.count("ReleaseAttempt"), posts, renewals, releases)
		}
	}

	ev, a := ranOut(errors.New("renew leases: i/o timeout"))
	if _, ok := b.run(t.Context(), job{a: a, ev: ev, evKnown: true}); ok {
		t.Fatal("an attempt whose lease ran out and could not be renewed was run")
	}
	want("renewal failed", 0, 1, 1)

	ev, a = ranOut(nil)
	store.mu.Lock()
	store.attempts[a.ID].Status = pulsetype.StatusError // reaped meanwhile (worker_lost)
	store.mu.Unlock()
	if _, ok := b.run(t.Context(), job{a: a, ev: ev, evKnown: true}); ok {
		t.Fatal("an attempt whose lease ran out and was reaped was run")
	}
	want("reaped", 0, 2, 2) // the give-back finds it lost, and changes nothing

	ev, a = ranOut(nil)
	if _, ok := b.run(t.Context(), job{a: a, ev: ev, evKnown: true}); !ok {
		t.Fatal("an attempt whose lease ran out but was renewed before the POST was not run")
	}
	want("renewed", 1, 3, 2)

	ev = &pulsetype.Event{ID: "live", Topic: "t", Data: []byte(`1`)}
	a = b.claim(t, ev)
	if _, ok := b.run(t.Context(), job{a: a, ev: ev, evKnown: true}); !ok {
		t.Fatal("an attempt on a live lease was not run")
	}
	want("live", 2, 3, 2) // a live lease costs no renewal before its POST
}

// A retry that starts past its delivery's retry window (it waited for a resume after a 410 Gone, or a
// backlog, longer than the claim latency windowGrace allows) ends the delivery error/retry_window_exceeded
// without a POST; one inside the window is POSTed.
func TestRetryPastItsWindowEndsWithoutAPost(t *testing.T) {
	t.Parallel()
	store := newMemStore(endpoint(t, "g", []string{"t"}, func(ep *pulsetype.Endpoint) { ep.MaxRetryDuration = pulsetype.Duration(2 * time.Second) }))
	store.publish(events("late", "t", 1)...)
	store.publish(events("inside", "t", 1)...)
	store.mu.Lock()
	for id, start := range map[string]time.Time{"g/late00#1": time.Now().Add(-time.Minute), "g/inside00#1": time.Now().Add(-time.Second)} {
		a := store.attempts[id]
		a.Number, a.FirstAttemptAt = 2, start // a retry of a delivery whose first attempt started then
	}
	store.mu.Unlock()
	snd := &sender{}
	startDispatcher(t, store, snd, 4)
	testwait.Eventually(t, 10*time.Second, "both deliveries to end", func() bool {
		late, _ := store.delivery("g/late00")
		inside, _ := store.delivery("g/inside00")
		return late != pulsetype.StatusPending && inside != pulsetype.StatusPending
	})
	if st, _ := store.delivery("g/inside00"); st != pulsetype.StatusSuccess {
		t.Fatalf("the retry inside its window ended %s, want success", st)
	}
	if st, _ := store.delivery("g/late00"); st != pulsetype.StatusError {
		t.Fatalf("the retry past its window ended %s, want error", st)
	}
	store.mu.Lock()
	code := store.attempts["g/late00#1"].Error.CodeOrEmpty()
	store.mu.Unlock()
	if code != pulsetype.CodeRetryWindow {
		t.Fatalf("the retry past its window ended with code %q, want %s", code, pulsetype.CodeRetryWindow)
	}
	snd.mu.Lock()
	defer snd.mu.Unlock()
	if len(snd.requests) != 1 || snd.requests[0].ConsumerGroup != "g" || !strings.Contains(snd.requests[0].DeliveryID, "inside") {
		t.Fatalf("POSTs = %+v, want the one inside the window only", snd.requests)
	}
}
