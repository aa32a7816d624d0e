package mongo

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// A server-side limit on every read. The driver sends maxTimeMS, the time left until the operation's
// deadline (its context's, or the client's operation timeout), with every command but the two that return a
// cursor: Collection.Find and Collection.Aggregate leave it off (driver v2 mongo/collection.go, "Omit maxTimeMS
// from operations that return a user-managed cursor", DRIVERS-2722), so a poll, a replay or an activity read
// would run on in the server after the client gave up. The store's finds and aggregations go through find
// and aggregate instead: the same commands sent with Database.RunCommandCursor, to which the driver adds
// maxTimeMS like to any command. Every read of the store reads its cursor to the end at once (or a page at a
// time within one call), so the limit, which MongoDB counts over the cursor's getMores too, is the call's.

// defaultReadTimeout is the deadline of a read whose context has none, when the client has no operation
// timeout either (the sidecar's client has one: mongo.ConnectOptions.OperationTimeout).
const defaultReadTimeout = 30 * time.Second

// boundRead returns ctx, given defaultReadTimeout when it has no deadline, so that the driver sends maxTimeMS.
func boundRead(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, defaultReadTimeout)
}

// errReadOption is returned by find for a find option it does not send.
var errReadOption = errors.New("find option not supported by the store's find")

// find runs the find command of coll.Find(ctx, filter, opts...) with a server-side limit (maxTimeMS, see
// above), with the store's read concern (Options.ReadConcern; s may be nil: the server's default) and a
// primary read preference, and returns its cursor. It sends the options the
// store uses (sort, projection, limit, skip, hint, batch size, comment) and returns errReadOption for another.
func (s *Store) find(ctx context.Context, coll *mongo.Collection, filter any, opts ...options.Lister[options.FindOptions]) (*mongo.Cursor, error) {
	var fo options.FindOptions
	for _, o := range opts {
		if o == nil {
			continue
		}
		for _, set := range o.List() {
			if err := set(&fo); err != nil {
				return nil, err
			}
		}
	}
	if fo.Collation != nil || fo.Let != nil || fo.Max != nil || fo.Min != nil || fo.AllowDiskUse != nil || fo.CursorType != nil ||
		fo.NoCursorTimeout != nil || fo.AllowPartialResults != nil || fo.ReturnKey != nil || fo.ShowRecordID != nil || fo.MaxAwaitTime != nil {
		return nil, fmt.Errorf("find on %s: %w", coll.Name(), errReadOption)
	}
	if filter == nil {
		filter = bson.D{}
	}
	cmd := bson.D{{Key: "find", Value: coll.Name()}, {Key: "filter", Value: filter}}
	add := func(key string, v any) { cmd = append(cmd, bson.E{Key: key, Value: v}) }
	if fo.Sort != nil {
		add("sort", fo.Sort)
	}
	if fo.Projection != nil {
		add("projection", fo.Projection)
	}
	if fo.Hint != nil {
		add("hint", fo.Hint)
	}
	if fo.Skip != nil {
		add("skip", *fo.Skip)
	}
	if fo.Limit != nil && *fo.Limit != 0 {
		if *fo.Limit < 0 { // a single batch of at most -limit documents, as the driver sends it
			add("limit", -*fo.Limit)
			add("singleBatch", true)
		} else {
			add("limit", *fo.Limit)
		}
	}
	if fo.BatchSize != nil {
		add("batchSize", *fo.BatchSize)
	}
	if fo.Comment != nil {
		add("comment", fo.Comment)
	}
	return s.runCursor(ctx, coll, cmd)
}

// aggregate runs the aggregate command of coll.Aggregate(ctx, pipeline) with a server-side limit (maxTimeMS,
// see above), with the store's read concern and a primary read preference, and returns its cursor; hint, when
// not empty, names the index.
func (s *Store) aggregate(ctx context.Context, coll *mongo.Collection, pipeline any, hint string) (*mongo.Cursor, error) {
	cmd := bson.D{{Key: "aggregate", Value: coll.Name()}, {Key: "pipeline", Value: pipeline}, {Key: "cursor", Value: bson.D{}}}
	if hint != "" {
		cmd = append(cmd, bson.E{Key: "hint", Value: hint})
	}
	return s.runCursor(ctx, coll, cmd)
}

// runCursor sends a cursor command of coll under a deadline (boundRead), with the store's read concern
// (Database.RunCommandCursor applies none by itself) and a primary read preference (RunCommandCursor's
// default: the reads that decide read the primary).
func (s *Store) runCursor(ctx context.Context, coll *mongo.Collection, cmd bson.D) (*mongo.Cursor, error) {
	if s != nil && s.opts.ReadConcern != "" {
		cmd = append(cmd, bson.E{Key: "readConcern", Value: bson.D{{Key: "level", Value: s.opts.ReadConcern}}})
	}
	ctx, cancel := boundRead(ctx)
	defer cancel() // the cursor's getMores run under their callers' contexts
	return coll.Database().RunCommandCursor(ctx, cmd)
}
