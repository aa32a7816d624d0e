package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	drvevent "go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// lineCases are the cases of lines.
var lineCases = []Case{
	{Name: "ClaimHeadsIsPerOrderingKey", Run: testClaimHeadsIsPerOrderingKey},
	{Name: "HeadWaitsForAFanOutRepairedDuringItsLook", Run: testHeadWaitsForAFanOutRepairedDuringItsLook},
	{Name: "RacingClaimHeadsKeepEveryLineInOrder", Run: testRacingClaimHeadsKeepEveryLineInOrder, Race: true},
	{Name: "ClaimHeadsNamesTheHeadsSettling", Run: testClaimHeadsNamesTheHeadsSettling},
}

// A round that finds a line's head inside its settle window leases nothing of it and names it in Settling,
// by event id, with how long until it settles, which Wait counts; once it settled, a round leases it and
// names nothing settling.
func testClaimHeadsNamesTheHeadsSettling(t *testing.T, e *Env) {
	b := e.setup(t)
	s := b.store(nil, nil)
	b.putOrdered(s, "g", "t")
	ev := Event("s1", "t", `1`)
	ev.OrderingKey = "A"
	published, err := s.Publish(b.ctx, []*pulsetype.Event{ev})
	if err != nil {
		t.Fatalf("Publish: %v", err)
	}
	if _, err := s.FanOut(b.ctx, []*pulsetype.Event{published[0].Event}); err != nil {
		t.Fatalf("FanOut: %v", err)
	}
	// The fake clock started before the database stamped createdAt: the head is inside its settle window.
	claim := func() pulsetype.HeadClaims {
		t.Helper()
		got, err := s.ClaimHeads(b.ctx, pulsetype.ClaimHeadsParams{Owner: "w", ConsumerGroup: "g", Topic: "t", Limit: 10})
		if err != nil {
			t.Fatalf("ClaimHeads: %v", err)
		}
		return got
	}
	got := claim()
	if d, ok := got.Settling["s1"]; len(got.Attempts) != 0 || !ok || d <= 0 || got.Wait != d || len(got.Settling) != 1 {
		t.Fatalf("ClaimHeads inside the settle window = %d leased, Settling %v, Wait %v; want none leased, s1 settling, Wait its settle",
			len(got.Attempts), got.Settling, got.Wait)
	}
	b.clock.Advance(time.Minute) // past the settle window
	got = claim()
	if len(got.Attempts) != 1 || got.Attempts[0].EventID != "s1" || len(got.Settling) != 0 {
		t.Errorf("ClaimHeads past the settle window = %d leased, Settling %v; want s1 leased, nothing settling", len(got.Attempts), got.Settling)
	}
}

// The head-of-line claim of an ordered group works per (topic, orderingKey): an earlier event of key A whose
// fan-out is unfinished holds up A's line only; one round leases the heads of B's line and of the unkeyed
// line, and once a1's fan-out is done, the next round leases A's head, a1, and nothing behind the heads
// leased already.
func testClaimHeadsIsPerOrderingKey(t *testing.T, e *Env) {
	b := e.setup(t)
	s := b.store(nil, nil)
	b.putOrdered(s, "g", "t")
	keyed := func(id, key string) *pulsetype.Event {
		e := Event(id, "t", `1`)
		e.OrderingKey = key
		return e
	}
	// a1 is stored but not fanned out (its publisher died): A's line must wait for it.
	published, err := s.Publish(b.ctx, []*pulsetype.Event{keyed("a1", "A")})
	if err != nil {
		t.Fatalf("Publish a1: %v", err)
	}
	a1 := published[0].Event
	var later []*pulsetype.Event
	for _, e := range []*pulsetype.Event{keyed("a2", "A"), keyed("b1", "B"), keyed("u1", ""), keyed("b2", "B"), keyed("u2", "")} {
		out, err := s.Publish(b.ctx, []*pulsetype.Event{e})
		if err != nil {
			t.Fatalf("Publish %s: %v", e.ID, err)
		}
		later = append(later, out[0].Event)
	}
	if _, err := s.FanOut(b.ctx, later); err != nil {
		t.Fatalf("FanOut: %v", err)
	}
	b.clock.Advance(time.Minute) // past the settle window
	claimHeads := func(want ...string) {
		t.Helper()
		got, err := s.ClaimHeads(b.ctx, pulsetype.ClaimHeadsParams{Owner: "w", ConsumerGroup: "g", Topic: "t", Limit: 10})
		if err != nil {
			t.Fatalf("ClaimHeads: %v", err)
		}
		var events []string
		for _, a := range got.Attempts {
			events = append(events, a.EventID)
		}
		slices.Sort(events)
		if !slices.Equal(events, want) {
			t.Fatalf("ClaimHeads leased the attempts of %q, want %q", events, want)
		}
	}
	claimHeads("b1", "u1")
	if _, err := s.FanOut(b.ctx, []*pulsetype.Event{a1}); err != nil {
		t.Fatalf("FanOut a1: %v", err)
	}
	claimHeads("a1")
	claimHeads() // every line's head is leased
	if _, err := s.Publish(b.ctx, []*pulsetype.Event{keyed("b1", "C")}); !errors.Is(err, pulsetype.ErrIDConflict) {
		t.Errorf("re-publish of b1 with another key = %v, want ErrIDConflict", err)
	}
}

