package storetest

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// fanOutCases are the cases of fanout.
var fanOutCases = []Case{
	{Name: "FanOutConcurrentCreatesOneDeliveryPerGroup", Run: testFanOutConcurrentCreatesOneDeliveryPerGroup, Race: true},
	{Name: "FanOutStaleRepairsInterruptedFanOut", Run: testFanOutStaleRepairsInterruptedFanOut},
	{Name: "FanOutMarkIsClearedSeparately", Run: testFanOutMarkIsClearedSeparately},
	{Name: "FanOutClaimingInsertsLeasedAttempts", Run: testFanOutClaimingInsertsLeasedAttempts, Race: true},
	{Name: "StagedLeftoversDoNotHideAnInterruptedFanOut", Run: testStagedLeftoversDoNotHideAnInterruptedFanOut},
}

func testFanOutConcurrentCreatesOneDeliveryPerGroup(t *testing.T, e *Env) {
	b := e.setup(t)
	s := b.store(nil, nil)
	b.putEndpoint(s, "billing", "payment.captured")
	b.putEndpoint(s, "audit", "payment.captured", "payment.refunded")
	b.putEndpoint(s, "shipping", "order.shipped") // not subscribed to the event's topic
	out, err := s.Publish(b.ctx, []*pulsetype.Event{Event("evt-1", "payment.captured", `{"paymentId":"p1"}`)})
	if err != nil {
		t.Fatalf("Publish: %v", err)
	}
	ev := out[0].Event

	const n = 6
	stores := make([]Store, n)
	for i := range stores {
		stores[i] = b.store(b.connect(), nil)
	}
	inserted := make([]int, n)
	errs := make([]error, n)
	Concurrently(n, func(i int) {
		var created []*pulsetype.Attempt
		created, errs[i] = stores[i].FanOut(b.ctx, []*pulsetype.Event{ev})
		inserted[i] = len(created)
	})
	total := 0
	for i := range n {
		if errs[i] != nil {
			t.Errorf("FanOut #%d: %v", i, errs[i])
		}
		total += inserted[i]
	}

	wantDeliveries := []string{b.deliveryID("audit", ev.ID), b.deliveryID("billing", ev.ID)}
	slices.Sort(wantDeliveries)
	if got := b.count("deliveries", bson.M{"eventId": ev.ID}); got != 2 {
		t.Errorf("%d deliveries of the event, want 2", got)
	}
	for _, id := range wantDeliveries {
		if got := b.count("deliveries", bson.M{"_id": id, "status": pulsetype.StatusPending}); got != 1 {
			t.Errorf("%d pending deliveries with id %s, want 1", got, id)
		}
	}
	if got := b.count("history", bson.M{"eventId": ev.ID}); got != 2 {
		t.Errorf("%d attempt documents of the event, want 2", got)
	}
	byDelivery, err := s.AttemptsOf(b.ctx, wantDeliveries)
	if err != nil {
		t.Fatalf("AttemptsOf: %v", err)
	}
	for _, id := range wantDeliveries {
		as := byDelivery[id]
		if len(as) != 1 || as[0].Number != 1 || as[0].Status != pulsetype.StatusPending {
			t.Errorf("attempts of delivery %s = %+v, want one pending attempt 1", id, as)
		}
	}
	if err := s.ClearFanOut(b.ctx, []string{ev.ID}); err != nil {
		t.Fatalf("ClearFanOut: %v", err)
	}
	if got := b.count("events", bson.M{"_id": ev.ID, "fanout": bson.M{"$exists": true}}); got != 0 {
		t.Errorf("event still carries its fanout mark after ClearFanOut")
	}
	if total != 2 {
		t.Errorf("FanOut calls reported %d inserted first attempts in total (%v), want 2: only 2 were inserted", total, inserted)
	}
	ds, err := s.DeliveriesOfEvent(b.ctx, ev.ID)
	if err != nil || len(ds) != 2 || ds[0].ConsumerGroup != "audit" || ds[1].ConsumerGroup != "billing" {
		t.Errorf("DeliveriesOfEvent = %v, %v; want audit and billing", ds, err)
	}
}

