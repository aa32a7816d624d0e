package mongo

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// indexSpec is one named index the sidecar needs.
type indexSpec struct {
	coll   string // collection suffix: one of collectionNames
	name   string
	keys   bson.D
	unique bool
	ttl    bool // TTL index with expireAfterSeconds 0 (a plain index where the server lacks TTL indexes)
}

// queueGroupDueIndex is the index DueAttempts names in its hint when it claims for some consumer groups.
const queueGroupDueIndex = "pulse_queue_group_due"

// indexSpecs are the sidecar's indexes. Every hot query is served by one of them.
var indexSpecs = []indexSpec{
	{coll: "events", name: "pulse_events_topic_id", keys: bson.D{{Key: "topic", Value: 1}, {Key: "_id", Value: 1}}},
	{coll: "events", name: "pulse_events_fanout", keys: bson.D{{Key: "fanout", Value: 1}, {Key: "createdAt", Value: 1}}},
	{coll: "events", name: "pulse_events_expires_at_ttl", keys: bson.D{{Key: "expiresAt", Value: 1}}, ttl: true},
	// Serves the sweep of staged events of array publishes that never committed ({staged: true, createdAt <
	// now - StagedTimeout}), run every minute by every replica: without it each sweep reads every event.
	{coll: "events", name: "pulse_events_staged", keys: bson.D{{Key: "staged", Value: 1}, {Key: "createdAt", Value: 1}}},
	// Serves the members of an array publish ({batch: {$in: [...]}}), which the repair reads to roll a partly
	// committed array forward (rollForward); events of single publishes carry no batch.
	{coll: "events", name: "pulse_events_batch", keys: bson.D{{Key: "batch", Value: 1}}},
	{coll: "subscriptions", name: "pulse_subscriptions_topics", keys: bson.D{{Key: "topics", Value: 1}}},
	{coll: "deliveries", name: "pulse_deliveries_group_event_unique", keys: bson.D{{Key: "consumerGroup", Value: 1}, {Key: "eventId", Value: 1}}, unique: true},
	// Serves the deliveries of an event (GET /v1/events/{id}), by consumer group: the unique index starts
	// with consumerGroup, so it cannot.
	{coll: "deliveries", name: "pulse_deliveries_event", keys: bson.D{{Key: "eventId", Value: 1}, {Key: "consumerGroup", Value: 1}}},
	{coll: "deliveries", name: "pulse_deliveries_status_id", keys: bson.D{{Key: "status", Value: 1}, {Key: "_id", Value: 1}}},
	// Served the head of a line of an ordered consumer group before the queue existed (the queue's
	// pulse_queue_line serves ClaimHeads now); kept and checked. It replaced pulse_deliveries_acquisition
	// (the head per topic), which a database created by an earlier version still holds unused: drop it at
	// will.
	{coll: "deliveries", name: "pulse_deliveries_line", keys: bson.D{{Key: "consumerGroup", Value: 1}, {Key: "topic", Value: 1}, {Key: "status", Value: 1}, {Key: "orderingKey", Value: 1}, {Key: "eventCreatedAt", Value: 1}, {Key: "eventId", Value: 1}}},
	// Serve GET /v1/deliveries newest first, with and without a consumer group.
	{coll: "deliveries", name: "pulse_deliveries_created", keys: bson.D{{Key: "createdAt", Value: -1}, {Key: "_id", Value: -1}}},
	{coll: "deliveries", name: "pulse_deliveries_group_created", keys: bson.D{{Key: "consumerGroup", Value: 1}, {Key: "createdAt", Value: -1}, {Key: "_id", Value: -1}}},
	// Serves GET /v1/deliveries?consumerGroup=&status= and the pending figures of GET /v1/stats (count and
	// oldest pending delivery of a group).
	{coll: "deliveries", name: "pulse_deliveries_group_status_created", keys: bson.D{{Key: "consumerGroup", Value: 1}, {Key: "status", Value: 1}, {Key: "createdAt", Value: -1}, {Key: "_id", Value: -1}}},
	{coll: "deliveries", name: "pulse_deliveries_expires_at_ttl", keys: bson.D{{Key: "expiresAt", Value: 1}}, ttl: true},
	{coll: "history", name: "pulse_history_delivery_attempt_unique", keys: bson.D{{Key: "deliveryId", Value: 1}, {Key: "attempt", Value: 1}}, unique: true},
	// Serves both the claim ({status: pending, lockedUntil: null, nextAttemptAt ≤ now}) and the reaper
	// ({status: pending, lockedUntil < now}).
	{coll: "history", name: "pulse_history_acquisition", keys: bson.D{{Key: "status", Value: 1}, {Key: fieldLeasedUntil, Value: 1}, {Key: "nextAttemptAt", Value: 1}}},
	// Serves the attempt figures of GET /v1/stats: a group's attempts ended in the last hour, by status.
	{coll: "history", name: "pulse_history_group_status_ended", keys: bson.D{{Key: "consumerGroup", Value: 1}, {Key: "status", Value: 1}, {Key: "endedAt", Value: -1}}},
	{coll: "history", name: "pulse_history_lock_token", keys: bson.D{{Key: fieldFencingToken, Value: 1}}},
	{coll: "history", name: "pulse_history_expires_at_ttl", keys: bson.D{{Key: "expiresAt", Value: 1}}, ttl: true},
	// The queue (pending work, see queueDoc): claims ({lockedUntil: null, nextAttemptAt ≤ now}) and the
	// reaper ({lockedUntil < now}); the repair scan and the queue documents of one delivery; the heads of the
	// lines of ordered consumer groups (ClaimHeads: the first document of each line, a line read alone, the
	// lines before their heads).
	{coll: "queue", name: "pulse_queue_acquisition", keys: bson.D{{Key: fieldLeasedUntil, Value: 1}, {Key: "nextAttemptAt", Value: 1}}},
	// The claim of due attempts of some consumer groups ({consumerGroup: {$in: [...]}, lockedUntil: null,
	// nextAttemptAt ≤ now}, see DueAttempts): the groups left out (ordered, paused, disabled) are never read.
	{coll: "queue", name: queueGroupDueIndex, keys: bson.D{{Key: "consumerGroup", Value: 1}, {Key: fieldLeasedUntil, Value: 1}, {Key: "nextAttemptAt", Value: 1}}},
	{coll: "queue", name: "pulse_queue_delivery", keys: bson.D{{Key: "deliveryId", Value: 1}, {Key: "attempt", Value: 1}}},
	{coll: "queue", name: "pulse_queue_line", keys: bson.D{{Key: "consumerGroup", Value: 1}, {Key: "topic", Value: 1}, {Key: "orderingKey", Value: 1}, {Key: "eventCreatedAt", Value: 1}, {Key: "eventId", Value: 1}, {Key: "attempt", Value: -1}}},
	// The outbox (unfinished fan-outs, see outboxDoc): the repair of interrupted fan-outs (oldest first) and
	// the earlier-event check of a line.
	{coll: "outbox", name: "pulse_outbox_created", keys: bson.D{{Key: "createdAt", Value: 1}}},
	{coll: "outbox", name: "pulse_outbox_line", keys: bson.D{{Key: "topic", Value: 1}, {Key: "orderingKey", Value: 1}, {Key: "createdAt", Value: 1}}},
}

