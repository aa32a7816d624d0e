package mongo

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// ListDeliveries returns one page of deliveries, newest first (createdAt, then id, descending), and the
// cursor of the next page ("" on the last). Served by pulse_deliveries_created,
// pulse_deliveries_group_created or, with a group and a status, pulse_deliveries_group_status_created.
func (s *Store) ListDeliveries(ctx context.Context, f pulsetype.DeliveryFilter) ([]*pulsetype.Delivery, string, error) {
	filter := bson.M{}
	if f.ConsumerGroup != "" {
		filter["consumerGroup"] = f.ConsumerGroup
	}
	if f.Topic != "" {
		filter["topic"] = f.Topic
	}
	if f.Status != "" {
		filter["status"] = f.Status
	}
	if f.After != "" {
		at, id, err := decodeCursor(f.After)
		if err != nil {
			return nil, "", err
		}
		filter["$or"] = bson.A{bson.M{"createdAt": bson.M{"$lt": at}}, bson.M{"createdAt": at, "_id": bson.M{"$lt": id}}}
	}
	hint := "pulse_deliveries_created"
	switch {
	case f.ConsumerGroup != "" && f.Status != "":
		hint = "pulse_deliveries_group_status_created"
	case f.ConsumerGroup != "":
		hint = "pulse_deliveries_group_created"
	}
	cur, err := s.find(ctx, s.deliveries, filter, options.Find().
		SetSort(bson.D{{Key: "createdAt", Value: -1}, {Key: "_id", Value: -1}}).SetLimit(int64(f.Limit+1)).SetHint(hint))
	if err != nil {
		return nil, "", wrap("list deliveries", err)
	}
	out, err := s.decodeDeliveries(ctx, cur)
	if err != nil {
		return nil, "", err
	}
	next := ""
	if len(out) > f.Limit {
		out = out[:f.Limit]
		last := out[len(out)-1]
		next = base64.RawURLEncoding.EncodeToString([]byte(fmt.Sprintf("%d|%s", last.CreatedAt.UnixMilli(), last.ID)))
	}
	return out, next, nil
}

func decodeCursor(c string) (time.Time, string, error) {
	raw, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return time.Time{}, "", pulsetype.ErrBadCursor
	}
	ms, id, ok := strings.Cut(string(raw), "|")
	var n int64
	if _, err := fmt.Sscan(ms, &n); !ok || err != nil {
		return time.Time{}, "", pulsetype.ErrBadCursor
	}
	return time.UnixMilli(n).UTC(), id, nil
}

// RetryDelivery reopens a terminal delivery with attempt n+1, due now, for the group's current registration
// (docs/delivery.md, "Retry and replay"). It returns the new attempt number, pulsetype.ErrNotFound (also
// once the delivery expired), pulsetype.ErrNotTerminal, pulsetype.ErrNotSubscribed when the group no longer
// takes the delivery's event (its endpoint is gone, its topics do not match the event's topic, or its
// filter does not hold for the event: pulsetype.Endpoint.Selects), or pulsetype.ErrAttemptInFlight when a cancelled delivery's attempt is still leased.
func (s *Store) RetryDelivery(ctx context.Context, id string) (int, error) {
	return s.reopen(ctx, id, nil)
}

