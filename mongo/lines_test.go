package mongo

import (
	"fmt"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

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
// would send: its $match and $sort are served by index pulse_queue_line, from the first line and after a
// key.
func TestHeadsPipelineUsesTheLineIndex(t *testing.T) {
	t.Parallel()
	for _, match := range []bson.M{
		{"consumerGroup": "g", "topic": "t"},
		{"consumerGroup": "g", "topic": "t", "orderingKey": bson.M{"$gt": "k"}},
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
