package testdb

import (
	"context"
	"fmt"
	"os"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// EnvShardPlan ("true"), with PULSE_TEST_MONGODB_URI naming a mongos, makes Database shard the collections of
// each test database under the default prefix "pulse" per the plan of docs/mongodb-production.md
// ("Sharding"), before the test runs: events hashed on _id, deliveries and history ranged on their unique
// indexes (created first under the sidecar's names, as the plan says), subscriptions, queue and outbox
// unsharded. The CI's sharded jobs set it, so that the suite runs on sharded collections.
const EnvShardPlan = "PULSE_TEST_SHARD_PLAN"

// shardPlan shards dbName's collections per the plan; it returns the first command error.
func shardPlan(ctx context.Context, client *mongo.Client, dbName string) error {
	db := client.Database(dbName)
	for coll, index := range map[string]mongo.IndexModel{
		"pulse.deliveries": {Keys: bson.D{{Key: "consumerGroup", Value: 1}, {Key: "eventId", Value: 1}}, Options: optionsUnique("pulse_deliveries_group_event_unique")},
		"pulse.history":    {Keys: bson.D{{Key: "deliveryId", Value: 1}, {Key: "attempt", Value: 1}}, Options: optionsUnique("pulse_history_delivery_attempt_unique")},
	} {
		if _, err := db.Collection(coll).Indexes().CreateOne(ctx, index); err != nil {
			return fmt.Errorf("%s: create the shard key's index on %s: %w", EnvShardPlan, coll, err)
		}
	}
	admin := client.Database("admin")
	commands := []bson.D{
		{{Key: "enableSharding", Value: dbName}},
		{{Key: "shardCollection", Value: dbName + ".pulse.events"}, {Key: "key", Value: bson.D{{Key: "_id", Value: "hashed"}}}},
		{{Key: "shardCollection", Value: dbName + ".pulse.deliveries"}, {Key: "key", Value: bson.D{{Key: "consumerGroup", Value: 1}, {Key: "eventId", Value: 1}}}, {Key: "unique", Value: true}},
		{{Key: "shardCollection", Value: dbName + ".pulse.history"}, {Key: "key", Value: bson.D{{Key: "deliveryId", Value: 1}, {Key: "attempt", Value: 1}}}, {Key: "unique", Value: true}},
	}
	for _, cmd := range commands {
		if err := admin.RunCommand(ctx, cmd).Err(); err != nil {
			return fmt.Errorf("%s: %s: %w", EnvShardPlan, cmd[0].Key, err)
		}
	}
	return nil
}

func shardPlanOn() bool { return os.Getenv(EnvShardPlan) == "true" && !Embedded() }

func optionsUnique(name string) *options.IndexOptionsBuilder {
	return options.Index().SetName(name).SetUnique(true)
}
