package mongo

import (
	"context"
	"errors"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// The stored names of a subscription's discovery lease fields (see fieldLeaseOwner).
const (
	backfillLeasedUntil  = "backfill." + fieldLeasedUntil
	backfillFencingToken = "backfill." + fieldFencingToken
)

// Backfill advances the backfill of one earliest-offset consumer group by up to batch events: it takes the
// group's discovery lease (a findOneAndUpdate that succeeds only when no other replica holds a live one),
// creates the deliveries and first attempts of the next retained events after the cursor in id order
// (duplicates are no-ops), then advances the cursor with a write fenced by the lease token, or ends the
// backfill when the batch was the last. Several replicas starting at once converge: one holds the lease, and
// the unique indexes absorb any overlap. It returns how many first attempts it inserted.
func (s *Store) Backfill(ctx context.Context, owner string, batch int) (int, error) {
	now := s.now()
	token := newFencingToken()
	var sub subscriptionDoc
	err := s.subscriptions.FindOneAndUpdate(ctx,
		bson.M{"backfill": bson.M{"$exists": true}, "$or": bson.A{
			bson.M{backfillLeasedUntil: nil}, bson.M{backfillLeasedUntil: bson.M{"$lt": now}},
		}},
		bson.M{"$set": bson.M{"backfill." + fieldLeaseOwner: owner, backfillFencingToken: token, backfillLeasedUntil: now.Add(s.opts.LeaseTimeout)}},
		options.FindOneAndUpdate().SetReturnDocument(options.After)).Decode(&sub)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return 0, nil
	}
	if err != nil {
		return 0, wrap("take discovery lease", err)
	}
	docs, err := findAll[*eventDoc](ctx, s, s.events, "read events to backfill",
		withTopics(bson.M{"_id": bson.M{"$gt": sub.Backfill.Cursor}, "staged": bson.M{"$ne": true}}, sub.Topics),
		options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}).SetLimit(int64(batch)))
	if err != nil {
		return 0, err
	}
	events := make([]*pulsetype.Event, 0, len(docs))
	for _, d := range docs {
		if !expired(d.ExpiresAt, now) {
			events = append(events, d.event())
		}
	}
	created, err := s.insertDeliveries(ctx, events, []subscriptionDoc{sub}, "", nil)
	if err != nil {
		return 0, err
	}
	inserted := len(created)
	fenced := bson.M{"_id": sub.ID, backfillFencingToken: token}
	var update bson.M
	if len(docs) < batch {
		update = bson.M{"$unset": bson.M{"backfill": ""}} // done: later events arrive through fan-out
	} else {
		update = bson.M{"$set": bson.M{"backfill.cursor": docs[len(docs)-1].ID}, "$unset": bson.M{backfillLeasedUntil: "", backfillFencingToken: ""}}
	}
	res, err := s.subscriptions.UpdateOne(ctx, fenced, update)
	if err != nil {
		return inserted, wrap("advance backfill cursor", err)
	}
	if res.MatchedCount == 0 {
		return inserted, pulsetype.ErrLeaseLost
	}
	return inserted, nil
}