// reopen is RetryDelivery; ep is the delivery's consumer group's endpoint when the caller read it already.
func (s *Store) reopen(ctx context.Context, id string, ep *pulsetype.Endpoint) (int, error) {
	d, attempts, err := s.GetDelivery(ctx, id)
	if err != nil {
		return 0, err
	}
	if d.Status == pulsetype.StatusPending {
		return 0, pulsetype.ErrNotTerminal
	}
	// A cancelled delivery's attempt may still be in flight: its result is recorded first (a reopen now would
	// let that result end the reopened delivery).
	if slices.ContainsFunc(attempts, func(a *pulsetype.Attempt) bool { return a.Status == pulsetype.StatusPending }) {
		return 0, pulsetype.ErrAttemptInFlight
	}
	if ep == nil {
		if ep, err = s.GetEndpoint(ctx, d.ConsumerGroup); errors.Is(err, pulsetype.ErrNotFound) {
			return 0, pulsetype.ErrNotSubscribed
		} else if err != nil {
			return 0, err
		}
	}
	if !ep.Subscribes(d.Topic) {
		return 0, pulsetype.ErrNotSubscribed
	}
	if ep.Filter != "" { // the whole current rule, as a fan-out would apply it now (Endpoint.Selects)
		ev, err := s.GetEvent(ctx, d.EventID)
		switch {
		case errors.Is(err, pulsetype.ErrNotFound): // expired: its attempt ends event_expired, as without a filter
		case err != nil:
			return 0, err
		case !ep.Selects(pulsetype.InputOf(ev)):
			return 0, pulsetype.ErrNotSubscribed
		}
	}
	// The next number follows the delivery's own record too: its ended attempts expire a little before it
	// (each one's expiresAt is its own end + history retention), so they may be swept while it is still there.
	next := max(d.FinalAttempt, d.ReopenedAttempt) + 1
	if len(attempts) > 0 {
		next = max(next, attempts[len(attempts)-1].Number+1)
	}
	now := s.now()
	d.Incarnation = ep.Incarnation
	// Queued first, so that the reopened delivery is never missing from the queue: a crash after the reopen
	// leaves the queue document, from which the repair scan inserts the attempt.
	a := newAttemptDoc(d.Ref(), next, now, now)
	if _, err := s.queue.InsertOne(ctx, queued(a, d.OrderingKey, d.EventCreatedAt)); err != nil {
		return 0, wrap("queue the reopened attempt", err)
	}
	res, err := s.deliveries.UpdateOne(ctx, bson.M{"_id": id, "status": d.Status},
		bson.M{"$set": bson.M{"status": pulsetype.StatusPending, "updatedAt": now, "reopenedAttempt": next, "incarnation": ep.Incarnation},
			"$unset": bson.M{"endedAt": "", "expiresAt": "", "error": "", "finalAttempt": ""}})
	if err != nil || res.ModifiedCount == 0 {
		if _, derr := s.queue.DeleteOne(context.WithoutCancel(ctx), bson.M{"_id": a.ID}); derr != nil && err == nil {
			err = derr
		}
		if err != nil {
			return 0, wrap("reopen delivery", err)
		}
		return 0, pulsetype.ErrNotTerminal // reopened concurrently
	}
	_, err = s.history.InsertOne(ctx, a)
	if mongo.IsDuplicateKeyError(err) { // its number was taken (a cancel racing the retry): not ours to run
		_, err = s.queue.DeleteOne(ctx, bson.M{"_id": a.ID})
	}
	if err != nil {
		return 0, wrap("create attempt", err)
	}
	return next, nil
}

// ReplayDeliveries re-opens (as RetryDelivery) every terminal delivery of p.ConsumerGroup in p.Status whose
// createdAt lies in [p.From, p.To) and whose event the group's current rule takes (its topics, patterns and
// filter: pulsetype.Endpoint.Selects; the others are skipped), walking them once in id order in
// batches of 100, and returns how many it reopened (a cancelled delivery whose attempt is still in flight is
// skipped). It returns pulsetype.ErrNotFound when the group has no endpoint.
func (s *Store) ReplayDeliveries(ctx context.Context, p pulsetype.ReplayParams) (int, error) {
	ep, err := s.GetEndpoint(ctx, p.ConsumerGroup)
	if err != nil {
		return 0, err
	}
	total, after := 0, ""
	for {
		filter := bson.M{"consumerGroup": p.ConsumerGroup, "status": p.Status, "createdAt": bson.M{"$gte": p.From, "$lt": p.To},
			"_id": bson.M{"$gt": after}, "$or": bson.A{bson.M{"expiresAt": nil}, bson.M{"expiresAt": bson.M{"$gt": s.now()}}}}
		batch, err := findAll[deliveryDoc](ctx, s, s.deliveries, "find deliveries to replay", filter,
			options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}).SetLimit(100).SetProjection(bson.M{"_id": 1}))
		if err != nil {
			return total, err
		}
		for _, d := range batch {
			_, err := s.reopen(ctx, d.ID, ep)
			switch {
			case err == nil:
				total++
			case !errors.Is(err, pulsetype.ErrNotTerminal) && !errors.Is(err, pulsetype.ErrNotFound) &&
				!errors.Is(err, pulsetype.ErrNotSubscribed) && !errors.Is(err, pulsetype.ErrAttemptInFlight):
				return total, err
			}
		}
		if len(batch) < 100 {
			return total, nil
		}
		after = batch[len(batch)-1].ID
	}
}
