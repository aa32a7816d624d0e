package mongo

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/pulse-sidecar/pulse/mongo/storetest"
	"github.com/pulse-sidecar/pulse/pulsetype"
)

// claimRoundCommands bounds the commands of one round of ClaimHeads whose lines all pass (see ClaimHeads):
// the lines' first queue documents; the subscription, the deliveries and the fan-outs of the heads and
// their events, read at once; the deliveries of the earlier events the fan-outs name; the lines read again;
// the claim's two writes.
const claimRoundCommands = 9

// One round of ClaimHeads costs the same commands whatever the number of lines it leases: an ordered group
// with 2 lines and one with 20, each line holding two events, and earlier events of every line still in the
// outbox (fanned out, their marks not cleared: the check of earlier events reads their deliveries), lease
// all their heads in one round each, with the same number of commands, at most claimRoundCommands.
func testClaimHeadsCostIsPerRound(t *testing.T, e *env) {
	b := e.setup(t)
	log := &commandLog{}
	s := b.store(b.monitoredClient(log), nil)
	sizes := []int{2, 20}
	for _, lines := range sizes {
		group, topic := fmt.Sprintf("o%d", lines), fmt.Sprintf("t%d", lines)
		ep := b.endpoint(group, topic)
		ep.Ordered = true
		if _, _, err := s.PutEndpoint(b.ctx, ep); err != nil {
			t.Fatalf("PutEndpoint: %v", err)
		}
		var events []*pulsetype.Event
		for i := range 3 * lines {
			ev := storetest.Event(fmt.Sprintf("%s-e%02d", topic, i), topic, `1`)
			ev.OrderingKey = fmt.Sprintf("k%02d", i%lines)
			out, err := s.Publish(b.ctx, []*pulsetype.Event{ev})
			if err != nil {
				t.Fatalf("Publish: %v", err)
			}
			events = append(events, out[0].Event)
		}
		attempts, err := s.FanOut(b.ctx, events)
		if err != nil || len(attempts) != 3*lines {
			t.Fatalf("FanOut = %d attempts, %v; want %d", len(attempts), err, 3*lines)
		}
		// The first event of every line is delivered: the lines' heads are their second events, with an
		// earlier event in the outbox.
		for _, a := range attempts[:lines] {
			if _, err := b.coll("deliveries").UpdateOne(b.ctx, bson.M{"_id": a.DeliveryID}, bson.M{"$set": bson.M{"status": pulsetype.StatusSuccess}}); err != nil {
				t.Fatal(err)
			}
			if _, err := b.coll("queue").DeleteOne(b.ctx, bson.M{"_id": a.ID}); err != nil {
				t.Fatal(err)
			}
		}
	}
	b.clock.Advance(time.Minute) // past the settle window
	commands := map[int]int{}    // lines: commands of the round
	for _, lines := range sizes {
		group, topic := fmt.Sprintf("o%d", lines), fmt.Sprintf("t%d", lines)
		before := len(log.sent())
		got, err := s.ClaimHeads(b.ctx, pulsetype.ClaimHeadsParams{Owner: "w", ConsumerGroup: group, Topic: topic, Limit: 64})
		if err != nil {
			t.Fatalf("ClaimHeads: %v", err)
		}
		commands[lines] = len(log.sent()) - before
		if len(got.Attempts) != lines {
			t.Fatalf("ClaimHeads of %d lines leased %d heads, want one per line", lines, len(got.Attempts))
		}
		for _, a := range got.Attempts {
			if ev, ok := got.Events[a.EventID]; !ok || ev == nil {
				t.Errorf("ClaimHeads leased %s without its event", a.EventID)
			}
		}
		t.Logf("%d lines: one round of %d commands: %v", lines, commands[lines], log.sent()[before:])
	}
	if commands[2] != commands[20] || commands[20] > claimRoundCommands {
		t.Errorf("a round of ClaimHeads sent %d commands for 2 lines and %d for 20; want the same, at most %d", commands[2], commands[20], claimRoundCommands)
	}
}

