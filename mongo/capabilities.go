package mongo

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Capabilities are what the database server can do, where the store's behaviour depends on it. A Store is
// built with them (Options.Capabilities) or detects them in EnsureSchema (DetectCapabilities). The zero value
// is a server with none of the features and no bound on update commands.
type Capabilities struct {
	// TTLIndexes: the server expires documents through TTL indexes (expireAfterSeconds). Without them,
	// EnsureSchema creates the expiresAt indexes plain and Sweep deletes expired documents. FerretDB v1
	// lacks them (it answers 238 NotImplemented).
	TTLIndexes bool
	// ChangeStreams: the server is a replica set member or a mongos, so WatchEvents can follow inserts.
	ChangeStreams bool
	// CommitQuorum: the server takes createIndexes' commitQuorum (MongoDB 4.4 and later, on a replica set
	// member or a mongos; a standalone refuses it), so EnsureSchema builds indexes with commitQuorum
	// "majority" rather than the default "votingMembers", which waits for every voting member. FerretDB
	// lacks it.
	CommitQuorum bool
	// PartialIndexes: the server keeps an index's partialFilterExpression. The store creates none; the
	// field tells callers and tests what the server holds. FerretDB v1 lacks them (238 NotImplemented).
	PartialIndexes bool
	// MaxUpdateStatements bounds the statements of one update command: the store splits a larger bulk
	// update into several commands. 0 means no bound of the store's (the driver still splits at the
	// server's maxWriteBatchSize). FerretDB v1 needs 16 (ferretDBMaxUpdateStatements).
	MaxUpdateStatements int
	// ScansFilters: the server evaluates a query filter by reading the collection rather than through the
	// store's indexes (FerretDB v1: its SQLite handler pushes down only {_id: x}, its PostgreSQL handler only
	// equalities), so fewer queries beat narrower ones (Stats).
	ScansFilters bool
	// FirstOfGroups: the server's $group stage has the $first accumulator, so the heads of an ordered group's
	// lines are read with one aggregation that keeps the first queue document of each line (headsOfLines);
	// without it they come from one bounded read of the lines' queue documents in line order
	// (headsOfLinesByScan). FerretDB v1 lacks it (it implements $count and $sum only).
	FirstOfGroups bool
}

// ferretDBMaxUpdateStatements is MaxUpdateStatements on FerretDB. FerretDB v1 keeps every statement's query
// open until the whole command returns, one pooled backend connection each (50 on PostgreSQL, 100 on
// SQLite), so a longer command waits forever for a connection it holds itself.
const ferretDBMaxUpdateStatements = 16

// DetectCapabilities asks the server what it can do, without changing the store: TTL and partial indexes
// by creating one of each on a scratch collection of its own (see probeIndexes), change streams by hello
// (a replica set member or mongos; CommitQuorum there too, except on FerretDB), FirstOfGroups by an aggregation
// of nothing that asks for it (supportsFirstOfGroups), and MaxUpdateStatements and ScansFilters by buildInfo
// (ferretDBMaxUpdateStatements and true where it reports a ferretdbVersion, else 0 and false). It returns a
// *PermissionError when the user may not create or drop the scratch collection, and other failures wrapped.
func (s *Store) DetectCapabilities(ctx context.Context) (Capabilities, error) {
	var caps Capabilities
	var err error
	if caps.TTLIndexes, caps.PartialIndexes, err = s.probeIndexes(ctx); err != nil {
		return Capabilities{}, err
	}
	var info struct {
		FerretDBVersion string `bson:"ferretdbVersion"`
	}
	if err := s.db.RunCommand(ctx, bson.D{{Key: "buildInfo", Value: 1}}).Decode(&info); err != nil {
		return Capabilities{}, fmt.Errorf("detect capabilities: buildInfo: %w", err)
	}
	if info.FerretDBVersion != "" {
		caps.MaxUpdateStatements, caps.ScansFilters = ferretDBMaxUpdateStatements, true
	}
	if caps.ChangeStreams, err = s.supportsChangeStreams(ctx); err != nil {
		return Capabilities{}, err
	}
	if caps.FirstOfGroups, err = s.supportsFirstOfGroups(ctx); err != nil {
		return Capabilities{}, err
	}
	caps.CommitQuorum = caps.ChangeStreams && info.FerretDBVersion == ""
	return caps, nil
}

