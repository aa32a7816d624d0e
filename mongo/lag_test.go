package mongo

import (
	"maps"
	"testing"
	"time"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// OldestPending gives each group with a backlog the createdAt of its oldest pending delivery, follows it
// as deliveries end, and leaves out groups with nothing pending: before any work, and after the backlog
// drains. Both of its reads answer the same: the indexed one per group (MongoDB) and the one aggregation
// (a server that scans, Capabilities.ScansFilters).
func testOldestPendingFollowsTheBacklog(t *testing.T, e *env) {
	b := e.setup(t)
	s := b.store(nil, nil)
	caps := s.Capabilities()
	caps.ScansFilters = !caps.ScansFilters
	other := b.store(nil, func(o *Options) { o.Capabilities = &caps })
	b.putEndpoint(s, "billing", "t")
	b.putEndpoint(s, "mailer", "u")
	oldest := func() map[string]time.Time {
		t.Helper()
		got, err := s.OldestPending(b.ctx)
		if err != nil {
			t.Fatalf("OldestPending: %v", err)
		}
		again, err := other.OldestPending(b.ctx)
		if err != nil {
			t.Fatalf("OldestPending (ScansFilters %v): %v", caps.ScansFilters, err)
		}
		if !maps.EqualFunc(got, again, time.Time.Equal) {
			t.Fatalf("OldestPending = %v with ScansFilters %v, %v with %v", got, !caps.ScansFilters, again, caps.ScansFilters)
		}
		return got
	}
	if got := oldest(); len(got) != 0 {
		t.Fatalf("OldestPending with nothing published = %v, want none", got)
	}
	t0 := b.clock.Now()
	first := b.fanOutN(s, 1, "t")
	t1 := b.clock.Advance(time.Minute)
	rest := b.fanOutN(s, 2, "t")
	b.clock.Advance(time.Minute)
	got := oldest()
	if len(got) != 1 || !got["billing"].Equal(t0) {
		t.Fatalf("OldestPending with a backlog = %v, want billing at %s only", got, t0)
	}
	end := func(a *pulsetype.Attempt) {
		t.Helper()
		b.endDelivery(s, pulsetype.EndDeliveryParams{DeliveryID: a.DeliveryID, Status: pulsetype.StatusSuccess, FinalAttempt: 1})
	}
	end(first[0])
	if got := oldest(); !got["billing"].Equal(t1) {
		t.Fatalf("OldestPending after the oldest ended = %v, want billing at %s", got, t1)
	}
	for _, a := range rest {
		end(a)
	}
	if got := oldest(); len(got) != 0 {
		t.Fatalf("OldestPending after the backlog drained = %v, want none", got)
	}
}

// SetBacklogHigh flips the alert's state with a conditional write: only the call that changes it reports a
// change, so one replica publishes each raise and each clear; a group without endpoint changes nothing.
func testSetBacklogHighFlipsOnce(t *testing.T, e *env) {
	b := e.setup(t)
	s := b.store(nil, nil)
	b.putEndpoint(s, "billing", "t")
	for i, step := range []struct{ high, want bool }{{true, true}, {true, false}, {false, true}, {false, false}, {true, true}} {
		changed, err := s.SetBacklogHigh(b.ctx, "billing", step.high)
		if err != nil || changed != step.want {
			t.Fatalf("step %d: SetBacklogHigh(%v) = %v, %v; want %v", i, step.high, changed, err, step.want)
		}
	}
	if changed, err := s.SetBacklogHigh(b.ctx, "nobody", true); err != nil || changed {
		t.Fatalf("SetBacklogHigh of a group without endpoint = %v, %v; want false", changed, err)
	}
}

// PendingByGroup counts each registered group's pending deliveries the same way on both paths: per group
// on an index (MongoDB) and in one aggregation (a server that scans), a registered group with nothing
// pending at 0, ended deliveries not counted.
func testPendingByGroupCountsOnBothPaths(t *testing.T, e *env) {
	b := e.setup(t)
	caps, err := New(b.client, b.options(nil)).DetectCapabilities(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	scans, indexes := caps, caps
	scans.ScansFilters, indexes.ScansFilters = true, false
	scanning := b.store(nil, func(o *Options) { o.Capabilities = &scans })
	indexed := b.store(nil, func(o *Options) { o.Capabilities = &indexes })
	b.putEndpoint(indexed, "billing", "t")
	b.putEndpoint(indexed, "mailer", "u")
	b.putEndpoint(indexed, "idle", "v")
	first := b.fanOutN(indexed, 3, "t")
	b.fanOutN(indexed, 2, "u")
	b.endDelivery(indexed, pulsetype.EndDeliveryParams{DeliveryID: first[0].DeliveryID, Status: pulsetype.StatusSuccess, FinalAttempt: 1})
	want := map[string]int64{"billing": 2, "mailer": 2, "idle": 0}
	for name, s := range map[string]*Store{"indexed": indexed, "scanning": scanning} {
		got, err := s.PendingByGroup(b.ctx)
		if err != nil || !maps.Equal(got, want) {
			t.Errorf("PendingByGroup (%s) = %v, %v; want %v", name, got, err, want)
		}
	}
}
