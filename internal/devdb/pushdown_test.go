package devdb

import (
	"context"
	"fmt"
	"net"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// With pushdown, an update anchored on _id reaches upstream as, per id, an aggregate that matches {_id: id}
// first and then the whole filter, and the update of that one document by {_id: id} alone; a filter that is
// {_id: x} alone, or not anchored on _id, goes upstream as it is.
func TestPushdownServesAnchoredFiltersByID(t *testing.T) {
	t.Parallel()
	up := newCommandUpstream(t, false)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := newProxy(ln, up.ln.Addr().String(), nil, true, nil)
	t.Cleanup(func() { _ = p.Close() })
	c := dialProxy(t, p)
	r := runCommand(t, c, bson.D{{Key: "update", Value: "c"}, {Key: "updates", Value: bson.A{
		bson.D{{Key: "q", Value: bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: bson.A{"a", "b"}}}}, {Key: "s", Value: 1}}},
			{Key: "u", Value: bson.D{{Key: "$set", Value: bson.D{{Key: "s", Value: 2}}}}}, {Key: "multi", Value: true}},
	}}, {Key: "$db", Value: "x"}}, "")
	if n, _ := r.Lookup("n").AsInt64OK(); n != 2 {
		t.Errorf("update answered %s, want n 2", r)
	}
	got := up.took()
	want := []string{`{"aggregate": "c"`, `"updates": [{"q": {"_id": "a"},"u"`, `{"aggregate": "c"`, `"updates": [{"q": {"_id": "b"},"u"`}
	if len(got) != len(want) {
		t.Fatalf("upstream got %d commands, want %d: %q", len(got), len(want), got)
	}
	for i := range want {
		if !strings.Contains(got[i], want[i]) {
			t.Errorf("command %d upstream = %s, want it to contain %s", i, got[i], want[i])
		}
	}
	if !strings.Contains(got[0], `{"$match": {"_id": "a"}},{"$match": {"_id": {"$in": ["a","b"]},"s": {"$numberInt":"1"}}}`) {
		t.Errorf("the check of a = %s, want {_id: a} first, then the whole filter", got[0])
	}
	// A filter of ids alone needs no check: per id, the write by {_id: id}, and n adds up what they matched.
	r = runCommand(t, c, bson.D{{Key: "delete", Value: "c"}, {Key: "deletes", Value: bson.A{
		bson.D{{Key: "q", Value: bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: bson.A{"a", "b"}}}}}}, {Key: "limit", Value: 0}},
	}}, {Key: "$db", Value: "x"}}, "")
	if n, _ := r.Lookup("n").AsInt64OK(); n != 2 {
		t.Errorf("delete answered %s, want n 2", r)
	}
	got = up.took()
	want = []string{`"deletes": [{"q": {"_id": "a"}`, `"deletes": [{"q": {"_id": "b"}`}
	if len(got) != len(want) {
		t.Fatalf("upstream got %d commands for a delete by ids alone, want %d (no aggregate): %q", len(got), len(want), got)
	}
	for i := range want {
		if !strings.Contains(got[i], want[i]) {
			t.Errorf("command %d upstream = %s, want it to contain %s", i, got[i], want[i])
		}
	}
	for _, filter := range []bson.D{{{Key: "_id", Value: "a"}}, {{Key: "s", Value: 1}}} {
		runCommand(t, c, bson.D{{Key: "find", Value: "c"}, {Key: "filter", Value: filter}, {Key: "$db", Value: "x"}}, "")
		if got := up.took(); len(got) != 1 || !strings.HasPrefix(got[0], `{"find"`) {
			t.Errorf("find %v went upstream as %q, want the find itself", filter, got)
		}
	}
}

// The same commands through a proxy with pushdown and one without, on a real FerretDB, answer alike and
// leave the same documents: finds (with projection and limit), multi and single updates, deletes,
// findAndModify that matches and that does not, insert-only upserts, and an unordered bulk write.
func TestPushdownAnswersAsFerretDB(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := Start(ctx, Config{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	plain := NewProxy(ln, srv.proxy.upstream, nil)
	t.Cleanup(func() { _ = plain.Close() })
	outcomes := map[string][]string{}
	for name, uri := range map[string]string{"pushdown": srv.URI(), "plain": "mongodb://" + plain.Addr().String() + "/"} {
		client, err := mongo.Connect(options.Client().ApplyURI(uri))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = client.Disconnect(context.Background()) })
		outcomes[name] = pushdownScript(ctx, t, client.Database("pd_"+name).Collection("c"))
	}
	if !reflect.DeepEqual(outcomes["pushdown"], outcomes["plain"]) {
		for i := range outcomes["plain"] {
			if i < len(outcomes["pushdown"]) && outcomes["pushdown"][i] != outcomes["plain"][i] {
				t.Errorf("step %d: pushdown %s, FerretDB %s", i, outcomes["pushdown"][i], outcomes["plain"][i])
			}
		}
		t.Fatalf("pushdown answered %d steps, FerretDB %d", len(outcomes["pushdown"]), len(outcomes["plain"]))
	}
}

