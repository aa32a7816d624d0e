package storetest

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	drvevent "go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// lineCases are the cases of lines.
var lineCases = []Case{
	{Name: "ClaimHeadIsPerOrderingKey", Run: testClaimHeadIsPerOrderingKey},
	{Name: "HeadWaitsForAFanOutRepairedDuringItsLook", Run: testHeadWaitsForAFanOutRepairedDuringItsLook},
}

// The head-of-line claim of an ordered group works per (topic, orderingKey): an earlier event of key A whose
// fan-out is unfinished holds up A's line only; B's line and the unkeyed line are claimed.
func testClaimHeadIsPerOrderingKey(t *testing.T, e *Env) {
	b := e.setup(t)
	s := b.store(nil, nil)
	ep := b.endpoint("g", "t")
	ep.Ordered = true
	if _, _, err := s.PutEndpoint(b.ctx, ep); err != nil {
		t.Fatalf("PutEndpoint: %v", err)
	}
	keyed := func(id, key string) *pulsetype.Event {
		e := Event(id, "t", `1`)
		e.OrderingKey = key
		return e
	}
	// a1 is stored but not fanned out (its publisher died): A's line must wait for it.
	if _, err := s.Publish(b.ctx, []*pulsetype.Event{keyed("a1", "A")}); err != nil {
		t.Fatalf("Publish a1: %v", err)
	}
	var later []*pulsetype.Event
	for _, e := range []*pulsetype.Event{keyed("a2", "A"), keyed("b1", "B"), keyed("u1", "")} {
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
	keys, err := s.OrderingKeys(b.ctx, "g", "t")
	if err != nil || !slices.Equal(keys, []string{"", "A", "B"}) {
		t.Fatalf("OrderingKeys = %q, %v; want [\"\" A B]", keys, err)
	}
	for _, tc := range []struct{ key, want string }{{"A", ""}, {"B", "b1"}, {"", "u1"}} {
		a, _, err := s.ClaimHead(b.ctx, "w", pulsetype.Line{ConsumerGroup: "g", Topic: "t", OrderingKey: tc.key})
		if err != nil {
			t.Fatalf("ClaimHead(%q): %v", tc.key, err)
		}
		got := ""
		if a != nil {
			got = a.EventID
		}
		if got != tc.want {
			t.Errorf("ClaimHead(%q) claimed %q, want %q", tc.key, got, tc.want)
		}
	}
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
	a, _, err := s.ClaimHead(b.ctx, "w", pulsetype.Line{ConsumerGroup: "o", Topic: "t"})
	if err != nil || repairErr != nil {
		t.Fatalf("ClaimHead: %v; the repair: %v", err, repairErr)
	}
	if a != nil {
		t.Fatalf("ClaimHead leased %s's attempt while the earlier %s had become pending in the line", a.EventID, first.ID)
	}
	if a, _, err = s.ClaimHead(b.ctx, "w", pulsetype.Line{ConsumerGroup: "o", Topic: "t"}); err != nil || a == nil || a.EventID != first.ID {
		t.Fatalf("the next look at the line = %+v, %v; want e1's attempt", a, err)
	}
}
