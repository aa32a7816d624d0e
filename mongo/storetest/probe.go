package storetest

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// indexFeatures are the index options that show each index feature, and the listIndexes field that
// reports them.
var indexFeatures = map[Feature]struct {
	field string
	opts  bson.D
}{
	FeatureTTL:       {"expireAfterSeconds", bson.D{{Key: "expireAfterSeconds", Value: 0}}},
	FeatureSparse:    {"sparse", bson.D{{Key: "sparse", Value: true}}},
	FeaturePartial:   {"partialFilterExpression", bson.D{{Key: "partialFilterExpression", Value: bson.D{{Key: "x", Value: bson.D{{Key: "$exists", Value: true}}}}}}},
	FeatureCollation: {"collation", bson.D{{Key: "collation", Value: bson.D{{Key: "locale", Value: "fr"}}}}},
	FeatureHidden:    {"hidden", bson.D{{Key: "hidden", Value: true}}},
}

// ProbeFeatures asks srv what it can do, independently of the store: an index feature by creating an
// index with its option on a scratch collection and finding the option listed back (see lacks), change
// streams by opening one, index plans by explaining a find that an index serves, users by usersInfo. It
// fails t when the server answers none of these questions; Serializations is left for the caller.
func ProbeFeatures(t *testing.T, srv Server) Features {
	t.Helper()
	ctx, cancel := Context(t)
	defer cancel()
	db := srv.Client.Database(srv.Database)
	var f Features
	for name, dst := range map[Feature]*bool{FeatureTTL: &f.TTLIndexes, FeaturePartial: &f.PartialIndexes,
		FeatureSparse: &f.SparseIndexes, FeatureCollation: &f.CollatedIndexes, FeatureHidden: &f.HiddenIndexes} {
		why := lacks(ctx, t, db, name)
		*dst = why == ""
		if why != "" {
			t.Logf("the server lacks %s: %s", name, why)
		}
	}
	if stream, err := db.Collection("feature_probe_stream").Watch(ctx, mongo.Pipeline{}); err != nil {
		t.Logf("the server lacks %s: %v", FeatureChangeStreams, err)
	} else {
		f.ChangeStreams = true
		_ = stream.Close(ctx)
	}
	plans := db.Collection("feature_probe_plans")
	if _, err := plans.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: bson.D{{Key: "x", Value: 1}}}); err != nil {
		t.Fatalf("create an index on %s: %v", plans.Name(), err)
	}
	var explained bson.Raw
	err := db.RunCommand(ctx, bson.D{{Key: "explain", Value: bson.D{{Key: "find", Value: plans.Name()}, {Key: "filter", Value: bson.D{{Key: "x", Value: 1}}}}},
		{Key: "verbosity", Value: "queryPlanner"}}).Decode(&explained)
	if err != nil {
		t.Fatalf("explain a find on %s: %v", plans.Name(), err)
	}
	f.IndexPlans = strings.Contains(explained.Lookup("queryPlanner", "winningPlan").String(), "IXSCAN")
	if err := db.RunCommand(ctx, bson.D{{Key: "usersInfo", Value: 1}}).Err(); err != nil {
		t.Logf("the server lacks %s: usersInfo answers %v", FeatureUsers, err)
	} else {
		f.Users = true
	}
	return f
}

// lacks reports why the server of db lacks index feature f ("" when it has it): it creates an index with
// f's option on a scratch collection of db and checks that listIndexes reports the option (FerretDB
// answers 238 for most, and accepts sparse but drops it).
func lacks(ctx context.Context, t *testing.T, db *mongo.Database, f Feature) string {
	t.Helper()
	co, ok := indexFeatures[f]
	if !ok {
		t.Fatalf("%q is not an index feature", f)
	}
	coll := "capability_probe_" + co.field
	ix := append(bson.D{{Key: "key", Value: bson.D{{Key: "x", Value: 1}}}, {Key: "name", Value: "probe"}}, co.opts...)
	defer func() { _ = db.Collection(coll).Drop(context.Background()) }()
	err := db.RunCommand(ctx, bson.D{{Key: "createIndexes", Value: coll}, {Key: "indexes", Value: bson.A{ix}}}).Err()
	if err != nil {
		return "createIndexes answers " + err.Error()
	}
	cur, err := db.Collection(coll).Indexes().List(ctx)
	if err != nil {
		t.Fatalf("list indexes of %s: %v", coll, err)
	}
	var listed []bson.M
	if err := cur.All(ctx, &listed); err != nil {
		t.Fatalf("list indexes of %s: %v", coll, err)
	}
	for _, l := range listed {
		if l["name"] == "probe" {
			if _, ok := l[co.field]; ok {
				return ""
			}
			return fmt.Sprintf("createIndexes accepts %s but listIndexes does not report it: %v", co.field, l)
		}
	}
	return "createIndexes succeeded but listIndexes has no such index"
}