func testFanOutStaleRepairsInterruptedFanOut(t *testing.T, e *Env) {
	b := e.setup(t)
	s := b.store(nil, nil)
	b.putEndpoint(s, "billing", "t")
	if _, err := s.Publish(b.ctx, []*pulsetype.Event{Event("evt-1", "t", `1`)}); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	if n, err := s.FanOutStale(b.ctx, time.Minute, 10); err != nil || n != 0 {
		t.Fatalf("FanOutStale of a fresh event = %d, %v; want 0, nil", n, err)
	}
	b.clock.Advance(2 * time.Minute)
	if n, err := s.FanOutStale(b.ctx, time.Minute, 10); err != nil || n != 1 {
		t.Fatalf("FanOutStale of an interrupted fan-out = %d, %v; want 1, nil", n, err)
	}
	if got := b.count("deliveries", bson.M{"_id": b.deliveryID("billing", "evt-1")}); got != 1 {
		t.Errorf("%d deliveries after FanOutStale, want 1", got)
	}
	if got := b.count("events", bson.M{"fanout": true}); got != 0 {
		t.Errorf("%d events still marked for fan-out, want 0", got)
	}
}

// FanOut leaves the fanout mark; ClearFanOut clears it, and FanOutStale repeats a fan-out whose mark stayed
// without creating anything twice.
func testFanOutMarkIsClearedSeparately(t *testing.T, e *Env) {
	b := e.setup(t)
	s := b.store(nil, nil)
	b.putEndpoint(s, "billing", "t")
	created := b.fanOutN(s, 3, "t")
	if got := b.count("events", bson.M{"fanout": true}); got != 3 {
		t.Fatalf("%d events marked after FanOut, want 3", got)
	}
	b.clock.Advance(2 * time.Minute)
	if n, err := s.FanOutStale(b.ctx, time.Minute, 10); err != nil || n != 0 {
		t.Errorf("FanOutStale after a complete fan-out = %d, %v; want 0 new attempts", n, err)
	}
	if got := b.count("history", bson.M{}); got != int64(len(created)) {
		t.Errorf("%d attempts after the repeated fan-out, want %d", got, len(created))
	}
	if got := b.count("events", bson.M{"fanout": true}); got != 0 {
		t.Errorf("%d events still marked after FanOutStale, want 0", got)
	}
	b.publishOne(s, "evt-z", "t")
	if err := s.ClearFanOut(b.ctx, []string{"evt-z"}); err != nil {
		t.Fatalf("ClearFanOut: %v", err)
	}
	if got := b.count("events", bson.M{"fanout": true}); got != 0 {
		t.Errorf("%d events still marked after ClearFanOut, want 0", got)
	}
}

// The fan-out of a dispatcher that runs what it fans out inserts the first attempts it claims already
// leased, the lease copied into their queue documents: no claim of the queue takes them, the replicas racing
// on one fan-out insert each attempt once (the losers' queue documents removed again), and a lease whose
// holder never POSTs (it died) is reaped as worker_lost like any other.
func testFanOutClaimingInsertsLeasedAttempts(t *testing.T, e *Env) {
	b := e.setup(t)
	s := b.store(nil, func(o *Options) { o.LeaseTimeout = time.Second; o.Now = nil })
	b.putEndpoint(s, "billing", "t")
	b.putEndpoint(s, "audit", "t")
	out, err := s.Publish(b.ctx, []*pulsetype.Event{Event("evt-1", "t", `1`)})
	if err != nil {
		t.Fatalf("Publish: %v", err)
	}
	ev := out[0].Event

	const n = 4
	created := make([][]*pulsetype.Attempt, n)
	errs := make([]error, n)
	Concurrently(n, func(i int) {
		claimBilling := func(group string) bool { return group == "billing" }
		created[i], errs[i] = b.store(b.connect(), func(o *Options) { o.LeaseTimeout = time.Second; o.Now = nil }).
			FanOutClaiming(b.ctx, fmt.Sprintf("worker-%d", i), []*pulsetype.Event{ev}, claimBilling)
	})
	var leased, unleased []*pulsetype.Attempt
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("FanOutClaiming #%d: %v", i, errs[i])
		}
		for _, a := range created[i] {
			switch {
			case a.ConsumerGroup == "billing" && a.FencingToken != "" && a.LeaseOwner == fmt.Sprintf("worker-%d", i) && a.LeasedUntil != nil:
				leased = append(leased, a)
			case a.ConsumerGroup == "audit" && a.FencingToken == "" && a.LeasedUntil == nil:
				unleased = append(unleased, a)
			default:
				t.Errorf("FanOutClaiming #%d returned %+v: want billing's attempt leased to worker-%d, audit's unleased", i, a, i)
			}
		}
	}
	if len(leased) != 1 || len(unleased) != 1 {
		t.Fatalf("the fan-outs returned %d leased and %d unleased first attempts, want 1 and 1", len(leased), len(unleased))
	}
	a := leased[0]
	if d := b.historyDoc(a.ID); d.Status != pulsetype.StatusPending || d.FencingToken != a.FencingToken || d.LeasedUntil == nil || d.StartedAt == nil {
		t.Errorf("history document of the leased attempt = %+v, want pending under token %s", d, a.FencingToken)
	}
	if got := countWhere(b, "queue", func(q storedQueueEntry) bool {
		return q.ID == a.ID && q.FencingToken == a.FencingToken && q.LeasedUntil != nil
	}); got != 1 {
		t.Errorf("%d queue documents carry the leased attempt's lease, want 1", got)
	}
	if got := b.count("queue", bson.M{}); got != 2 {
		t.Errorf("%d queue documents, want 2 (one per attempt; the losers' removed)", got)
	}
	claimed, err := s.ClaimBatch(b.ctx, "other", nil, 10)
	if err != nil {
		t.Fatalf("ClaimBatch: %v", err)
	}
	if len(claimed) != 1 || claimed[0].ID != unleased[0].ID {
		t.Errorf("ClaimBatch took %+v, want only audit's unleased attempt %s", claimed, unleased[0].ID)
	}

	b.eventually("the reaper reaps the 1s lease of an attempt inserted leased", func() bool {
		r, err := s.ReapOne(b.ctx)
		if err != nil {
			t.Fatalf("ReapOne: %v", err)
		}
		if r != nil && (r.ID != a.ID || r.Error == nil || r.Error.Code != pulsetype.CodeWorkerLost) {
			t.Fatalf("ReapOne reaped %+v, want billing's attempt %s as worker_lost", r, a.ID)
		}
		return r != nil
	})
}