// The head of an ordered line is not claimed when an earlier event's interrupted fan-out is repaired while
// the head is looked at: here the repair (another replica's FanOut and ClearFanOut of the earlier event)
// runs right before the look's read of the outbox, after its read of the line, so that read finds the earlier
// event neither unfinished in the outbox nor in the line it read first.
func testHeadWaitsForAFanOutRepairedDuringItsLook(t *testing.T, e *Env) {
	b := e.setup(t)
	other := b.store(b.connect(), nil)
	ordered := b.endpoint("o", "t")
	ordered.Ordered = true
	if _, _, err := other.PutEndpoint(b.ctx, ordered); err != nil {
		t.Fatalf("PutEndpoint: %v", err)
	}
	// e1's publisher died before its fan-out: only its outbox document says so. e2 is fanned out.
	published, err := other.Publish(b.ctx, []*pulsetype.Event{Event("e1", "t", `1`)})
	if err != nil {
		t.Fatalf("Publish(e1): %v", err)
	}
	first := published[0].Event
	b.publishOne(other, "e2", "t")
	b.clock.Advance(time.Minute) // past the settle window

	var once sync.Once
	var repairErr error
	monitor := &drvevent.CommandMonitor{Started: func(_ context.Context, ev *drvevent.CommandStartedEvent) {
		if coll, _ := ev.Command.Lookup("find").StringValueOK(); coll != Prefix+".outbox" {
			return
		}
		once.Do(func() { // the repair of e1's fan-out, between the look's two reads
			if _, repairErr = other.FanOut(b.ctx, []*pulsetype.Event{first}); repairErr == nil {
				repairErr = other.ClearFanOut(b.ctx, []string{first.ID})
			}
		})
	}}
	s := b.store(b.srv.Connect(options.Client().SetMonitor(monitor)), nil)
	line := pulsetype.ClaimHeadsParams{Owner: "w", ConsumerGroup: "o", Topic: "t", Limit: 1}
	got, err := s.ClaimHeads(b.ctx, line)
	if err != nil || repairErr != nil {
		t.Fatalf("ClaimHeads: %v; the repair: %v", err, repairErr)
	}
	if len(got.Attempts) > 0 {
		t.Fatalf("ClaimHeads leased %s's attempt while the earlier %s had become pending in the line", got.Attempts[0].EventID, first.ID)
	}
	if got.Wait <= 0 {
		t.Errorf("ClaimHeads found the line moved during its look and said to look again after %v, want a wait", got.Wait)
	}
	if got, err = s.ClaimHeads(b.ctx, line); err != nil || len(got.Attempts) != 1 || got.Attempts[0].EventID != first.ID {
		t.Fatalf("the next look at the line = %+v, %v; want e1's attempt", got.Attempts, err)
	}
}

