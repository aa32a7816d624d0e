package mongo

import (
	"context"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// Reaping: an attempt whose lease expired before it completed ends as worker_lost, fenced by the expired
// lease.

// reapScan bounds the queue documents whose copied lease has expired that one ReapOne looks at: most of
// them belong to attempts whose leases were renewed since (their copies are then corrected).
const reapScan = 16

// ReapOne turns one pending attempt whose lease expired into error/worker_lost, through a write whose filter
// still holds the old fencing token and the expired lockedUntil (a lease renewed meanwhile is not reaped). It
// finds it through the queue (the attempts whose copied lease has expired, oldest first), reading each one's
// lease from its history document and correcting the queue's copy of those renewed or ended meanwhile. It
// returns the reaped attempt, or nil when there was none or another replica reaped it first.
func (s *Store) ReapOne(ctx context.Context) (*pulsetype.Attempt, error) {
	now := s.now()
	queued, err := findAll[queueDoc](ctx, s, s.queue, "find expired leases", bson.M{fieldLeasedUntil: bson.M{"$lt": now}, "ended": bson.M{"$ne": true}},
		options.Find().SetSort(bson.D{{Key: fieldLeasedUntil, Value: 1}}).SetLimit(reapScan).SetProjection(bson.M{"_id": 1}))
	if err != nil || len(queued) == 0 {
		return nil, err
	}
	ids := idsOf(queued, func(q queueDoc) string { return q.ID })
	docs, err := findAll[attemptDoc](ctx, s, s.history, "read expired leases", bson.M{"_id": bson.M{"$in": ids}})
	if err != nil {
		return nil, err
	}
	var expiredLease *attemptDoc
	var stale []*attemptDoc
	for i := range docs {
		d := &docs[i]
		if d.Status == pulsetype.StatusPending && d.LeasedUntil != nil && d.LeasedUntil.Before(now) && expiredLease == nil {
			expiredLease = d
		} else {
			stale = append(stale, d)
		}
	}
	if err := s.hintQueue(ctx, stale); err != nil {
		return nil, err
	}
	if expiredLease == nil {
		return nil, nil
	}
	doc := expiredLease
	e := &pulsetype.ErrorInfo{Code: pulsetype.CodeWorkerLost, Message: "the attempt's lease expired before it completed (lease owner " + doc.LeaseOwner + ")"}
	set := bson.M{"status": pulsetype.StatusError, "endedAt": now, "error": e}
	if exp := expiry(now, s.opts.HistoryRetention); exp != nil {
		set["expiresAt"] = exp
	}
	expiredFence := fence(pulsetype.LeaseKey{AttemptID: doc.ID, Token: doc.FencingToken})
	expiredFence[fieldLeasedUntil] = bson.M{"$lt": now}
	res, err := s.history.UpdateOne(ctx, expiredFence, bson.M{"$set": set})
	if err != nil {
		return nil, wrap("reap attempt", err)
	}
	if res.ModifiedCount == 0 {
		return nil, nil
	}
	if _, err := s.queue.UpdateOne(ctx, bson.M{"_id": doc.ID}, bson.M{"$set": bson.M{"ended": true}}); err != nil {
		return nil, wrap("mark reaped attempt in the queue", err)
	}
	a := doc.attempt()
	a.Status, a.Error, a.EndedAt = pulsetype.StatusError, e, &now
	return a, nil
}
