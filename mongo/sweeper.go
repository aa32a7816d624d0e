package mongo

import (
	"context"
	"maps"
	"slices"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// StagedTimeout is how long an uncommitted (staged) event may live: a publisher that crashed between insert
// and commit leaves such events (of an array or of single publishes), and Sweep removes them after this; the
// fan-out repair removes their outbox documents then too.
const StagedTimeout = time.Hour

// Sweep deletes documents whose expiresAt has passed, from every collection, and staged events older than
// StagedTimeout, except those of an array with a committed event, which it commits instead (rollForward:
// an array ends all committed or all removed; docs/delivery.md, "Publishing"). It is the retention path on servers without TTL indexes (FerretDB); on MongoDB the TTL
// monitor does the same and Sweep only removes staged leftovers. It returns how many documents it deleted.
func (s *Store) Sweep(ctx context.Context) (int64, error) {
	now := s.now()
	staged := bson.M{"staged": true, "createdAt": bson.M{"$lt": now.Add(-StagedTimeout)}}
	if err := s.rollForwardSwept(ctx, staged); err != nil {
		return 0, err
	}
	if s.caps.TTLIndexes {
		res, err := s.deleteMany(ctx, s.events, staged)
		if err != nil {
			return 0, wrap("sweep staged events", err)
		}
		return res.DeletedCount, nil
	}
	// One delete per collection: a server without TTL indexes (FerretDB) reads the whole collection for it.
	expired := bson.M{"expiresAt": bson.M{"$lte": now}}
	var total int64
	for _, c := range []struct {
		coll   *mongo.Collection
		filter bson.M
	}{{s.events, bson.M{"$or": bson.A{expired, staged}}}, {s.deliveries, expired}, {s.history, expired}} {
		res, err := s.deleteMany(ctx, c.coll, c.filter)
		if err != nil {
			return total, wrap("sweep "+c.coll.Name(), err)
		}
		total += res.DeletedCount
	}
	return total, nil
}

// rollForwardSwept rolls forward the arrays of the staged events that filter (the sweep's) selects, read
// with one query of their batch ids through index pulse_events_staged.
func (s *Store) rollForwardSwept(ctx context.Context, filter bson.M) error {
	f := bson.M{"batch": bson.M{"$exists": true}}
	maps.Copy(f, filter)
	docs, err := findAll[eventDoc](ctx, s, s.events, "find staged events of arrays", f, options.Find().SetProjection(bson.M{"batch": 1}))
	if err != nil {
		return err
	}
	batches := map[string]bool{}
	for _, d := range docs {
		batches[d.Batch] = true
	}
	// A page of arrays at a time, so that no command names more than a page of batch ids.
	for page := range slices.Chunk(slices.Sorted(maps.Keys(batches)), s.pageSize()) {
		if _, err := s.rollForward(ctx, page); err != nil {
			return err
		}
	}
	return nil
}