// collectionNames are the suffixes of the sidecar's collections, in the order EnsureSchema creates them.
var collectionNames = []string{"events", "subscriptions", "deliveries", "history", "queue", "outbox"}

// IndexMismatchError is returned by EnsureSchema when a named index exists with another configuration: other
// keys (order or direction), uniqueness or expireAfterSeconds, a plain index where the server holds TTL
// indexes, or a sparse, hidden, partial or collated variant. Expected and Found describe both in the shape of
// listIndexes, as in {key: {expiresAt: 1}, expireAfterSeconds: 0}. The sidecar never drops it: an operator
// migrates explicitly.
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

// PermissionError is returned by EnsureSchema when the MongoDB user may not do what every start needs
// (the server answers code 13 Unauthorized): create the collections and indexes, and create and drop the
// scratch collection of the TTL probe. Action names what was refused, as in `create index "x" on "pulse.events"`;
// Detail is the server's message. The readWrite role on the database grants all of it.
type PermissionError struct {
	Database, Action, Detail string
}

func (e *PermissionError) Error() string {
	return fmt.Sprintf("the MongoDB user may not %s in database %q (%s). Every start needs createCollection, createIndex and dropCollection there (the readWrite role has them): grant them, then restart",
		e.Action, e.Database, e.Detail)
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

// EnsureSchema creates missing collections and named indexes, then verifies every existing index's keys
// (order and direction), uniqueness and expireAfterSeconds, rejecting sparse, hidden, partial or collated
// variants. It builds the store with its capabilities: Options.Capabilities when set, else what
// DetectCapabilities finds (TTL indexes are probed on a scratch collection, never read from an existing
// index), and returns them. Where the server has TTL indexes, the three expiresAt indexes must be TTL
// indexes with expireAfterSeconds 0; where it has not (FerretDB), they are plain and the sweeper takes over.
// A missing index is built with commitQuorum "majority" where the server takes one (Capabilities.CommitQuorum),
// with one info line before and after each build (at debug, and one info line for all of them, with
// Options.SummarizeIndexBuilds); then the one-time queue migration runs (migrateQueue,
// resumable). It blocks until done or ctx ends: the caller gives it a bound of its own, long enough for
// index builds on large collections (the sidecar's PULSE_SCHEMA_TIMEOUT).
// It returns an *IndexMismatchError, *UniqueViolationError or *PermissionError for an operator to resolve;
// it never drops anything of ours.
func (s *Store) EnsureSchema(ctx context.Context) (Capabilities, error) {
	var caps Capabilities
	colls := s.collections()
	for _, name := range collectionNames {
		err := s.db.CreateCollection(ctx, colls[name].Name())
		var ce mongo.CommandError
		if err != nil && !(errors.As(err, &ce) && (ce.Code == 48 || ce.Name == "NamespaceExists")) {
			if isUnauthorized(err) {
				return caps, &PermissionError{Database: s.db.Name(), Action: fmt.Sprintf("create collection %q", colls[name].Name()), Detail: err.Error()}
			}
			return caps, fmt.Errorf("create collection %q: %w", colls[name].Name(), err)
		}
	}
	if s.opts.Capabilities != nil {
		caps = *s.opts.Capabilities
	} else {
		detected, err := s.DetectCapabilities(ctx)
		if err != nil {
			return caps, err
		}
		caps = detected
	}
	buildLog := s.log.Info
	if s.opts.SummarizeIndexBuilds {
		buildLog = s.log.Debug
	}
	built, buildsBegan := 0, time.Now()
	for _, spec := range indexSpecs {
		coll := colls[spec.coll]
		found, err := listIndexes(ctx, coll)
		if err != nil {
			return caps, err
		}
		if ex, ok := found[spec.name]; ok {
			if err := verifyIndex(coll.Name(), spec, ex, caps.TTLIndexes); err != nil {
				return caps, err
			}
			continue
		}
		opts := options.Index().SetName(spec.name)
		if spec.unique {
			opts.SetUnique(true)
		}
		if spec.ttl && caps.TTLIndexes {
			opts.SetExpireAfterSeconds(0)
		}
		var build []options.Lister[options.CreateIndexesOptions]
		if caps.CommitQuorum {
			// Ready once a majority of the data-bearing voting members built it, not every one of them
			// (the default, votingMembers), so one slow or lagging member does not hold every start.
			build = append(build, options.CreateIndexes().SetCommitQuorumMajority())
		}
		began := time.Now()
		buildLog().Str("collection", coll.Name()).Str("index", spec.name).Msg("building index")
		_, err = coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: spec.keys, Options: opts}, build...)
		if err == nil {
			built++
			buildLog().Str("collection", coll.Name()).Str("index", spec.name).Dur("took", time.Since(began)).Msg("index built")
		}
		if err != nil {
			if spec.unique && isUniqueViolation(err) {
				return caps, &UniqueViolationError{Collection: coll.Name(), Index: spec.name, Detail: err.Error()}
			}
			if isUnauthorized(err) {
				return caps, &PermissionError{Database: s.db.Name(), Action: fmt.Sprintf("create index %q on %q", spec.name, coll.Name()), Detail: err.Error()}
			}
			return caps, fmt.Errorf("create index %q on %q: %w", spec.name, coll.Name(), err)
		}
	}
	if s.opts.SummarizeIndexBuilds && built > 0 {
		took := time.Since(buildsBegan)
		s.log.Info().Int("indexes", built).Dur("took", took).
			Msgf("built %d indexes in %.1f s", built, took.Seconds())
	}
	s.caps = caps
	if err := s.migrateQueue(ctx); err != nil {
		return caps, err
	}
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

