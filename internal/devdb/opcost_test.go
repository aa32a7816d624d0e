package devdb

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// BenchmarkOperationCost measures what one document costs the embedded database (FerretDB on SQLite behind
// the proxy) in each kind of operation the store sends, one client at a time, as ms per document:
//
//	go test -run '^$' -bench OperationCost -benchtime 3x ./internal/devdb/
//
// With PULSE_TEST_POSTGRES_URL set (as for the test suite) it measures FerretDB on that PostgreSQL instead.
//
// An update by {_id} alone is the bench's raw single-document update; the others are the shapes of the
// delivery path (batches of 100 ids). The figures explain deliveries per raw update: a batched insert costs
// a small fraction of a raw update per document, while each document an update or delete touches costs about
// as much as a raw update, batched or not.
func BenchmarkOperationCost(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	srv, err := Start(ctx, Config{DataDir: b.TempDir(), PostgreSQLURL: os.Getenv("PULSE_TEST_POSTGRES_URL")})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = srv.Stop() })
	client, err := mongo.Connect(options.Client().ApplyURI(srv.URI()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = client.Disconnect(context.Background()) })
	if err := client.Database("opcost").Drop(ctx); err != nil { // left by an earlier run on PostgreSQL
		b.Fatal(err)
	}
	coll := client.Database("opcost").Collection("docs")
	const n, batch = 1000, 100
	ids := make([]string, n)
	docs := make([]any, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("d%04d", i)
		docs[i] = bson.D{{Key: "_id", Value: ids[i]}, {Key: "v", Value: 0}, {Key: "status", Value: "pending"}}
	}
	if _, err := coll.InsertMany(ctx, docs); err != nil {
		b.Fatal(err)
	}
	inc := bson.D{{Key: "$inc", Value: bson.D{{Key: "v", Value: 1}}}}
	batches := func(f func(ids []string) error) func() error {
		return func() error {
			for i := 0; i < n; i += batch {
				if err := f(ids[i : i+batch]); err != nil {
					return err
				}
			}
			return nil
		}
	}
	inserted := 0
	ops := []struct {
		name string
		run  func() error
	}{
		{"update by _id (raw)", func() error {
			for _, id := range ids {
				if _, err := coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: id}}, inc); err != nil {
					return err
				}
			}
			return nil
		}},
		{"updateMany of ids", batches(func(ids []string) error {
			_, err := coll.UpdateMany(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}}, inc)
			return err
		})},
		{"updateMany of ids and a condition", batches(func(ids []string) error {
			_, err := coll.UpdateMany(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}, {Key: "status", Value: "pending"}}, inc)
			return err
		})},
		{"bulk of updates by _id and a condition", batches(func(ids []string) error {
			// The fenced results' shape; 16 statements per command, as the store sends them to FerretDB
			// (mongo.Capabilities.MaxUpdateStatements).
			for chunk := range slices.Chunk(ids, 16) {
				models := make([]mongo.WriteModel, len(chunk))
				for i, id := range chunk {
					models[i] = mongo.NewUpdateOneModel().SetFilter(bson.D{{Key: "_id", Value: id}, {Key: "status", Value: "pending"}}).SetUpdate(inc)
				}
				if _, err := coll.BulkWrite(ctx, models, options.BulkWrite().SetOrdered(false)); err != nil {
					return err
				}
			}
			return nil
		})},
		{"find of ids", batches(func(ids []string) error {
			cur, err := coll.Find(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}})
			if err != nil {
				return err
			}
			var got []bson.Raw
			return cur.All(ctx, &got)
		})},
		{"insertMany", batches(func(ids []string) error {
			more := make([]any, len(ids))
			for i := range more {
				inserted++
				more[i] = bson.D{{Key: "_id", Value: fmt.Sprintf("n%07d", inserted)}, {Key: "v", Value: 0}}
			}
			_, err := coll.InsertMany(ctx, more)
			return err
		})},
		{"deleteMany of ids", batches(func(ids []string) error {
			_, err := coll.DeleteMany(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}})
			return err
		})},
	}
	for _, op := range ops {
		b.Run(op.name, func(b *testing.B) {
			var total time.Duration
			for b.Loop() {
				if op.name == "deleteMany of ids" { // put back what the last run deleted, untimed
					if _, err := coll.InsertMany(ctx, docs, options.InsertMany().SetOrdered(false)); err != nil && !mongo.IsDuplicateKeyError(err) {
						b.Fatal(err)
					}
				}
				start := time.Now()
				if err := op.run(); err != nil {
					b.Fatal(err)
				}
				total += time.Since(start)
			}
			b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N*n), "ms/doc")
		})
	}
}
