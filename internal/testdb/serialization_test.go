package testdb_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/pulse-sidecar/pulse/internal/testdb"
)

// skipUnlessEmbedded skips t by name on a server given by PULSE_TEST_MONGODB_URI: serializations are the
// embedded database's.
func skipUnlessEmbedded(t *testing.T) {
	t.Helper()
	if !testdb.Embedded() {
		t.Skipf("skipped: serializations belong to the embedded database's proxy; %s names a server with its own order", testdb.EnvMongoDBURI)
	}
}

// writeOutcome renders what a write returned, with what varies between databases (names in messages) left
// out: the result, or the index and code of each write error.
func writeOutcome(res any, err error) string {
	var bwe mongo.BulkWriteException
	var we mongo.WriteException
	switch {
	case errors.As(err, &bwe):
		var out []string
		for _, e := range bwe.WriteErrors {
			out = append(out, fmt.Sprintf("%d:%d", e.Index, e.Code))
		}
		return fmt.Sprintf("%+v bulk write errors %v", res, out)
	case errors.As(err, &we):
		var out []string
		for _, e := range we.WriteErrors {
			out = append(out, fmt.Sprintf("%d:%d", e.Index, e.Code))
		}
		return fmt.Sprintf("%+v write errors %v", res, out)
	case err != nil:
		return "error " + err.Error()
	}
	return fmt.Sprintf("%+v", res)
}