// The aggregation that reads the heads of lines on MongoDB (headsOfLines with Capabilities.FirstOfGroups),
// which FerretDB cannot run, is checked by the rule of TestHotQueriesUseAnIndex on the command the driver
// would send: its $match and $sort are served by index pulse_queue_line, from the first line, after a
// key and after the line without a key.
func TestHeadsPipelineUsesTheLineIndex(t *testing.T) {
	t.Parallel()
	for _, match := range []bson.M{
		{"consumerGroup": "g", "topic": "t"},
		{"consumerGroup": "g", "topic": "t", "orderingKey": bson.M{"$gt": "k"}},
		{"consumerGroup": "g", "topic": "t", "orderingKey": bson.M{"$gt": ""}},
	} {
		cmd, err := bson.Marshal(bson.D{{Key: "aggregate", Value: "pulse.queue"}, {Key: "pipeline", Value: headsPipeline(match)}})
		if err != nil {
			t.Fatal(err)
		}
		qs := queriesOf("aggregate", cmd)
		if len(qs) != 1 || qs[0].Filter == nil || qs[0].Sort == nil {
			t.Fatalf("the aggregation's query = %+v, want its $match and $sort", qs)
		}
		p := predicatesOf(qs[0].Filter)
		if index := servedIn("queue", p, qs[0].Sort, ""); index != "pulse_queue_line" {
			t.Errorf("%s is served by %q, want pulse_queue_line", qs[0].shape(p), index)
		}
	}
}

// On a server without $first (the scan path, headsOfLinesByScan), a line without an ordering key holding
// lineScanBound queue documents fills the scan's bound: the next claim continues after it (Next ""), so
// the head of line "b" is leased within a few rounds carried as dispatcher.claimLines carries them. Before,
// Next was "" both for "every line read" and for "after the line without a key", and every round read the
// unkeyed line again.
func testClaimHeadsReadsPastABigUnkeyedLine(t *testing.T, e *env) {
	claimsPastABigLine(t, e, "")
}

// The same backlog on the keyed line "a" (sorting before "b"): the control of
// testClaimHeadsReadsPastABigUnkeyedLine.
func testClaimHeadsReadsPastABigKeyedLine(t *testing.T, e *env) {
	claimsPastABigLine(t, e, "a")
}

// claimsPastABigLine checks, on the scan path, that ClaimHeads leases the head of line "b" within 4 rounds
// while line key (sorting before "b") holds lineScanBound queue documents, its head running.
func claimsPastABigLine(t *testing.T, e *env, key string) {
	b := e.setup(t)
	s := b.store(nil, nil)
	if s.caps.FirstOfGroups {
		t.Skip("the server's $group has $first: the aggregation path")
	}
	b.putOrdered(s, "o", "t")
	ev := storetest.Event("kb", "t", `1`)
	ev.OrderingKey = "b"
	out, err := s.Publish(b.ctx, []*pulsetype.Event{ev})
	if err != nil {
		t.Fatalf("Publish: %v", err)
	}
	if a, err := s.FanOut(b.ctx, []*pulsetype.Event{out[0].Event}); err != nil || len(a) != 1 {
		t.Fatalf("FanOut = %d, %v", len(a), err)
	}
	// The big line: its head running (a lease copy), lineScanBound documents behind it.
	old := b.clock.Now().Add(-time.Hour)
	until := b.clock.Now().Add(time.Hour)
	docs := make([]any, lineScanBound)
	for i := range docs {
		q := queueDoc{ID: fmt.Sprintf("u%05d-1", i), DeliveryID: fmt.Sprintf("du%05d", i), EventID: fmt.Sprintf("u%05d", i),
			ConsumerGroup: "o", Topic: "t", OrderingKey: key, EventCreatedAt: old.Add(time.Duration(i) * time.Millisecond), Attempt: 1,
			CreatedAt: old, NextAttemptAt: old}
		if i == 0 {
			q.LeasedUntil, q.FencingToken = &until, "tok"
		}
		docs[i] = q
	}
	if _, err := b.coll("queue").InsertMany(b.ctx, docs); err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(time.Minute)
	var after *string
	for round := range 4 {
		got, err := s.ClaimHeads(b.ctx, pulsetype.ClaimHeadsParams{Owner: "w", ConsumerGroup: "o", Topic: "t", Limit: 8, After: after})
		if err != nil {
			t.Fatalf("ClaimHeads: %v", err)
		}
		t.Logf("round %d after %s: leased %d, next %s", round, cursorText(after), len(got.Attempts), cursorText(got.Next))
		if len(got.Attempts) > 0 {
			return
		}
		after = got.Next // as dispatcher.claimLines carries it
	}
	t.Fatalf("line b's head was never leased in 4 rounds: line %q's backlog hides it", key)
}

