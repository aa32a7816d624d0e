package storetest

import (
	"fmt"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// operateCases are the cases of operate.
var operateCases = []Case{
	{Name: "ReplayVisitsEachDeliveryOnce", Run: testReplayVisitsEachDeliveryOnce},
}

// Replay walks the window once: more than one batch of successful deliveries is reopened exactly once each,
// even though reopened deliveries could match the filter again.
func testReplayVisitsEachDeliveryOnce(t *testing.T, e *Env) {
	b := e.setup(t)
	s := b.store(nil, nil)
	ctx := b.ctx
	if _, _, err := s.PutEndpoint(ctx, b.endpoint("g", "t")); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	docs := make([]any, 130)
	for i := range docs {
		docs[i] = bson.M{"_id": fmt.Sprintf("d%03d", i), "eventId": fmt.Sprintf("e%03d", i), "consumerGroup": "g", "topic": "t",
			"status": "success", "createdAt": now, "updatedAt": now, "eventCreatedAt": now}
	}
	if _, err := b.coll("deliveries").InsertMany(ctx, docs); err != nil {
		t.Fatal(err)
	}
	n, err := s.ReplayDeliveries(ctx, pulsetype.ReplayParams{ConsumerGroup: "g", Status: pulsetype.StatusSuccess, From: now.Add(-time.Hour), To: now.Add(time.Hour)})
	if err != nil || n != 130 {
		t.Fatalf("replayed %d (%v), want 130", n, err)
	}
	if c, _ := b.coll("history").CountDocuments(ctx, bson.M{}); c != 130 {
		t.Fatalf("%d attempts created, want one per delivery", c)
	}
}
