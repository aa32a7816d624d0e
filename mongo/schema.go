package mongo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// indexSpec is one named index the sidecar needs.
type indexSpec struct {
	coll   string // collection suffix: events, subscriptions, deliveries, history
	name   string
	keys   bson.D
	unique bool
	ttl    bool // TTL index with expireAfterSeconds 0 (a plain index where the server lacks TTL)
}

// indexSpecs are the sidecar's indexes. Every hot query is served by one of them.
var indexSpecs = []indexSpec{
	{coll: "events", name: "pulse_events_topic_id", keys: bson.D{{Key: "topic", Value: 1}, {Key: "_id", Value: 1}}},
	{coll: "events", name: "pulse_events_fanout", keys: bson.D{{Key: "fanout", Value: 1}, {Key: "createdAt", Value: 1}}},
	{coll: "events", name: "pulse_events_expires_at_ttl", keys: bson.D{{Key: "expiresAt", Value: 1}}, ttl: true},
	{coll: "subscriptions", name: "pulse_subscriptions_topics", keys: bson.D{{Key: "topics", Value: 1}}},
	{coll: "deliveries", name: "pulse_deliveries_group_event_unique", keys: bson.D{{Key: "consumerGroup", Value: 1}, {Key: "eventId", Value: 1}}, unique: true},
	{coll: "deliveries", name: "pulse_deliveries_status_id", keys: bson.D{{Key: "status", Value: 1}, {Key: "_id", Value: 1}}},
	// Serves the head of line of an ordered consumer group: its oldest pending delivery of a topic.
	{coll: "deliveries", name: "pulse_deliveries_acquisition", keys: bson.D{{Key: "consumerGroup", Value: 1}, {Key: "topic", Value: 1}, {Key: "status", Value: 1}, {Key: "eventCreatedAt", Value: 1}, {Key: "eventId", Value: 1}}},
	// Serve GET /v1/deliveries newest first, with and without a consumer group.
	{coll: "deliveries", name: "pulse_deliveries_created", keys: bson.D{{Key: "createdAt", Value: -1}, {Key: "_id", Value: -1}}},
	{coll: "deliveries", name: "pulse_deliveries_group_created", keys: bson.D{{Key: "consumerGroup", Value: 1}, {Key: "createdAt", Value: -1}, {Key: "_id", Value: -1}}},
	{coll: "deliveries", name: "pulse_deliveries_expires_at_ttl", keys: bson.D{{Key: "expiresAt", Value: 1}}, ttl: true},
	{coll: "history", name: "pulse_history_delivery_attempt_unique", keys: bson.D{{Key: "deliveryId", Value: 1}, {Key: "attempt", Value: 1}}, unique: true},
	// Serves both the claim ({status: pending, lockedUntil: null, nextAttemptAt ≤ now}) and the reaper
	// ({status: pending, lockedUntil < now}).
	{coll: "history", name: "pulse_history_acquisition", keys: bson.D{{Key: "status", Value: 1}, {Key: "lockedUntil", Value: 1}, {Key: "nextAttemptAt", Value: 1}}},
	{coll: "history", name: "pulse_history_lock_token", keys: bson.D{{Key: "lockToken", Value: 1}}},
	{coll: "history", name: "pulse_history_expires_at_ttl", keys: bson.D{{Key: "expiresAt", Value: 1}}, ttl: true},
}

// IndexMismatchError is returned by EnsureSchema when a named index exists with another configuration. The
// sidecar never drops it: an operator migrates explicitly.
type IndexMismatchError struct {
	Collection, Index, Expected, Found string
}

func (e *IndexMismatchError) Error() string {
	return fmt.Sprintf("index %q on %q is incompatible. Expected %s, found %s. Pulse never drops an index: drop or rename it yourself, then restart",
		e.Index, e.Collection, e.Expected, e.Found)
}

// UniqueViolationError is returned by EnsureSchema when existing data has duplicates that block a unique
// index.
type UniqueViolationError struct {
	Collection, Index, Detail string
}

func (e *UniqueViolationError) Error() string {
	return fmt.Sprintf("index %q on %q cannot be created: existing documents violate its uniqueness (%s); remove the duplicates, then restart",
		e.Index, e.Collection, e.Detail)
}

// existingIndex is an index as listIndexes reports it.
type existingIndex struct {
	Name               string   `bson:"name"`
	Key                bson.D   `bson:"key"`
	Unique             bool     `bson:"unique"`
	ExpireAfterSeconds *int64   `bson:"expireAfterSeconds"`
	Sparse             bool     `bson:"sparse"`
	Hidden             bool     `bson:"hidden"`
	Partial            bson.Raw `bson:"partialFilterExpression"`
	Collation          bson.Raw `bson:"collation"`
}