// verifyIndex compares an existing index with its spec on a server that has TTL indexes (serverTTL) or not.
// A TTL spec wants expireAfterSeconds 0 where the server has TTL indexes, and a plain index where it has not;
// any other spec wants no expireAfterSeconds. Sparse, hidden, partial and collated variants never match. It
// returns nil or an *IndexMismatchError naming both configurations.
func verifyIndex(coll string, spec indexSpec, ex existingIndex, serverTTL bool) error {
	want := existingIndex{Key: spec.keys, Unique: spec.unique}
	if spec.ttl && serverTTL {
		var zero int64
		want.ExpireAfterSeconds = &zero
	}
	variant := ex.Sparse || ex.Hidden || len(ex.Partial) > 0 || len(ex.Collation) > 0
	sameTTL := (want.ExpireAfterSeconds == nil) == (ex.ExpireAfterSeconds == nil) &&
		(ex.ExpireAfterSeconds == nil || *ex.ExpireAfterSeconds == *want.ExpireAfterSeconds)
	if sameKeys(spec.keys, ex.Key) && ex.Unique == spec.unique && sameTTL && !variant {
		return nil
	}
	return &IndexMismatchError{Collection: coll, Index: spec.name, Expected: describe(want), Found: describe(ex)}
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

// describe renders an index's configuration on one line in the shape listIndexes reports it, with only the
// options that are set, as in {key: {consumerGroup: 1, eventId: 1}, unique: true} or
// {key: {expiresAt: 1}, expireAfterSeconds: 3600, partialFilterExpression: {"a": {"$exists": true}}}.
func describe(ix existingIndex) string {
	var keys []string
	for _, e := range ix.Key {
		v := fmt.Sprint(e.Value)
		switch n := e.Value.(type) {
		case string:
			v = strconv.Quote(n)
		case int, int32, int64, float64:
			v = fmt.Sprint(toInt(n))
		}
		keys = append(keys, e.Key+": "+v)
	}
	parts := []string{"key: {" + strings.Join(keys, ", ") + "}"}
	if ix.Unique {
		parts = append(parts, "unique: true")
	}
	if ix.ExpireAfterSeconds != nil {
		parts = append(parts, fmt.Sprintf("expireAfterSeconds: %d", *ix.ExpireAfterSeconds))
	}
	if ix.Sparse {
		parts = append(parts, "sparse: true")
	}
	if ix.Hidden {
		parts = append(parts, "hidden: true")
	}
	if len(ix.Partial) > 0 {
		parts = append(parts, "partialFilterExpression: "+ix.Partial.String())
	}
	if len(ix.Collation) > 0 {
		parts = append(parts, "collation: "+ix.Collation.String())
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

// isUnauthorized reports whether the server refused a command for the user's lack of rights: code 13
// Unauthorized (MongoDB Atlas answers 8000 AtlasError "user is not allowed to do action [...]").
func isUnauthorized(err error) bool {
	var se mongo.ServerError
	if !errors.As(err, &se) {
		return false
	}
	return se.HasErrorCode(13) || (se.HasErrorCode(8000) && strings.Contains(err.Error(), "not allowed to do action"))
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
