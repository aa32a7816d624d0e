package dispatcher

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pulse-sidecar/pulse/internal/startstop"
	"github.com/pulse-sidecar/pulse/internal/testwait"
	"github.com/pulse-sidecar/pulse/pulsetype"
)

// observer records what the dispatcher reports.
type observer struct {
	mu       sync.Mutex
	outcomes map[string]int
	lost     int
}

func (o *observer) AttemptDone(_ string, outcome string, _ time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.outcomes == nil {
		o.outcomes = map[string]int{}
	}
	o.outcomes[outcome]++
}

func (o *observer) EndpointDisabled(string, pulsetype.StateReason) {}

func (o *observer) LeaseLost(string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.lost++
}

func (o *observer) counts() (outcomes map[string]int, lost int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	outcomes = map[string]int{}
	for k, v := range o.outcomes {
		outcomes[k] = v
	}
	return outcomes, o.lost
}

// leased returns n attempts of group g, leased in store, each with a successful result.
func leased(t *testing.T, store *memStore, n int) []pulsetype.Completion {
	t.Helper()
	for i := range n {
		store.publish(&pulsetype.Event{ID: "e" + string(rune('a'+i)), Topic: "t"})
	}
	attempts, err := store.ClaimBatch(context.Background(), "me", nil, n)
	if err != nil || len(attempts) != n {
		t.Fatalf("ClaimBatch = %d attempts, %v; want %d", len(attempts), err, n)
	}
	cs := make([]pulsetype.Completion, n)
	for i, a := range attempts {
		cs[i] = pulsetype.Completion{Attempt: a, Result: pulsetype.AttemptResult{Status: pulsetype.StatusSuccess},
			Next: pulsetype.NextStep{EndStatus: pulsetype.StatusSuccess}}
	}
	return cs
}

// completeAll runs complete for each completion in a goroutine and returns a channel that receives each
// one's answer.
func completeAll(c *completer, cs []pulsetype.Completion) <-chan bool {
	out := make(chan bool, len(cs))
	for _, cp := range cs {
		go func() { out <- c.complete(cp, zerolog.Nop()) }()
	}
	return out
}

// recv returns the next value of ch, failing the test after 10 s.
func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: not within 10s", what)
		panic("unreachable")
	}
}

// send sends v on ch, failing the test after 10 s.
func send[T any](t *testing.T, ch chan<- T, v T, what string) {
	t.Helper()
	select {
	case ch <- v:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: not within 10s", what)
	}
}

func (c *completer) queued() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.queue)
}

// Results that arrive while a batch is being written are written together by the next one: six results,
// two FinishAttempts and two FollowUps.
func TestCompleterGroupCommit(t *testing.T) {
	t.Parallel()
	store := newMemStore(endpoint(t, "g", []string{"t"}))
	store.finishing, store.finishGate = make(chan int, 10), make(chan struct{})
	cs := leased(t, store, 6)
	obs := &observer{}
	c := newCompleter(store, obs, func() {}, nil, zerolog.Nop())
	if err := c.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	t.Cleanup(func() { close(store.finishGate) }) // runs first: a failed test does not leave Stop waiting
	first := completeAll(c, cs[:1])
	if n := recv(t, store.finishing, "the first batch"); n != 1 {
		t.Fatalf("first batch of %d, want 1", n)
	}
	rest := completeAll(c, cs[1:])
	testwait.Eventually(t, 10*time.Second, "five results queued", func() bool { return c.queued() == 5 })
	send(t, store.finishGate, struct{}{}, "the first batch to be written")
	if n := recv(t, store.finishing, "the second batch"); n != 5 {
		t.Fatalf("second batch of %d, want the 5 that arrived meanwhile", n)
	}
	send(t, store.finishGate, struct{}{}, "the second batch to be written")
	if !recv(t, first, "the first result") {
		t.Fatal("complete reported the result as not recorded")
	}
	for range 5 {
		if !recv(t, rest, "the other results") {
			t.Fatal("complete reported a result as not recorded")
		}
	}
	if f, u := store.count("FinishAttempts"), store.count("FollowUps"); f != 2 || u != 2 {
		t.Fatalf("%d FinishAttempts and %d FollowUps for 6 results, want 2 and 2", f, u)
	}
	for _, cp := range cs {
		if status, _ := store.delivery(cp.Attempt.DeliveryID); status != pulsetype.StatusSuccess {
			t.Fatalf("delivery %s is %s, want success", cp.Attempt.DeliveryID, status)
		}
	}
	if outcomes, _ := obs.counts(); outcomes["success"] != 6 {
		t.Fatalf("observer saw %v, want 6 successes", outcomes)
	}
}

