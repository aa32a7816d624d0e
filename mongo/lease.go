package mongo

import (
	"context"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// fence is the filter of a write that only the holder of a's lease may make.
func fence(a *pulsetype.Attempt) bson.M {
	return bson.M{"_id": a.ID, "lockToken": a.FencingToken, "status": pulsetype.StatusPending}
}

// hintQueue corrects the queue documents of attempts found otherwise than the queue said: a leased one
// gets its lease copied, an ended one is marked ended (claims skip it; the repair scan finishes it), one
// pending and unleased loses its lease copy. It costs one bulk update.
func (s *Store) hintQueue(ctx context.Context, attempts []*attemptDoc) error {
	if len(attempts) == 0 {
		return nil
	}
	models := make([]mongo.WriteModel, len(attempts))
	for i, a := range attempts {
		var update bson.M
		switch {
		case a.Status != pulsetype.StatusPending:
			update = bson.M{"$set": bson.M{"ended": true}}
		case a.LeasedUntil != nil:
			update = bson.M{"$set": bson.M{"lockedUntil": a.LeasedUntil, "lockToken": a.FencingToken}}
		default:
			update = bson.M{"$unset": bson.M{"lockedUntil": "", "lockToken": ""}}
		}
		models[i] = mongo.NewUpdateOneModel().SetFilter(bson.M{"_id": a.ID}).SetUpdate(update)
	}
	if _, err := s.bulkUpdate(ctx, s.queue, models); err != nil {
		return wrap("correct queue documents", err)
	}
	return nil
}

// leaseCopyStale reports whether queue document q's copy of the lease (lockedUntil, lockToken) differs from
// the lease of its pending attempt a.
func leaseCopyStale(q *queueDoc, a *attemptDoc) bool {
	if q.LeasedUntil == nil || a.LeasedUntil == nil {
		return q.LeasedUntil != a.LeasedUntil
	}
	return !q.LeasedUntil.Equal(*a.LeasedUntil) || q.FencingToken != a.FencingToken
}