// pushdownScript runs the commands of TestPushdownAnswersAsFerretDB on coll and returns what each answered.
func pushdownScript(ctx context.Context, t *testing.T, coll *mongo.Collection) []string {
	t.Helper()
	var out []string
	note := func(v ...any) { out = append(out, fmt.Sprint(v...)) }
	var docs []any
	for i := range 30 {
		docs = append(docs, bson.D{{Key: "_id", Value: fmt.Sprintf("d%02d", i)}, {Key: "n", Value: i}, {Key: "s", Value: []string{"x", "y"}[i%2]}})
	}
	if _, err := coll.InsertMany(ctx, docs); err != nil {
		t.Fatal(err)
	}
	in := func(ids ...string) bson.D { return bson.D{{Key: "$in", Value: ids}} }
	find := func(filter any, opts ...options.Lister[options.FindOptions]) {
		cur, err := coll.Find(ctx, filter, opts...)
		if err != nil {
			note("find error ", err)
			return
		}
		var got []bson.D
		err = cur.All(ctx, &got)
		note("find ", got, err)
	}
	find(bson.D{{Key: "_id", Value: in("d01", "d02", "d05", "d99", "d01")}, {Key: "s", Value: "y"}})
	find(bson.D{{Key: "_id", Value: in("d03", "d04", "d06")}}, options.Find().SetProjection(bson.D{{Key: "n", Value: 1}}).SetLimit(2))
	find(bson.D{{Key: "_id", Value: "d07"}, {Key: "n", Value: bson.D{{Key: "$gt", Value: 5}}}})
	find(bson.D{{Key: "_id", Value: "d07"}, {Key: "n", Value: bson.D{{Key: "$lt", Value: 5}}}})
	res, err := coll.UpdateMany(ctx, bson.D{{Key: "_id", Value: in("d10", "d11", "d12", "d13", "d98")}, {Key: "s", Value: "x"}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "s", Value: "z"}}}})
	note("updateMany ", res, err)
	res, err = coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: in("d14", "d15", "d16")}, {Key: "s", Value: "y"}},
		bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: 100}}}})
	note("updateOne ", res, err)
	res, err = coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: "d17"}, {Key: "s", Value: "x"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "s", Value: "w"}}}})
	note("updateOne unmatched ", res, err)
	res, err = coll.UpdateMany(ctx, bson.D{{Key: "_id", Value: in("d20", "d21", "d97", "d20")}}, bson.D{{Key: "$set", Value: bson.D{{Key: "u", Value: 1}}}})
	note("updateMany by ids alone ", res, err)
	res, err = coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: in("d96", "d22", "d23")}}, bson.D{{Key: "$set", Value: bson.D{{Key: "u", Value: 2}}}})
	note("updateOne by ids alone ", res, err)
	del0, err := coll.DeleteMany(ctx, bson.D{{Key: "_id", Value: in("d24", "d95", "d25")}})
	note("deleteMany by ids alone ", del0, err)
	var doc bson.D
	err = coll.FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: "d18"}, {Key: "s", Value: "x"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "t", Value: 1}}}},
		options.FindOneAndUpdate().SetReturnDocument(options.After)).Decode(&doc)
	note("findOneAndUpdate ", doc, err)
	err = coll.FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: "d19"}, {Key: "s", Value: "x"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "t", Value: 1}}}}).Err()
	note("findOneAndUpdate unmatched ", err)
	// Insert-only upserts: of a new id, of an id taken by a document the query does not match (a duplicate
	// key, nothing written), and of an id whose document the query matches (an update).
	insertOnly := func(id string, absent string) {
		var doc bson.D
		err := coll.FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: id}, {Key: absent, Value: bson.D{{Key: "$exists", Value: false}}}},
			bson.D{{Key: "$setOnInsert", Value: bson.D{{Key: "n", Value: 1000}}}, {Key: "$set", Value: bson.D{{Key: "v", Value: "up"}}}},
			options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.After)).Decode(&doc)
		note("insert-only upsert ", id, " ", doc, " duplicate ", mongo.IsDuplicateKeyError(err), " ", err == nil)
	}
	insertOnly("d90", "n")
	insertOnly("d90", "n")
	insertOnly("d01", "n")
	insertOnly("d02", "zz")
	del, err := coll.DeleteMany(ctx, bson.D{{Key: "_id", Value: in("d20", "d21", "d22", "d23")}, {Key: "n", Value: bson.D{{Key: "$gte", Value: 21}}}})
	note("deleteMany ", del, err)
	del, err = coll.DeleteOne(ctx, bson.D{{Key: "_id", Value: in("d24", "d25")}, {Key: "s", Value: "y"}})
	note("deleteOne ", del, err)
	bw, err := coll.BulkWrite(ctx, []mongo.WriteModel{
		mongo.NewUpdateOneModel().SetFilter(bson.D{{Key: "_id", Value: "d26"}, {Key: "s", Value: "x"}}).SetUpdate(bson.D{{Key: "$set", Value: bson.D{{Key: "a", Value: 1}}}}),
		mongo.NewUpdateManyModel().SetFilter(bson.D{{Key: "_id", Value: in("d27", "d28", "d29")}, {Key: "s", Value: "y"}}).SetUpdate(bson.D{{Key: "$set", Value: bson.D{{Key: "a", Value: 2}}}}),
		mongo.NewDeleteOneModel().SetFilter(bson.D{{Key: "_id", Value: "d28"}, {Key: "s", Value: "y"}}),
	}, options.BulkWrite().SetOrdered(false))
	note("bulkWrite ", bw, err)
	find(bson.D{}, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
	return out
}