// Stop writes what is queued before it returns, then refuses new results; it is safe before Start and
// twice.
func TestCompleterStopFlushes(t *testing.T) {
	t.Parallel()
	store := newMemStore(endpoint(t, "g", []string{"t"}))
	store.finishing, store.finishGate = make(chan int, 10), make(chan struct{}, 10)
	cs := leased(t, store, 4)
	c := newCompleter(store, nil, func() {}, nil, zerolog.Nop())
	c.Stop() // before Start
	if c.complete(cs[0], zerolog.Nop()) {
		t.Fatal("complete before Start reported the result as recorded")
	}
	if err := c.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(t.Context()); !errors.Is(err, startstop.ErrStarted) {
		t.Fatalf("Start while running = %v, want startstop.ErrStarted", err)
	}
	answers := completeAll(c, cs[:1])
	recv(t, store.finishing, "the first batch")
	more := completeAll(c, cs[1:])
	testwait.Eventually(t, 10*time.Second, "three results queued", func() bool { return c.queued() == 3 })
	stopped := make(chan struct{})
	go func() { c.Stop(); close(stopped) }()
	store.finishGate <- struct{}{} // buffered: the first batch, then the batch Stop flushes
	store.finishGate <- struct{}{}
	recv(t, stopped, "Stop")
	if !recv(t, answers, "the first result") {
		t.Fatal("the result written before Stop was reported as not recorded")
	}
	for range 3 {
		if !recv(t, more, "the results queued before Stop") {
			t.Fatal("a result queued before Stop was not written")
		}
	}
	if store.count("FinishAttempts") != 2 {
		t.Fatalf("%d FinishAttempts, want 2", store.count("FinishAttempts"))
	}
	for _, cp := range cs {
		if status, _ := store.delivery(cp.Attempt.DeliveryID); status != pulsetype.StatusSuccess {
			t.Fatalf("delivery %s is %s after Stop, want success", cp.Attempt.DeliveryID, status)
		}
	}
	if c.complete(cs[0], zerolog.Nop()) {
		t.Fatal("complete after Stop reported the result as recorded")
	}
	c.Stop()
}

// A result whose lease was lost is not followed up and is reported; a retry wakes the loop when it comes
// due.
func TestCompleterLeaseLostAndRetry(t *testing.T) {
	t.Parallel()
	store := newMemStore(endpoint(t, "g", []string{"t"}))
	cs := leased(t, store, 2)
	stolen := *cs[0].Attempt
	stolen.FencingToken = "another worker's"
	cs[0].Attempt = &stolen
	cs[1].Result = pulsetype.AttemptResult{Status: pulsetype.StatusError, Error: &pulsetype.ErrorInfo{Code: pulsetype.CodeHandlerError}}
	cs[1].Next = pulsetype.NextStep{Retry: true, Delay: time.Millisecond}
	obs := &observer{}
	woken := make(chan struct{}, 1)
	c := newCompleter(store, obs, func() { signal(woken) }, nil, zerolog.Nop())
	if err := c.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	answers := completeAll(c, cs)
	for range cs {
		recv(t, answers, "the results")
	}
	select {
	case <-woken:
	case <-time.After(10 * time.Second):
		t.Fatal("the retry did not wake the loop")
	}
	outcomes, lost := obs.counts()
	if lost != 1 || outcomes["retry"] != 1 || len(outcomes) != 1 {
		t.Fatalf("observer saw %v and %d leases lost; want one retry and one lease lost", outcomes, lost)
	}
	if status, n := store.delivery(cs[0].Attempt.DeliveryID); status != pulsetype.StatusPending || n != 1 {
		t.Fatalf("the stolen attempt's delivery is %s with %d attempts, want untouched", status, n)
	}
	if status, n := store.delivery(cs[1].Attempt.DeliveryID); status != pulsetype.StatusPending || n != 2 {
		t.Fatalf("the retried delivery is %s with %d attempts, want pending with 2", status, n)
	}
}
