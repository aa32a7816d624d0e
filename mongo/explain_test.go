package mongo

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Every hot query and list is served by an index: explain's winning plan uses an IXSCAN where the server
// reports index plans (Features.IndexPlans: a real MongoDB). FerretDB answers explain without index plans,
// so there only the command is run.
func testHotQueriesUseIndexes(t *testing.T, e *env) {
	b := e.setup(t)
	client, dbName := b.client, b.dbName
	b.store(nil, nil)
	now := time.Now()
	for _, q := range []struct {
		name string
		coll string
		find bson.D
	}{
		{"claim", "pulse.history", bson.D{{Key: "filter", Value: bson.M{"status": "pending", fieldLeasedUntil: nil, "nextAttemptAt": bson.M{"$lte": now}}},
			{Key: "sort", Value: bson.D{{Key: "status", Value: 1}, {Key: fieldLeasedUntil, Value: 1}, {Key: "nextAttemptAt", Value: 1}}}}},
		{"reap", "pulse.history", bson.D{{Key: "filter", Value: bson.M{"status": "pending", fieldLeasedUntil: bson.M{"$lt": now}}}}},
		{"renew", "pulse.history", bson.D{{Key: "filter", Value: bson.M{fieldFencingToken: bson.M{"$in": bson.A{"a", "b"}}}}}},
		{"attempts of deliveries", "pulse.history", bson.D{{Key: "filter", Value: bson.M{"deliveryId": bson.M{"$in": bson.A{"a"}}}}}},
		{"repair scan", "pulse.deliveries", bson.D{{Key: "filter", Value: bson.M{"status": "pending", "_id": bson.M{"$gt": ""}}}, {Key: "sort", Value: bson.D{{Key: "status", Value: 1}, {Key: "_id", Value: 1}}}}},
		{"list", "pulse.deliveries", bson.D{{Key: "filter", Value: bson.M{}}, {Key: "sort", Value: bson.D{{Key: "createdAt", Value: -1}, {Key: "_id", Value: -1}}}}},
		{"list by group", "pulse.deliveries", bson.D{{Key: "filter", Value: bson.M{"consumerGroup": "g"}}, {Key: "sort", Value: bson.D{{Key: "consumerGroup", Value: 1}, {Key: "createdAt", Value: -1}, {Key: "_id", Value: -1}}}}},
		{"head of a keyed line", "pulse.deliveries", bson.D{{Key: "filter", Value: bson.M{"consumerGroup": "g", "topic": "t", "status": "pending", "orderingKey": "k"}}, {Key: "sort", Value: bson.D{{Key: "eventCreatedAt", Value: 1}, {Key: "eventId", Value: 1}}}}},
		{"head of the unkeyed line", "pulse.deliveries", bson.D{{Key: "filter", Value: bson.M{"consumerGroup": "g", "topic": "t", "status": "pending", "orderingKey": nil}}, {Key: "sort", Value: bson.D{{Key: "eventCreatedAt", Value: 1}, {Key: "eventId", Value: 1}}}}},
		{"list by group and status", "pulse.deliveries", bson.D{{Key: "filter", Value: bson.M{"consumerGroup": "g", "status": "error"}}, {Key: "sort", Value: bson.D{{Key: "createdAt", Value: -1}, {Key: "_id", Value: -1}}}}},
		{"stats: oldest pending of a group", "pulse.deliveries", bson.D{{Key: "filter", Value: bson.M{"consumerGroup": "g", "status": "pending"}}, {Key: "sort", Value: bson.D{{Key: "createdAt", Value: 1}, {Key: "_id", Value: 1}}}}},
		{"stats: attempts ended in the window", "pulse.history", bson.D{{Key: "filter", Value: bson.M{"consumerGroup": "g", "status": bson.M{"$in": bson.A{"success", "error"}}, "endedAt": bson.M{"$gt": now}}}, {Key: "sort", Value: bson.D{{Key: "endedAt", Value: -1}}}}},
		{"deliveries of an event", "pulse.deliveries", bson.D{{Key: "filter", Value: bson.M{"eventId": "e"}}, {Key: "sort", Value: bson.D{{Key: "consumerGroup", Value: 1}}}}},
		{"sweep of staged events", "pulse.events", bson.D{{Key: "filter", Value: bson.M{"staged": true, "createdAt": bson.M{"$lt": now}}}}},
		{"fan-out repair", "pulse.events", bson.D{{Key: "filter", Value: bson.M{"fanout": true, "createdAt": bson.M{"$lt": now}}}}},
		{"backfill", "pulse.events", bson.D{{Key: "filter", Value: bson.M{"topic": bson.M{"$in": bson.A{"t"}}, "_id": bson.M{"$gt": ""}}}}},
		{"claim from the queue", "pulse.queue", bson.D{{Key: "filter", Value: bson.M{fieldLeasedUntil: nil, "nextAttemptAt": bson.M{"$lte": now}, "ended": bson.M{"$ne": true}}},
			{Key: "sort", Value: bson.D{{Key: fieldLeasedUntil, Value: 1}, {Key: "nextAttemptAt", Value: 1}}}}},
		{"reap from the queue", "pulse.queue", bson.D{{Key: "filter", Value: bson.M{fieldLeasedUntil: bson.M{"$lt": now}, "ended": bson.M{"$ne": true}}},
			{Key: "sort", Value: bson.D{{Key: fieldLeasedUntil, Value: 1}}}}},
		{"repair scan of the queue", "pulse.queue", bson.D{{Key: "filter", Value: bson.M{"deliveryId": bson.M{"$gt": ""}}},
			{Key: "sort", Value: bson.D{{Key: "deliveryId", Value: 1}, {Key: "attempt", Value: 1}}}}},
		{"head of a line in the queue", "pulse.queue", bson.D{{Key: "filter", Value: bson.M{"consumerGroup": "g", "topic": "t", "orderingKey": "k"}},
			{Key: "sort", Value: bson.D{{Key: "consumerGroup", Value: 1}, {Key: "topic", Value: 1}, {Key: "orderingKey", Value: 1}, {Key: "eventCreatedAt", Value: 1}, {Key: "eventId", Value: 1}, {Key: "attempt", Value: -1}}}}},
		{"stale fan-outs in the outbox", "pulse.outbox", bson.D{{Key: "filter", Value: bson.M{"createdAt": bson.M{"$lt": now}}}, {Key: "sort", Value: bson.D{{Key: "createdAt", Value: 1}}}}},
		{"a line's unfinished fan-outs", "pulse.outbox", bson.D{{Key: "filter", Value: bson.M{"topic": "t", "orderingKey": nil}},
			{Key: "sort", Value: bson.D{{Key: "topic", Value: 1}, {Key: "orderingKey", Value: 1}, {Key: "createdAt", Value: 1}}}}},
	} {
		cmd := append(bson.D{{Key: "find", Value: q.coll}}, q.find...)
		var out bson.Raw
		err := client.Database(dbName).RunCommand(context.Background(), bson.D{{Key: "explain", Value: cmd}, {Key: "verbosity", Value: "queryPlanner"}}).Decode(&out)
		if err != nil {
			t.Fatalf("%s: explain: %v", q.name, err)
		}
		if e.features.IndexPlans && !strings.Contains(out.Lookup("queryPlanner", "winningPlan").String(), "IXSCAN") {
			t.Errorf("%s is not served by an index: %s", q.name, out.Lookup("queryPlanner", "winningPlan"))
		}
	}
}