// cursorText shows a ClaimHeads continuation in a test's log.
func cursorText(c *string) string {
	if c == nil {
		return "nil"
	}
	return fmt.Sprintf("%q", *c)
}

// ClaimHeads reads the subscription before lineHead reads a line whose first queue document is of an ended
// delivery (pendingHeads). A group deleted and registered again in between (at lineHead's read of the
// queue, by another replica), with an event fanned out to the new registration on that line, leaves that
// new delivery pending: its incarnation is newer than the round's read of the subscription, not older
// (staleAfterLook), so it is not ended as endpoint_deleted.
func testClaimHeadsKeepsANewRegistrationsHead(t *testing.T, e *env) {
	b := e.setup(t)
	other := b.store(nil, nil) // another replica
	var once sync.Once
	var hookErr error
	var e2ID string
	fired := false
	mon := &event.CommandMonitor{Started: func(_ context.Context, ev *event.CommandStartedEvent) {
		if ev.CommandName != "find" || ev.Command.Lookup("find").StringValue() != "queue" && ev.Command.Lookup("find").StringValue() != testPrefix+".queue" {
			return
		}
		if l, ok := ev.Command.Lookup("limit").AsInt64OK(); !ok || l != lineScan {
			return
		}
		once.Do(func() {
			fired = true // lineHead's read: the group is deleted and registered again, and an event fanned out
			if _, err := other.DeleteEndpoint(b.ctx, "o"); err != nil {
				hookErr = err
				return
			}
			ep := b.endpoint("o", "t")
			ep.Ordered = true
			if _, _, err := other.PutEndpoint(b.ctx, ep); err != nil {
				hookErr = err
				return
			}
			ev2 := storetest.Event("e2", "t", `1`)
			ev2.OrderingKey = "k"
			out, err := other.Publish(b.ctx, []*pulsetype.Event{ev2})
			if err != nil {
				hookErr = err
				return
			}
			e2ID = out[0].Event.ID
			if _, err := other.FanOut(b.ctx, []*pulsetype.Event{out[0].Event}); err != nil {
				hookErr = err
			}
		})
	}}
	s := b.store(b.srv.Connect(options.Client().SetMonitor(mon)), nil)
	b.putOrdered(other, "o", "t")
	ev1 := storetest.Event("e1", "t", `1`)
	ev1.OrderingKey = "k"
	out, err := other.Publish(b.ctx, []*pulsetype.Event{ev1})
	if err != nil {
		t.Fatal(err)
	}
	as, err := other.FanOut(b.ctx, []*pulsetype.Event{out[0].Event})
	if err != nil || len(as) != 1 {
		t.Fatalf("FanOut = %d, %v", len(as), err)
	}
	// e1 delivered, its queue document left behind (its writer died before removing it).
	if _, err := b.coll("deliveries").UpdateOne(b.ctx, bson.M{"_id": as[0].DeliveryID}, bson.M{"$set": bson.M{"status": pulsetype.StatusSuccess}}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.coll("history").UpdateOne(b.ctx, bson.M{"_id": as[0].ID}, bson.M{"$set": bson.M{"status": pulsetype.StatusSuccess}}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.coll("queue").UpdateOne(b.ctx, bson.M{"_id": as[0].ID}, bson.M{"$set": bson.M{"ended": true}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ClaimHeads(b.ctx, pulsetype.ClaimHeadsParams{Owner: "w", ConsumerGroup: "o", Topic: "t", Limit: 8}); err != nil {
		t.Fatalf("ClaimHeads: %v", err)
	}
	if !fired {
		t.Fatal("lineHead's read of the line was not seen: the group was not registered again during the round")
	}
	if hookErr != nil {
		t.Fatalf("hook: %v", hookErr)
	}
	all, _ := findAll[deliveryDoc](b.ctx, nil, b.coll("deliveries"), "all", bson.M{})
	for _, x := range all {
		t.Logf("delivery %s event %s status %s incarnation %s", x.ID, x.EventID, x.Status, x.Incarnation)
	}
	var d deliveryDoc
	if err := b.coll("deliveries").FindOne(b.ctx, bson.M{"eventId": e2ID}).Decode(&d); err != nil {
		t.Fatalf("e2's delivery: %v", err)
	}
	var sub subscriptionDoc
	_ = b.coll("subscriptions").FindOne(b.ctx, bson.M{"_id": "o"}).Decode(&sub)
	t.Logf("e2's delivery: status %s, incarnation %s, error %+v; the group's incarnation now %s", d.Status, d.Incarnation, d.Error, sub.Incarnation)
	if d.Status != pulsetype.StatusPending {
		t.Errorf("the new registration's delivery of e2 is %s, want pending: ended as of an earlier registration", d.Status)
	}
}

// The other side of testClaimHeadsKeepsANewRegistrationsHead: a head found by lineHead (behind a queue
// document of an ended delivery) whose delivery is of an earlier registration than the one read again
// after it is ended as endpoint_deleted, so it does not hold up the line. The group registered again is
// a new incarnation written into the subscription (as a register again whose deletion has not reached
// the delivery yet).
func testClaimHeadsEndsAnEarlierRegistrationsHeadBehindAnEndedOne(t *testing.T, e *env) {
	b := e.setup(t)
	s := b.store(nil, nil)
	b.putOrdered(s, "o", "t")
	var evs []*pulsetype.Event
	for _, id := range []string{"e1", "e2"} {
		ev := storetest.Event(id, "t", `1`)
		ev.OrderingKey = "k"
		evs = append(evs, ev)
	}
	out, err := s.Publish(b.ctx, evs)
	if err != nil {
		t.Fatal(err)
	}
	as, err := s.FanOut(b.ctx, []*pulsetype.Event{out[0].Event, out[1].Event})
	if err != nil || len(as) != 2 {
		t.Fatalf("FanOut = %d, %v", len(as), err)
	}
	first := as[0]
	if first.EventID != out[0].Event.ID {
		first = as[1]
	}
	// e1 delivered, its queue document left behind (its writer died before removing it).
	if _, err := b.coll("deliveries").UpdateOne(b.ctx, bson.M{"_id": first.DeliveryID}, bson.M{"$set": bson.M{"status": pulsetype.StatusSuccess}}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.coll("history").UpdateOne(b.ctx, bson.M{"_id": first.ID}, bson.M{"$set": bson.M{"status": pulsetype.StatusSuccess}}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.coll("queue").UpdateOne(b.ctx, bson.M{"_id": first.ID}, bson.M{"$set": bson.M{"ended": true}}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.coll("subscriptions").UpdateOne(b.ctx, bson.M{"_id": "o"}, bson.M{"$set": bson.M{"incarnation": "registered again"}}); err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(time.Minute)
	if _, err := s.ClaimHeads(b.ctx, pulsetype.ClaimHeadsParams{Owner: "w", ConsumerGroup: "o", Topic: "t", Limit: 8}); err != nil {
		t.Fatalf("ClaimHeads: %v", err)
	}
	var d deliveryDoc
	if err := b.coll("deliveries").FindOne(b.ctx, bson.M{"eventId": out[1].Event.ID}).Decode(&d); err != nil {
		t.Fatalf("e2's delivery: %v", err)
	}
	if d.Status != pulsetype.StatusError || d.Error == nil || d.Error.Code != pulsetype.CodeEndpointDeleted {
		t.Errorf("e2's delivery of the earlier registration: status %s, error %+v; want error endpoint_deleted", d.Status, d.Error)
	}
}