// Replicas racing their claim rounds over an ordered group's lines never lease an event of a line while an
// earlier event of it is pending, nor two attempts of a line at once: three replicas (clients of their own)
// run ClaimHeads over four lines (the unkeyed one and three keys) of four events each, published one at a
// time, each round allowed fewer heads than there are lines; every first attempt of every other event fails
// with a retry due at once, so lines also wait on pending retries. A lease is checked when its claim
// returns, against what the replicas have done: its line has no other lease out, and every earlier event of
// its line has succeeded (its end recorded or under way). Every event is delivered in the end.
func testRacingClaimHeadsKeepEveryLineInOrder(t *testing.T, e *Env) {
	b := e.setup(t)
	s := b.store(nil, nil)
	b.putOrdered(s, "o", "t")
	const lines, perLine, replicas = 4, 4, 3
	type place struct{ line, index int }
	where := map[string]place{}
	var events []*pulsetype.Event
	for i := range perLine {
		for k := range lines {
			ev := Event(fmt.Sprintf("e%d-%d", k, i), "t", `1`)
			if k > 0 {
				ev.OrderingKey = fmt.Sprintf("k%d", k)
			}
			out, err := s.Publish(b.ctx, []*pulsetype.Event{ev})
			if err != nil {
				t.Fatalf("Publish %s: %v", ev.ID, err)
			}
			events = append(events, out[0].Event)
			where[ev.ID] = place{k, i}
		}
	}
	if _, err := s.FanOut(b.ctx, events); err != nil {
		t.Fatalf("FanOut: %v", err)
	}
	b.clock.Advance(time.Minute) // past the settle window

	var (
		mu       sync.Mutex
		done     [lines]int  // events of the line that succeeded (their end recorded or under way); guarded by mu
		leased   [lines]bool // the line has a lease out; guarded by mu
		retries  int         // guarded by mu
		finished bool        // every line delivered, or a replica failed: the replicas stop; guarded by mu
	)
	fail := func(a *pulsetype.Attempt) bool {
		p := where[a.EventID]
		return a.Number == 1 && (p.line+p.index)%2 == 0
	}
	stores := make([]Store, replicas)
	for i := range stores {
		stores[i] = b.store(b.connect(), nil)
	}
	errs := make([]error, replicas)
	deadline := time.Now().Add(WaitBound(t))
	Concurrently(replicas, func(r int) {
		st := stores[r]
		defer func() {
			if errs[r] != nil {
				mu.Lock()
				finished = true
				mu.Unlock()
			}
		}()
		for time.Now().Before(deadline) {
			mu.Lock()
			stop := finished
			mu.Unlock()
			if stop {
				return
			}
			got, err := st.ClaimHeads(b.ctx, pulsetype.ClaimHeadsParams{Owner: fmt.Sprintf("replica-%d", r), ConsumerGroup: "o", Topic: "t", Limit: 2})
			if err != nil {
				errs[r] = fmt.Errorf("ClaimHeads: %w", err)
				return
			}
			mu.Lock()
			for _, a := range got.Attempts {
				p := where[a.EventID]
				switch {
				case leased[p.line]:
					errs[r] = fmt.Errorf("leased %s (attempt %d) while another attempt of its line was leased", a.EventID, a.Number)
				case p.index != done[p.line]:
					errs[r] = fmt.Errorf("leased %s (attempt %d) with %d earlier events of its line done, want %d", a.EventID, a.Number, done[p.line], p.index)
				}
				leased[p.line] = true
			}
			mu.Unlock()
			if errs[r] != nil {
				return
			}
			for _, a := range got.Attempts {
				p := where[a.EventID]
				c := pulsetype.Completion{Attempt: a, Result: pulsetype.AttemptResult{Status: pulsetype.StatusSuccess, HTTPStatus: 200},
					Next: pulsetype.NextStep{EndStatus: pulsetype.StatusSuccess}}
				if fail(a) {
					c = pulsetype.Completion{Attempt: a, Result: pulsetype.AttemptResult{Status: pulsetype.StatusError, HTTPStatus: 500,
						Error: &pulsetype.ErrorInfo{Code: pulsetype.CodeHandlerError, Message: "HTTP 500"}}, Next: pulsetype.NextStep{Retry: true}}
				}
				// The line's lease is given up in this record before the writes that end it, and the event
				// counts as done before its end is written: a claim that the checks above reject is one that
				// returned before this attempt's result was even sent.
				mu.Lock()
				leased[p.line] = false
				if fail(a) {
					retries++
				} else {
					done[p.line]++
				}
				all := true
				for _, n := range done {
					all = all && n == perLine
				}
				finished = all
				mu.Unlock()
				if _, err := st.FinishAttempts(b.ctx, []pulsetype.Completion{c}); err != nil {
					errs[r] = fmt.Errorf("FinishAttempts: %w", err)
					return
				}
				if err := st.FollowUps(b.ctx, []pulsetype.Completion{c}); err != nil {
					errs[r] = fmt.Errorf("FollowUps: %w", err)
					return
				}
			}
		}
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("replica %d: %v", r, err)
		}
	}
	if t.Failed() {
		return
	}
	if done != [lines]int{perLine, perLine, perLine, perLine} {
		t.Fatalf("after %v, the lines delivered %v of %d events each", WaitBound(t), done, perLine)
	}
	if want := lines * perLine / 2; retries != want {
		t.Errorf("%d first attempts failed with a retry, want %d", retries, want)
	}
	if n := b.count("deliveries", bson.M{"consumerGroup": "o", "status": pulsetype.StatusSuccess}); n != lines*perLine {
		t.Errorf("%d deliveries succeeded, want %d", n, lines*perLine)
	}
}

// putOrdered registers an ordered consumer group listing topic.
func (b *bundle) putOrdered(s Store, group, topic string) {
	b.t.Helper()
	ep := b.endpoint(group, topic)
	ep.Ordered = true
	if _, _, err := s.PutEndpoint(b.ctx, ep); err != nil {
		b.t.Fatalf("PutEndpoint %s: %v", group, err)
	}
}
