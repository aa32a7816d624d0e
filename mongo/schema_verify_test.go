package mongo

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/pulse-sidecar/pulse/internal/testdb"
	"github.com/pulse-sidecar/pulse/mongo/storetest"
)

// specNamed returns the indexSpec called name and fails t when there is none.
func specNamed(t *testing.T, name string) indexSpec {
	t.Helper()
	for _, s := range indexSpecs {
		if s.name == name {
			return s
		}
	}
	t.Fatalf("no index spec %q", name)
	return indexSpec{}
}

// verifyIndex against listIndexes documents as MongoDB reports them: every variant is refused, and the error
// names both configurations exactly. It needs no server, so it runs on every backend.
func TestVerifyIndexNamesExpectedAndFound(t *testing.T) {
	t.Parallel()
	const ttlName, plainName = "pulse_events_expires_at_ttl", "pulse_history_lock_token"
	expires := bson.D{{Key: "expiresAt", Value: int32(1)}}
	lockToken := bson.D{{Key: fieldFencingToken, Value: int32(1)}}
	tests := []struct {
		name      string
		index     string
		serverTTL bool
		listed    bson.D // the listIndexes document, without name
		expected  string // "" when the index is accepted
		found     string
	}{
		{name: "TTL index with expireAfterSeconds 0 on a TTL server", index: ttlName, serverTTL: true,
			listed: bson.D{{Key: "v", Value: 2}, {Key: "key", Value: expires}, {Key: "expireAfterSeconds", Value: int32(0)}}},
		{name: "plain index on a server without TTL", index: ttlName,
			listed: bson.D{{Key: "v", Value: 2}, {Key: "key", Value: expires}}},
		{name: "plain index where a TTL index is expected", index: ttlName, serverTTL: true,
			listed:   bson.D{{Key: "v", Value: 2}, {Key: "key", Value: expires}},
			expected: "{key: {expiresAt: 1}, expireAfterSeconds: 0}", found: "{key: {expiresAt: 1}}"},
		{name: "TTL index with another expireAfterSeconds", index: ttlName, serverTTL: true,
			listed:   bson.D{{Key: "v", Value: 2}, {Key: "key", Value: expires}, {Key: "expireAfterSeconds", Value: int32(3600)}},
			expected: "{key: {expiresAt: 1}, expireAfterSeconds: 0}", found: "{key: {expiresAt: 1}, expireAfterSeconds: 3600}"},
		{name: "expireAfterSeconds as a double", index: ttlName, serverTTL: true,
			listed:   bson.D{{Key: "v", Value: 2}, {Key: "key", Value: expires}, {Key: "expireAfterSeconds", Value: 60.0}},
			expected: "{key: {expiresAt: 1}, expireAfterSeconds: 0}", found: "{key: {expiresAt: 1}, expireAfterSeconds: 60}"},
		{name: "TTL index where a plain index is expected", index: plainName, serverTTL: true,
			listed:   bson.D{{Key: "v", Value: 2}, {Key: "key", Value: lockToken}, {Key: "expireAfterSeconds", Value: int32(0)}},
			expected: "{key: {lockToken: 1}}", found: "{key: {lockToken: 1}, expireAfterSeconds: 0}"},
		{name: "sparse", index: plainName, serverTTL: true,
			listed:   bson.D{{Key: "v", Value: 2}, {Key: "key", Value: lockToken}, {Key: "sparse", Value: true}},
			expected: "{key: {lockToken: 1}}", found: "{key: {lockToken: 1}, sparse: true}"},
		{name: "hidden", index: plainName,
			listed:   bson.D{{Key: "v", Value: 2}, {Key: "key", Value: lockToken}, {Key: "hidden", Value: true}},
			expected: "{key: {lockToken: 1}}", found: "{key: {lockToken: 1}, hidden: true}"},
		{name: "partial", index: plainName, serverTTL: true,
			listed: bson.D{{Key: "v", Value: 2}, {Key: "key", Value: lockToken},
				{Key: "partialFilterExpression", Value: bson.D{{Key: fieldFencingToken, Value: bson.D{{Key: "$exists", Value: true}}}}}},
			expected: "{key: {lockToken: 1}}", found: `{key: {lockToken: 1}, partialFilterExpression: {"` + fieldFencingToken + `": {"$exists": true}}}`},
		{name: "collated", index: plainName, serverTTL: true,
			listed: bson.D{{Key: "v", Value: 2}, {Key: "key", Value: lockToken},
				{Key: "collation", Value: bson.D{{Key: "locale", Value: "fr"}, {Key: "strength", Value: int32(3)}}}},
			expected: "{key: {lockToken: 1}}", found: `{key: {lockToken: 1}, collation: {"locale": "fr","strength": {"$numberInt":"3"}}}`},
		{name: "sparse TTL index", index: ttlName, serverTTL: true,
			listed:   bson.D{{Key: "v", Value: 2}, {Key: "key", Value: expires}, {Key: "expireAfterSeconds", Value: int32(0)}, {Key: "sparse", Value: true}},
			expected: "{key: {expiresAt: 1}, expireAfterSeconds: 0}", found: "{key: {expiresAt: 1}, expireAfterSeconds: 0, sparse: true}"},
		{name: "unique and text keys", index: "pulse_deliveries_group_event_unique",
			listed:   bson.D{{Key: "v", Value: 2}, {Key: "key", Value: bson.D{{Key: "consumerGroup", Value: "text"}, {Key: "eventId", Value: 1.0}}}},
			expected: "{key: {consumerGroup: 1, eventId: 1}, unique: true}", found: `{key: {consumerGroup: "text", eventId: 1}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := specNamed(t, tt.index)
			raw, err := bson.Marshal(append(bson.D{{Key: "name", Value: tt.index}}, tt.listed...))
			if err != nil {
				t.Fatal(err)
			}
			var ex existingIndex
			if err := bson.Unmarshal(raw, &ex); err != nil {
				t.Fatalf("decode listed index: %v", err)
			}
			err = verifyIndex("pulse."+spec.coll, spec, ex, tt.serverTTL)
			if tt.expected == "" {
				if err != nil {
					t.Fatalf("verifyIndex = %v, want the index accepted", err)
				}
				return
			}
			var mismatch *IndexMismatchError
			if !errors.As(err, &mismatch) {
				t.Fatalf("verifyIndex = %v, want an *IndexMismatchError", err)
			}
			if mismatch.Expected != tt.expected || mismatch.Found != tt.found {
				t.Errorf("Expected %s, Found %s; want Expected %s, Found %s", mismatch.Expected, mismatch.Found, tt.expected, tt.found)
			}
			if mismatch.Index != tt.index || mismatch.Collection != "pulse."+spec.coll {
				t.Errorf("names %q on %q", mismatch.Index, mismatch.Collection)
			}
		})
	}
}

// EnsureSchema refuses every variant of our indexes an operator may have created, naming expected and
// found, and keeps it. Each row declares the feature the server needs to hold its variant at all and
// skips by name where the server lacks it (on FerretDB: all of them; TestVerifyIndexNamesExpectedAndFound
// covers the comparison there).
func testEnsureSchemaRefusesIndexVariants(t *testing.T, e *env) {
	tests := []struct {
		name     string
		needs    storetest.Feature
		suffix   string
		index    string
		keys     bson.D
		opts     bson.D // createIndexes options besides key and name
		expected string
		found    []string // substrings of Found
	}{
		{name: "TTL index with another expireAfterSeconds", needs: storetest.FeatureTTL, suffix: "history", index: "pulse_history_expires_at_ttl",
			keys: bson.D{{Key: "expiresAt", Value: 1}}, opts: bson.D{{Key: "expireAfterSeconds", Value: 3600}},
			expected: "{key: {expiresAt: 1}, expireAfterSeconds: 0}", found: []string{"expireAfterSeconds: 3600"}},
		{name: "plain index where a TTL index is expected", needs: storetest.FeatureTTL, suffix: "events", index: "pulse_events_expires_at_ttl",
			keys:     bson.D{{Key: "expiresAt", Value: 1}},
			expected: "{key: {expiresAt: 1}, expireAfterSeconds: 0}", found: []string{"{key: {expiresAt: 1}}"}},
		{name: "TTL index where a plain index is expected", needs: storetest.FeatureTTL, suffix: "history", index: "pulse_history_lock_token",
			keys: bson.D{{Key: fieldFencingToken, Value: 1}}, opts: bson.D{{Key: "expireAfterSeconds", Value: 0}},
			expected: "{key: {lockToken: 1}}", found: []string{"expireAfterSeconds: 0"}},
		{name: "sparse", needs: storetest.FeatureSparse, suffix: "history", index: "pulse_history_lock_token",
			keys: bson.D{{Key: fieldFencingToken, Value: 1}}, opts: bson.D{{Key: "sparse", Value: true}},
			expected: "{key: {lockToken: 1}}", found: []string{"sparse: true"}},
		{name: "sparse unique", needs: storetest.FeatureSparse, suffix: "deliveries", index: "pulse_deliveries_group_event_unique",
			keys: bson.D{{Key: "consumerGroup", Value: 1}, {Key: "eventId", Value: 1}}, opts: bson.D{{Key: "unique", Value: true}, {Key: "sparse", Value: true}},
			expected: "{key: {consumerGroup: 1, eventId: 1}, unique: true}", found: []string{"unique: true", "sparse: true"}},
		{name: "partial", needs: storetest.FeaturePartial, suffix: "deliveries", index: "pulse_deliveries_status_id",
			keys:     bson.D{{Key: "status", Value: 1}, {Key: "_id", Value: 1}},
			opts:     bson.D{{Key: "partialFilterExpression", Value: bson.D{{Key: "status", Value: "pending"}}}},
			expected: "{key: {status: 1, _id: 1}}", found: []string{`partialFilterExpression: {"status": "pending"}`}},
		{name: "collated", needs: storetest.FeatureCollation, suffix: "subscriptions", index: "pulse_subscriptions_topics",
			keys: bson.D{{Key: "topics", Value: 1}}, opts: bson.D{{Key: "collation", Value: bson.D{{Key: "locale", Value: "fr"}}}},
			expected: "{key: {topics: 1}}", found: []string{`collation: {"locale": "fr"`}},
		{name: "hidden", needs: storetest.FeatureHidden, suffix: "events", index: "pulse_events_fanout",
			keys: bson.D{{Key: "fanout", Value: 1}, {Key: "createdAt", Value: 1}}, opts: bson.D{{Key: "hidden", Value: true}},
			expected: "{key: {fanout: 1, createdAt: 1}}", found: []string{"hidden: true"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := e.setup(t)
			e.require(t, tt.needs)
			ix := append(bson.D{{Key: "key", Value: tt.keys}, {Key: "name", Value: tt.index}}, tt.opts...)
			if err := b.client.Database(b.dbName).RunCommand(b.ctx, bson.D{{Key: "createIndexes", Value: testPrefix + "." + tt.suffix},
				{Key: "indexes", Value: bson.A{ix}}}).Err(); err != nil {
				t.Fatalf("create the operator's index: %v", err)
			}
			before := b.indexesOf(tt.suffix)[tt.index]
			for run := 1; run <= 2; run++ { // a restart refuses again rather than "fixing" the index
				_, err := New(b.client, b.options(nil)).EnsureSchema(b.ctx)
				var mismatch *IndexMismatchError
				if !errors.As(err, &mismatch) {
					t.Fatalf("EnsureSchema run %d = %v, want an *IndexMismatchError", run, err)
				}
				if mismatch.Index != tt.index || mismatch.Collection != testPrefix+"."+tt.suffix {
					t.Errorf("error names %q on %q, want %q on %q", mismatch.Index, mismatch.Collection, tt.index, testPrefix+"."+tt.suffix)
				}
				if mismatch.Expected != tt.expected {
					t.Errorf("Expected = %s, want %s", mismatch.Expected, tt.expected)
				}
				for _, f := range tt.found {
					if !strings.Contains(mismatch.Found, f) {
						t.Errorf("Found = %s, want it to contain %s", mismatch.Found, f)
					}
				}
				if msg := err.Error(); !strings.Contains(msg, mismatch.Expected) || !strings.Contains(msg, mismatch.Found) || strings.Contains(msg, "\n") {
					t.Errorf("error %q should name expected and found on one line", msg)
				}
			}
			if after, ok := b.indexesOf(tt.suffix)[tt.index]; !ok || after != before {
				t.Errorf("the operator's index changed from %+v to %+v (present %v)", before, after, ok)
			}
		})
	}
}

// collectionNames lists the test database's collections.
func (b *bundle) collectionNames() []string {
	b.t.Helper()
	names, err := b.client.Database(b.dbName).ListCollectionNames(b.ctx, bson.M{})
	if err != nil {
		b.t.Fatalf("list collections: %v", err)
	}
	return names
}

// The sweeper fallback follows from what the server is, never from an index an operator created: plain
// indexes under our TTL names are refused where the server holds TTL indexes and accepted where it does not,
// and TTL is reported as the server's. The probe's scratch collection is gone afterwards. Runs on every
// backend (on FerretDB it takes the "server without TTL" branch).
func testTTLFallbackComesFromTheServer(t *testing.T, e *env) {
	b := e.setup(t)
	serverTTL := e.features.TTLIndexes
	for _, spec := range indexSpecs {
		if spec.ttl {
			b.createIndex(spec.coll, spec.name, spec.keys, false)
		}
	}
	caps, err := New(b.client, b.options(nil)).EnsureSchema(b.ctx)
	var mismatch *IndexMismatchError
	switch {
	case serverTTL && !errors.As(err, &mismatch):
		t.Fatalf("EnsureSchema with plain indexes under the TTL names on a server with TTL = %v (TTL %v), want an *IndexMismatchError", err, caps.TTLIndexes)
	case !serverTTL && err != nil:
		t.Fatalf("EnsureSchema on a server without TTL = %v, want the plain indexes accepted", err)
	case !serverTTL && caps.TTLIndexes:
		t.Fatalf("Capabilities.TTLIndexes = true on a server without TTL indexes")
	}
	t.Logf("server has TTL indexes: %v; EnsureSchema: %v", serverTTL, err)

	// On fresh collections, TTL comes from the server alone.
	caps, err = New(b.client, b.options(func(o *Options) { o.CollectionPrefix = "fresh" })).EnsureSchema(b.ctx)
	if err != nil || caps.TTLIndexes != serverTTL {
		t.Fatalf("EnsureSchema on fresh collections = TTL %v, %v; want TTL %v (what the server is)", caps.TTLIndexes, err, serverTTL)
	}
	for _, name := range b.collectionNames() {
		if strings.Contains(name, "schema_probe") {
			t.Errorf("the TTL probe left its scratch collection %s behind", name)
		}
	}
}

// A user without the rights to create indexes is refused at start with a *PermissionError naming what it may
// not do, even when the schema exists already (the TTL probe creates an index at every start). It needs a
// MongoDB with authentication whose PULSE_TEST_MONGODB_URI user may create roles and users: the test creates
// a role with find/insert/update/remove/createCollection/dropCollection but not createIndex on the test
// database, and a user with it, both dropped at the end. Anywhere else it skips by name.
func testEnsureSchemaRefusesUserWithoutIndexRights(t *testing.T, e *env) {
	b := e.setup(t)
	e.require(t, storetest.FeatureUsers)
	var status struct {
		AuthInfo struct {
			AuthenticatedUsers []bson.M `bson:"authenticatedUsers"`
		} `bson:"authInfo"`
	}
	if err := b.client.Database("admin").RunCommand(b.ctx, bson.D{{Key: "connectionStatus", Value: 1}}).Decode(&status); err != nil {
		t.Fatalf("connectionStatus: %v", err)
	}
	if len(status.AuthInfo.AuthenticatedUsers) == 0 {
		t.Skipf("skipped: %s connects without authentication, so the server presumably enforces none; this case needs a MongoDB with auth", testdb.EnvMongoDBURI)
	}
	var suffix [4]byte
	_, _ = rand.Read(suffix[:])
	role, user, pwd := "pulse_no_index_"+hex.EncodeToString(suffix[:]), "pulse_no_index_"+hex.EncodeToString(suffix[:]), hex.EncodeToString(suffix[:])+"-pw"
	db := b.client.Database(b.dbName)
	err := db.RunCommand(b.ctx, bson.D{{Key: "createRole", Value: role},
		{Key: "privileges", Value: bson.A{bson.D{{Key: "resource", Value: bson.D{{Key: "db", Value: b.dbName}, {Key: "collection", Value: ""}}},
			{Key: "actions", Value: bson.A{"find", "insert", "update", "remove", "listIndexes", "listCollections", "createCollection", "dropCollection"}}}}},
		{Key: "roles", Value: bson.A{}}}).Err()
	if err != nil {
		t.Skipf("skipped: the %s user may not create roles (%v); this case needs one that may", testdb.EnvMongoDBURI, err)
	}
	t.Cleanup(func() { _ = db.RunCommand(context.Background(), bson.D{{Key: "dropRole", Value: role}}).Err() })
	if err := db.RunCommand(b.ctx, bson.D{{Key: "createUser", Value: user}, {Key: "pwd", Value: pwd},
		{Key: "roles", Value: bson.A{bson.D{{Key: "role", Value: role}, {Key: "db", Value: b.dbName}}}}}).Err(); err != nil {
		t.Skipf("skipped: the %s user may not create users (%v); this case needs one that may", testdb.EnvMongoDBURI, err)
	}
	t.Cleanup(func() { _ = db.RunCommand(context.Background(), bson.D{{Key: "dropUser", Value: user}}).Err() })
	limited := b.srv.Connect(options.Client().SetAuth(options.Credential{Username: user, Password: pwd, AuthSource: b.dbName}))

	for _, schema := range []string{"missing", "created by an administrator"} {
		if schema != "missing" {
			if _, err := New(b.client, b.options(nil)).EnsureSchema(b.ctx); err != nil {
				t.Fatalf("EnsureSchema as the administrator: %v", err)
			}
		}
		_, err := New(limited, b.options(nil)).EnsureSchema(b.ctx)
		var perm *PermissionError
		if !errors.As(err, &perm) {
			t.Fatalf("schema %s: EnsureSchema as a user without createIndex = %v, want a *PermissionError", schema, err)
		}
		if perm.Database != b.dbName || !strings.Contains(perm.Action, "index") || !strings.Contains(err.Error(), "createIndex") {
			t.Errorf("schema %s: %v should name the database and the index it may not create", schema, err)
		}
	}
}
