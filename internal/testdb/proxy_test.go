package testdb_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/pulse-sidecar/pulse/internal/testdb"
)

// eachSerialization runs f, with the collection named name in a fresh database, in a parallel subtest per
// serialization of the embedded database's proxy, or once with "" on a server given by
// PULSE_TEST_MONGODB_URI (which has its own order).
func eachSerialization(t *testing.T, name string, f func(t *testing.T, s testdb.Serialization, coll *mongo.Collection)) {
	if !testdb.Embedded() {
		f(t, "", collection(t, "", name))
		return
	}
	for _, s := range []testdb.Serialization{testdb.Linearized, testdb.Interleaved} {
		t.Run(string(s), func(t *testing.T) {
			t.Parallel()
			f(t, s, collection(t, s, name))
		})
	}
}

// collection returns the collection name of a testdb.Database whose serialization is s ("": the server's own).
func collection(t *testing.T, s testdb.Serialization, name string) *mongo.Collection {
	t.Helper()
	client, dbName := testdb.Database(t)
	if s != "" {
		testdb.Serialize(t, client, dbName, s)
	}
	return client.Database(dbName).Collection(name)
}

// TestProxyMakesClaimsAtomic races 16 claimers over 300 pending documents with findOneAndUpdate.
// FerretDB alone lets several claimers take the same document; through the proxy each is taken once, in
// either serialization.
func TestProxyMakesClaimsAtomic(t *testing.T) {
	t.Parallel()
	const docs, claimers = 300, 16
	eachSerialization(t, "claims", func(t *testing.T, _ testdb.Serialization, coll *mongo.Collection) {
		ctx := t.Context()
		pending := make([]any, docs)
		for i := range pending {
			pending[i] = bson.D{{Key: "_id", Value: i}, {Key: "status", Value: "pending"}}
		}
		if _, err := coll.InsertMany(ctx, pending); err != nil {
			t.Fatalf("InsertMany: %v", err)
		}

		var (
			mu      sync.Mutex
			claimed = map[int]int{} // _id -> times claimed
			total   int
			wg      sync.WaitGroup
		)
		for g := range claimers {
			wg.Go(func() {
				for {
					var doc struct {
						ID int `bson:"_id"`
					}
					err := coll.FindOneAndUpdate(ctx,
						bson.D{{Key: "status", Value: "pending"}},
						bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: "taken"}, {Key: "by", Value: g}}}},
					).Decode(&doc)
					if errors.Is(err, mongo.ErrNoDocuments) {
						return
					}
					if err != nil {
						t.Errorf("claimer %d: FindOneAndUpdate: %v", g, err)
						return
					}
					mu.Lock()
					claimed[doc.ID]++
					total++
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		if t.Failed() {
			return
		}

		if total != docs {
			t.Errorf("total claims = %d, want exactly %d", total, docs)
		}
		for id := range docs {
			if n := claimed[id]; n != 1 {
				t.Errorf("document %d claimed %d times, want 1", id, n)
			}
		}
		n, err := coll.CountDocuments(ctx, bson.D{{Key: "status", Value: "taken"}, {Key: "by", Value: bson.D{{Key: "$exists", Value: true}}}})
		if err != nil {
			t.Fatalf("CountDocuments: %v", err)
		}
		if n != docs {
			t.Errorf("%d documents are taken, want %d", n, docs)
		}
	})
}

// TestProxyMakesFencedUpdatesAtomic races 8 writers on the same fencing token in each of 20 rounds:
// exactly one of them may move the token forward, in either serialization.
func TestProxyMakesFencedUpdatesAtomic(t *testing.T) {
	t.Parallel()
	const rounds, writers = 20, 8
	eachSerialization(t, "fence", func(t *testing.T, _ testdb.Serialization, coll *mongo.Collection) {
		ctx := t.Context()
		if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: "lease"}, {Key: "tok", Value: 0}}); err != nil {
			t.Fatalf("InsertOne: %v", err)
		}

		for tok := range rounds {
			winners := race(ctx, t, writers, func(ctx context.Context) (bool, error) {
				res, err := coll.UpdateOne(ctx,
					bson.D{{Key: "_id", Value: "lease"}, {Key: "tok", Value: tok}},
					bson.D{{Key: "$set", Value: bson.D{{Key: "tok", Value: tok + 1}}}})
				if err != nil {
					return false, err
				}
				return res.ModifiedCount == 1, nil
			})
			if winners != 1 {
				t.Fatalf("round %d: %d writers modified the document, want exactly 1", tok, winners)
			}
			var doc struct {
				Tok int `bson:"tok"`
			}
			if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: "lease"}}).Decode(&doc); err != nil {
				t.Fatalf("round %d: FindOne: %v", tok, err)
			}
			if doc.Tok != tok+1 {
				t.Fatalf("round %d: tok = %d, want %d", tok, doc.Tok, tok+1)
			}
		}
	})
}

// race runs n copies of attempt released together and returns how many reported a win. Errors fail t.
func race(ctx context.Context, t *testing.T, n int, attempt func(context.Context) (bool, error)) int {
	t.Helper()
	var (
		start = make(chan struct{})
		mu    sync.Mutex
		wins  int
		wg    sync.WaitGroup
	)
	for range n {
		wg.Go(func() {
			<-start
			won, err := attempt(ctx)
			if err != nil {
				t.Errorf("attempt: %v", err)
				return
			}
			if won {
				mu.Lock()
				wins++
				mu.Unlock()
			}
		})
	}
	close(start)
	wg.Wait()
	return wins
}