// writeScript runs a fixed sequence of writes on coll, each on its own, and returns what each returned
// and, last, the collection's documents in _id order.
func writeScript(ctx context.Context, t *testing.T, coll *mongo.Collection) []string {
	t.Helper()
	var out []string
	add := func(what string, res any, err error) { out = append(out, what+": "+writeOutcome(res, err)) }
	doc := func(id, v int) bson.D { return bson.D{{Key: "_id", Value: id}, {Key: "v", Value: v}} }

	res, err := coll.InsertMany(ctx, []any{doc(1, 1), doc(2, 2), doc(1, 9), doc(3, 3)})
	add("ordered insert with a duplicate", res, err)
	res, err = coll.InsertMany(ctx, []any{doc(3, 3), doc(1, 9), doc(4, 4), doc(2, 9), doc(5, 5)}, options.InsertMany().SetOrdered(false))
	add("unordered insert with duplicates", res, err)
	up, err := coll.UpdateMany(ctx, bson.D{{Key: "v", Value: bson.D{{Key: "$gte", Value: 3}}}}, bson.D{{Key: "$inc", Value: bson.D{{Key: "v", Value: 10}}}})
	add("update many", up, err)
	up, err = coll.UpdateMany(ctx, bson.D{{Key: "v", Value: 100}}, bson.D{{Key: "$set", Value: bson.D{{Key: "x", Value: 1}}}})
	add("update many matching none", up, err)
	up, err = coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: 9}}, bson.D{{Key: "$set", Value: bson.D{{Key: "v", Value: 9}}}}, options.UpdateOne().SetUpsert(true))
	add("upsert", up, err)
	up, err = coll.UpdateMany(ctx, bson.D{{Key: "_id", Value: 10}}, bson.D{{Key: "$set", Value: bson.D{{Key: "v", Value: 10}}}}, options.UpdateMany().SetUpsert(true))
	add("upsert many", up, err)
	for _, ordered := range []bool{false, true} {
		// The upsert comes first among the updates: FerretDB numbers the upserts of a command by their
		// count, MongoDB (and Interleaved) by their statement, and the two agree only there.
		bw, err := coll.BulkWrite(ctx, []mongo.WriteModel{
			mongo.NewUpdateOneModel().SetFilter(bson.D{{Key: "_id", Value: 11 + btoi(ordered)}}).SetUpdate(bson.D{{Key: "$set", Value: bson.D{{Key: "v", Value: 11}}}}).SetUpsert(true),
			mongo.NewUpdateOneModel().SetFilter(bson.D{{Key: "_id", Value: 1}}).SetUpdate(bson.D{{Key: "$inc", Value: bson.D{{Key: "v", Value: 1}}}}),
			mongo.NewUpdateManyModel().SetFilter(bson.D{{Key: "v", Value: bson.D{{Key: "$gt", Value: 10}}}}).SetUpdate(bson.D{{Key: "$inc", Value: bson.D{{Key: "y", Value: 1}}}}),
			mongo.NewInsertOneModel().SetDocument(doc(6+btoi(ordered), 6)),
			mongo.NewInsertOneModel().SetDocument(doc(3, 0)),
			mongo.NewDeleteOneModel().SetFilter(bson.D{{Key: "_id", Value: 2}}),
			mongo.NewDeleteManyModel().SetFilter(bson.D{{Key: "v", Value: bson.D{{Key: "$lt", Value: 0}}}}),
		}, options.BulkWrite().SetOrdered(ordered))
		add(fmt.Sprintf("bulk write (ordered %v)", ordered), bw, err)
	}
	del, err := coll.DeleteMany(ctx, bson.D{{Key: "v", Value: bson.D{{Key: "$gte", Value: 14}}}})
	add("delete many", del, err)
	var found bson.D
	err = coll.FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: 1}}, bson.D{{Key: "$set", Value: bson.D{{Key: "z", Value: 1}}}}).Decode(&found)
	add("find one and update", found, err)

	cur, err := coll.Find(ctx, bson.D{}, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		t.Fatalf("find: %v", err)
	}
	var all []bson.D
	if err := cur.All(ctx, &all); err != nil {
		t.Fatalf("find: %v", err)
	}
	return append(out, fmt.Sprintf("documents: %v", all))
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Interleaved runs inserts, updates and deletes a document at a time and puts their replies back together:
// run alone, every write answers as it does whole (counts, upserted ids, write errors at their indexes,
// ordered writes stopping at the first error), and leaves the same documents.
func TestInterleavedWritesAnswerAsLinearized(t *testing.T) {
	t.Parallel()
	skipUnlessEmbedded(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	outcomes := map[testdb.Serialization][]string{}
	for _, s := range []testdb.Serialization{testdb.Linearized, testdb.Interleaved} {
		outcomes[s] = writeScript(ctx, t, collection(t, s, "c"))
	}
	lin, inter := outcomes[testdb.Linearized], outcomes[testdb.Interleaved]
	if len(lin) != len(inter) {
		t.Fatalf("%d outcomes linearized, %d interleaved", len(lin), len(inter))
	}
	for i := range lin {
		if lin[i] != inter[i] {
			t.Errorf("linearized  %s\ninterleaved %s", lin[i], inter[i])
		}
	}
	if !strings.Contains(lin[0], "errors [2:11000]") {
		t.Errorf("the script's ordered insert = %s, want it stopped at its duplicate: the script tests less than it says", lin[0])
	}
}

// Two replicas' updateMany race for the same 100 documents, round after round. Linearized, one of them
// takes all every time; Interleaved, the two share them in some round, as on MongoDB, which applies a
// multi-document update one document at a time. In both every document is taken exactly once.
func TestInterleavedMultiDocumentUpdatesInterleave(t *testing.T) {
	t.Parallel()
	skipUnlessEmbedded(t)
	const docs, maxRounds = 100, 50
	eachSerialization(t, "c", func(t *testing.T, s testdb.Serialization, coll *mongo.Collection) {
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
		defer cancel()
		pending := make([]any, docs)
		for i := range pending {
			pending[i] = bson.D{{Key: "_id", Value: i}, {Key: "owner", Value: ""}}
		}
		if _, err := coll.InsertMany(ctx, pending); err != nil {
			t.Fatal(err)
		}
		var colls [2]*mongo.Collection
		for i := range colls {
			c, err := mongo.Connect(options.Client().ApplyURI(testdb.URI(t)))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Disconnect(context.Background()) })
			if err := c.Ping(ctx, nil); err != nil {
				t.Fatal(err)
			}
			colls[i] = c.Database(coll.Database().Name()).Collection("c")
		}
		rounds := 5
		if s == testdb.Interleaved {
			rounds = maxRounds
		}
		shared := 0
		for round := range rounds {
			if _, err := colls[0].UpdateMany(ctx, bson.D{}, bson.D{{Key: "$set", Value: bson.D{{Key: "owner", Value: ""}}}}); err != nil {
				t.Fatal(err)
			}
			var taken [2]int64
			var errs [2]error
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i := range colls {
				wg.Go(func() {
					<-start
					res, err := colls[i].UpdateMany(ctx, bson.D{{Key: "owner", Value: ""}}, bson.D{{Key: "$set", Value: bson.D{{Key: "owner", Value: fmt.Sprint(i)}}}})
					if err == nil {
						taken[i] = res.ModifiedCount
					}
					errs[i] = err
				})
			}
			close(start)
			wg.Wait()
			if err := errors.Join(errs[:]...); err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
			for i := range colls {
				n, err := colls[0].CountDocuments(ctx, bson.D{{Key: "owner", Value: fmt.Sprint(i)}})
				if err != nil || n != taken[i] {
					t.Fatalf("round %d: replica %d reported %d documents taken, %d carry its name (%v)", round, i, taken[i], n, err)
				}
			}
			if taken[0]+taken[1] != docs {
				t.Fatalf("round %d: %d + %d documents taken, want %d: one was taken twice or not at all", round, taken[0], taken[1], docs)
			}
			if taken[0] > 0 && taken[1] > 0 {
				shared++
				if s == testdb.Linearized {
					t.Fatalf("round %d: linearized, the replicas shared the documents (%d and %d): an updateMany was not atomic", round, taken[0], taken[1])
				}
				break
			}
		}
		if s == testdb.Interleaved && shared == 0 {
			t.Fatalf("interleaved, one replica took all %d documents in each of %d rounds: the other's update never ran between its documents", docs, rounds)
		}
	})
}
