package mongo

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// The head-of-line claim of an ordered group works per (topic, orderingKey): an earlier event of key A whose
// fan-out is unfinished holds up A's line only; B's line and the unkeyed line are claimed.
func testClaimHeadIsPerOrderingKey(t *testing.T, e *env) {
	b := e.setup(t)
	s := b.store(nil, nil)
	ep := b.endpoint("g", "t")
	ep.Ordered = true
	if _, _, err := s.PutEndpoint(b.ctx, ep); err != nil {
		t.Fatalf("PutEndpoint: %v", err)
	}
	keyed := func(id, key string) *pulsetype.Event {
		e := event(id, "t", `1`)
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