// Outbox documents of publishes that died before their commit (their events staged until the sweeper removes
// them, an hour later) do not hide an interrupted fan-out behind them: the fan-out repair puts them aside and
// reads on. A publish that finds such an event staged with its own content commits it and answers as a
// re-publish (the publish that staged it published it), and the repair sees its outbox document again.
func testStagedLeftoversDoNotHideAnInterruptedFanOut(t *testing.T, e *Env) {
	b := e.setup(t)
	s := b.store(nil, func(o *Options) { o.LeaseTimeout = time.Second })
	b.putEndpoint(s, "g", "t")
	old := b.clock.Now() // after the group registered (offsetReset latest): its events are delivered
	b.clock.Advance(time.Minute)
	const leftovers = 150 // more than a page of the repair (its limit below)
	var evs, marks []any
	for i := range leftovers {
		id := fmt.Sprintf("staged-%03d", i)
		at := old.Add(time.Duration(i) * time.Millisecond)
		evs = append(evs, bson.M{"_id": id, "topic": "t", "data": `1`, "createdAt": at, "staged": true})
		marks = append(marks, bson.M{"_id": id, "topic": "t", "createdAt": at})
	}
	// Committed and marked, but its publisher died before fanning it out: newer than every leftover.
	evs = append(evs, bson.M{"_id": "interrupted", "topic": "t", "data": `2`, "createdAt": old.Add(time.Second), "fanout": true})
	marks = append(marks, bson.M{"_id": "interrupted", "topic": "t", "createdAt": old.Add(time.Second)})
	if _, err := b.coll("events").InsertMany(b.ctx, evs); err != nil {
		t.Fatal(err)
	}
	if _, err := b.coll("outbox").InsertMany(b.ctx, marks); err != nil {
		t.Fatal(err)
	}
	if n, err := s.FanOutStale(b.ctx, time.Second, 100); err != nil || n != 1 {
		t.Fatalf("FanOutStale = %d, %v; want the interrupted event's 1 delivery behind %d staged leftovers", n, err, leftovers)
	}
	if n := b.count("deliveries", bson.M{"eventId": "interrupted"}); n != 1 {
		t.Fatalf("the interrupted event has %d deliveries, want 1", n)
	}
	if n := b.count("outbox", bson.M{}); n != leftovers {
		t.Errorf("%d outbox documents, want the %d leftovers (kept until StagedTimeout, put aside)", n, leftovers)
	}
	// A re-publish of a leftover with the same content commits it, as a re-publish, and recalls its outbox
	// document: a fan-out repair now fans it out.
	out, err := s.Publish(b.ctx, []*pulsetype.Event{Event("staged-007", "t", `1`)})
	if err != nil || !out[0].Existing {
		t.Fatalf("Publish of a staged id = %+v, %v; want it committed and answered as a re-publish", out, err)
	}
	b.clock.Advance(2 * time.Second)
	if n, err := s.FanOutStale(b.ctx, time.Second, 100); err != nil || n != 1 {
		t.Fatalf("FanOutStale after the re-publish = %d, %v; want the committed leftover's 1 delivery", n, err)
	}
}