// probeIndexes reports whether the server can hold TTL indexes and partial indexes. It creates a TTL index
// (expireAfterSeconds 0 on expiresAt) and then a partial one (x where x exists) on a scratch collection of
// its own, <prefix>.schema_probe_<16 hex digits> (random, so concurrent starts never share one), and drops
// that collection again, whatever the outcome. Code 238 NotImplemented means no (FerretDB); a partial index
// counts only when listIndexes reports its filter back. Code 13 Unauthorized is a *PermissionError; any other
// failure is returned wrapped. A process killed before the drop leaves the scratch collection behind; it
// holds no documents and may be dropped at any time.
func (s *Store) probeIndexes(ctx context.Context) (ttl, partial bool, err error) {
	var suffix [8]byte
	if _, err := rand.Read(suffix[:]); err != nil {
		return false, false, fmt.Errorf("probe indexes: %w", err)
	}
	scratch := s.db.Collection(s.opts.CollectionPrefix + ".schema_probe_" + hex.EncodeToString(suffix[:]))
	ttl, err = s.probeIndex(ctx, scratch, "TTL", mongo.IndexModel{Keys: bson.D{{Key: "expiresAt", Value: 1}},
		Options: options.Index().SetName("pulse_probe_ttl").SetExpireAfterSeconds(0)})
	if err == nil {
		partial, err = s.probeIndex(ctx, scratch, "partial", mongo.IndexModel{Keys: bson.D{{Key: "x", Value: 1}},
			Options: options.Index().SetName("pulse_probe_partial").SetPartialFilterExpression(bson.D{{Key: "x", Value: bson.D{{Key: "$exists", Value: true}}}})})
	}
	if err == nil && partial {
		var found map[string]existingIndex
		if found, err = listIndexes(ctx, scratch); err == nil {
			partial = len(found["pulse_probe_partial"].Partial) > 0
		}
	}
	// Dropped with a context of its own: a start cancelled meanwhile still removes the scratch collection.
	dropCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if derr := scratch.Drop(dropCtx); derr != nil && err == nil {
		if isUnauthorized(derr) {
			return false, false, &PermissionError{Database: s.db.Name(), Action: fmt.Sprintf("drop the scratch collection %q", scratch.Name()), Detail: derr.Error()}
		}
		return false, false, fmt.Errorf("drop the scratch collection %q: %w", scratch.Name(), derr)
	}
	return ttl, partial, err
}

// probeIndex creates index (a kind of index, as in "TTL") on scratch and reports whether the server took it:
// false with a nil error when it answers 238 NotImplemented, a *PermissionError when it answers 13
// Unauthorized, any other failure wrapped.
func (s *Store) probeIndex(ctx context.Context, scratch *mongo.Collection, kind string, index mongo.IndexModel) (bool, error) {
	_, err := scratch.Indexes().CreateOne(ctx, index)
	switch {
	case err == nil:
		return true, nil
	case isNotImplemented(err):
		return false, nil
	case isUnauthorized(err):
		return false, &PermissionError{Database: s.db.Name(), Action: fmt.Sprintf("create a %s index on the scratch collection %q", kind, scratch.Name()), Detail: err.Error()}
	default:
		return false, fmt.Errorf("probe %s indexes on %q: %w", kind, scratch.Name(), err)
	}
}

// helloTries bounds how often supportsChangeStreams asks hello before it gives up; helloRetryWait is the wait
// after the first failure, doubled after each further one.
const (
	helloTries     = 4
	helloRetryWait = 250 * time.Millisecond
)

// helloReply is what supportsChangeStreams reads of hello.
type helloReply struct {
	SetName string `bson:"setName"`
	Msg     string `bson:"msg"`
}

// supportsChangeStreams reports whether the server is a replica set member or mongos (change streams exist
// only there), by hello. A failed hello is asked again, helloTries times in all, then returned as an error:
// one failure at start (an election, a connection reset) never turns change streams off for the whole
// process, as answering false would.
func (s *Store) supportsChangeStreams(ctx context.Context) (bool, error) {
	hello := s.hello
	if hello == nil {
		hello = func(ctx context.Context) (helloReply, error) {
			var r helloReply
			err := s.db.RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&r)
			return r, err
		}
	}
	wait := helloRetryWait
	var err error
	for try := range helloTries {
		var r helloReply
		if r, err = hello(ctx); err == nil {
			return r.SetName != "" || r.Msg == "isdbgrid", nil
		}
		if try == helloTries-1 {
			break
		}
		select {
		case <-ctx.Done():
			return false, fmt.Errorf("detect capabilities: hello: %w", err)
		case <-time.After(wait):
		}
		wait *= 2
	}
	return false, fmt.Errorf("detect capabilities: hello failed %d times: %w", helloTries, err)
}

// supportsFirstOfGroups reports whether the server runs a $group with the $first accumulator: it asks for
// the first document of an empty selection of the queue (a filter no document matches, served by _id). Code
// 238 NotImplemented means no (FerretDB v1); other failures are returned wrapped.
func (s *Store) supportsFirstOfGroups(ctx context.Context) (bool, error) {
	cur, err := s.aggregate(ctx, s.queue, bson.A{
		bson.M{"$match": bson.M{"_id": ""}},
		bson.M{"$group": bson.M{"_id": "$orderingKey", "head": bson.M{"$first": "$$ROOT"}}},
	}, "")
	if err == nil {
		err = cur.Close(ctx)
	}
	switch {
	case isNotImplemented(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("detect capabilities: $group with $first: %w", err)
	}
	return true, nil
}

// isNotImplemented reports whether err is the server's code 238 NotImplemented (FerretDB's answer for TTL
// indexes, partial indexes and change streams).
func isNotImplemented(err error) bool {
	var ce mongo.CommandError
	if errors.As(err, &ce) && ce.Code == 238 {
		return true
	}
	var we mongo.WriteException
	if errors.As(err, &we) && we.WriteConcernError != nil && we.WriteConcernError.Code == 238 {
		return true
	}
	return false
}