// EnsureSchema creates missing collections and named indexes, then verifies every index's keys (order and
// direction), uniqueness and TTL, rejecting sparse, hidden, partial or collated variants. It detects whether
// the server has TTL indexes (code 238 means no: the sweeper takes over) and change streams. It returns an
// *IndexMismatchError or *UniqueViolationError for an operator to resolve; it never drops anything.
func (s *Store) EnsureSchema(ctx context.Context) (Capabilities, error) {
	caps := Capabilities{TTL: true}
	colls := map[string]*mongo.Collection{"events": s.events, "subscriptions": s.subscriptions, "deliveries": s.deliveries, "history": s.history}
	for _, name := range []string{"events", "subscriptions", "deliveries", "history"} {
		err := s.db.CreateCollection(ctx, colls[name].Name())
		var ce mongo.CommandError
		if err != nil && !(errors.As(err, &ce) && (ce.Code == 48 || ce.Name == "NamespaceExists")) {
			return caps, fmt.Errorf("create collection %q: %w", colls[name].Name(), err)
		}
	}
	for _, spec := range indexSpecs {
		coll := colls[spec.coll]
		found, err := listIndexes(ctx, coll)
		if err != nil {
			return caps, err
		}
		if ex, ok := found[spec.name]; ok {
			if err := verifyIndex(coll.Name(), spec, ex); err != nil {
				return caps, err
			}
			if spec.ttl && ex.ExpireAfterSeconds == nil {
				caps.TTL = false
			}
			continue
		}
		opts := options.Index().SetName(spec.name)
		if spec.unique {
			opts.SetUnique(true)
		}
		if spec.ttl && caps.TTL {
			opts.SetExpireAfterSeconds(0)
		}
		_, err = coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: spec.keys, Options: opts})
		if err != nil && spec.ttl && isNotImplemented(err) {
			caps.TTL = false
			_, err = coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: spec.keys, Options: options.Index().SetName(spec.name)})
		}
		if err != nil {
			if spec.unique && isUniqueViolation(err) {
				return caps, &UniqueViolationError{Collection: coll.Name(), Index: spec.name, Detail: err.Error()}
			}
			return caps, fmt.Errorf("create index %q on %q: %w", spec.name, coll.Name(), err)
		}
	}
	caps.ChangeStreams = s.supportsChangeStreams(ctx)
	s.caps = caps
	return caps, nil
}

func listIndexes(ctx context.Context, coll *mongo.Collection) (map[string]existingIndex, error) {
	cur, err := coll.Indexes().List(ctx)
	if err != nil {
		return nil, fmt.Errorf("list indexes of %q: %w", coll.Name(), err)
	}
	var all []existingIndex
	if err := cur.All(ctx, &all); err != nil {
		return nil, fmt.Errorf("list indexes of %q: %w", coll.Name(), err)
	}
	out := make(map[string]existingIndex, len(all))
	for _, ix := range all {
		out[ix.Name] = ix
	}
	return out, nil
}

// verifyIndex compares an existing index with its spec. A TTL spec found as a plain index is accepted: the
// server cannot hold TTL indexes (EnsureSchema then leaves expiry to the sweeper).
func verifyIndex(coll string, spec indexSpec, ex existingIndex) error {
	var zero int64
	var wantTTL *int64
	if spec.ttl {
		wantTTL = &zero
	}
	variant := ex.Sparse || ex.Hidden || len(ex.Partial) > 0 || len(ex.Collation) > 0
	ok := sameKeys(spec.keys, ex.Key) && ex.Unique == spec.unique && !variant
	if ex.ExpireAfterSeconds != nil {
		ok = ok && spec.ttl && *ex.ExpireAfterSeconds == 0
	}
	if ok {
		return nil
	}
	return &IndexMismatchError{Collection: coll, Index: spec.name,
		Expected: describe(spec.keys, spec.unique, wantTTL, false),
		Found:    describe(ex.Key, ex.Unique, ex.ExpireAfterSeconds, variant)}
}

func sameKeys(a, b bson.D) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Key != b[i].Key || toInt(a[i].Value) != toInt(b[i].Value) {
			return false
		}
	}
	return true
}

func toInt(v any) int64 {
	switch n := v.(type) {
	case int:
		return int64(n)
	case int32:
		return int64(n)
	case int64:
		return n
	case float64:
		return int64(n)
	default:
		return 0 // "text", "2dsphere", ...: never equal to our ±1
	}
}

func describe(keys bson.D, unique bool, expireAfterSeconds *int64, variant bool) string {
	m := map[string]any{"unique": unique}
	var ks []string
	for _, e := range keys {
		b, _ := json.Marshal(e.Value)
		ks = append(ks, fmt.Sprintf("%s:%s", e.Key, b))
	}
	m["keys"] = ks
	if expireAfterSeconds != nil {
		m["expireAfterSeconds"] = *expireAfterSeconds
	}
	if variant {
		m["sparse/hidden/partial/collation"] = true
	}
	b, _ := json.Marshal(m)
	return string(b)
}

// supportsChangeStreams reports whether the server is a replica set member or mongos (change
// streams exist only there).
func (s *Store) supportsChangeStreams(ctx context.Context) bool {
	var hello struct {
		SetName string `bson:"setName"`
		Msg     string `bson:"msg"`
	}
	if err := s.db.RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&hello); err != nil {
		return false
	}
	return hello.SetName != "" || hello.Msg == "isdbgrid"
}

// isUniqueViolation reports whether creating a unique index failed because existing documents have
// duplicate keys: MongoDB answers a duplicate-key error (11000); FerretDB wraps SQLite's or PostgreSQL's
// constraint error in an InternalError.
func isUniqueViolation(err error) bool {
	if mongo.IsDuplicateKeyError(err) {
		return true
	}
	msg := err.Error()
	return strings.Contains(msg, "UNIQUE constraint failed") || strings.Contains(msg, "duplicate key") ||
		strings.Contains(msg, "could not create unique index")
}
