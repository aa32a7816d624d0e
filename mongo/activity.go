package mongo

import (
	"context"
	"errors"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// Activity returns the consumer group's last hour minute by minute at the store's clock (GET
// /v1/endpoints/{consumerGroup}/activity): the attempts ended in each of pulsetype.ActivityBuckets minutes,
// counted as GroupStats counts them, and its pending deliveries now. The group need not be registered: one
// without work reads zeros.
//
// Its cost is bounded by the hour, never by the history before it: one query of
// pulse_history_group_status_ended for the group's attempts ended since the window's start (status success
// or error, endedAt newest first, three fields each, at most pulsetype.ActivityScanLimit of them; more set
// TruncatedBefore), a count of the group's pending index keys and one key for the oldest
// (pulse_deliveries_group_status_created). Errors are the database's, wrapped.
func (s *Store) Activity(ctx context.Context, group string) (*pulsetype.GroupActivity, error) {
	now := s.now().UTC()
	from := pulsetype.ActivityWindow(now)
	out := &pulsetype.GroupActivity{ConsumerGroup: group, From: from, To: now,
		Buckets: make([]pulsetype.ActivityCount, pulsetype.ActivityBuckets)}
	ended, err := s.endedSince(ctx, "find the hour's attempts", bson.M{"consumerGroup": group}, from)
	if err != nil {
		return nil, err
	}
	for i := range ended {
		countEnded(out, &ended[i])
	}
	out.TruncatedBefore = truncatedAt(ended)
	if out.Pending, out.OldestPendingAt, err = s.pendingOf(ctx, group); err != nil {
		return nil, err
	}
	return out, nil
}

// pendingOf counts the group's pending deliveries and returns the createdAt (UTC) of the oldest (nil when
// none), with a count of index keys and one key of pulse_deliveries_group_status_created.
func (s *Store) pendingOf(ctx context.Context, group string) (int64, *time.Time, error) {
	pending := bson.M{"consumerGroup": group, "status": pulsetype.StatusPending}
	n, err := s.deliveries.CountDocuments(ctx, pending, options.Count().SetHint("pulse_deliveries_group_status_created"))
	if err != nil || n == 0 {
		return 0, nil, wrap("count pending deliveries", err)
	}
	var oldest deliveryDoc
	err = s.deliveries.FindOne(ctx, pending, options.FindOne().SetSort(bson.D{{Key: "createdAt", Value: 1}, {Key: "_id", Value: 1}}).
		SetProjection(bson.M{"createdAt": 1}).SetHint("pulse_deliveries_group_status_created")).Decode(&oldest)
	switch {
	case errors.Is(err, mongo.ErrNoDocuments): // ended meanwhile
		return n, nil, nil
	case err != nil:
		return 0, nil, wrap("find the oldest pending delivery", err)
	}
	at := oldest.CreatedAt.UTC()
	return n, &at, nil
}

// ActivityAll returns the last hour of every registered consumer group (GET /v1/activity), as Activity
// returns one group's, in consumer group order; a group without work reads zeros.
//
// Its cost is bounded by the hour and the number of groups, never by the history before it: one query of
// the attempts of every group ended since the window's start (status success or error, three fields and
// the group each, endedAt newest first, at most pulsetype.ActivityScanLimit in all: more set
// TruncatedBefore on every group), through pulse_history_group_status_ended, whose bounds on status and
// endedAt are seeked within each group's keys; then the pending counts (PendingByGroup) and the oldest
// pending deliveries (OldestPending), each bounded per group. Errors are the database's, wrapped.
func (s *Store) ActivityAll(ctx context.Context) ([]*pulsetype.GroupActivity, error) {
	now := s.now().UTC()
	from := pulsetype.ActivityWindow(now)
	groups, err := findAll[subscriptionDoc](ctx, s, s.subscriptions, "list consumer groups", bson.M{},
		options.Find().SetProjection(bson.M{"_id": 1}).SetSort(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		return nil, err
	}
	out := make([]*pulsetype.GroupActivity, len(groups))
	by := make(map[string]*pulsetype.GroupActivity, len(groups))
	for i, g := range groups {
		out[i] = &pulsetype.GroupActivity{ConsumerGroup: g.ID, From: from, To: now, Buckets: make([]pulsetype.ActivityCount, pulsetype.ActivityBuckets)}
		by[g.ID] = out[i]
	}
	if len(groups) == 0 {
		return out, nil
	}
	ended, err := s.endedSince(ctx, "find the hour's attempts of every group", bson.M{}, from)
	if err != nil {
		return nil, err
	}
	for i := range ended {
		if act := by[ended[i].ConsumerGroup]; act != nil {
			countEnded(act, &ended[i])
		}
	}
	if at := truncatedAt(ended); at != nil {
		for _, act := range out {
			act.TruncatedBefore = at
		}
	}
	pending, err := s.PendingByGroup(ctx)
	if err != nil {
		return nil, err
	}
	oldest, err := s.OldestPending(ctx)
	if err != nil {
		return nil, err
	}
	for _, act := range out {
		act.Pending = pending[act.ConsumerGroup]
		if at, ok := oldest[act.ConsumerGroup]; ok && act.Pending > 0 {
			act.OldestPendingAt = &at
		}
	}
	return out, nil
}

// endedSince returns the attempts that filter selects (and status success or error) ended since from, newest
// first, at most pulsetype.ActivityScanLimit of them, each with its group, status, endedAt and error code
// only, read through pulse_history_group_status_ended. Errors are the database's, wrapped.
func (s *Store) endedSince(ctx context.Context, what string, filter bson.M, from time.Time) ([]endedAttempt, error) {
	filter["status"] = bson.M{"$in": bson.A{pulsetype.StatusSuccess, pulsetype.StatusError}}
	filter["endedAt"] = bson.M{"$gte": from}
	return findAll[endedAttempt](ctx, s, s.history, what, filter,
		options.Find().SetSort(bson.D{{Key: "endedAt", Value: -1}}).SetLimit(pulsetype.ActivityScanLimit).
			SetProjection(bson.M{"consumerGroup": 1, "status": 1, "endedAt": 1, "error.code": 1}).SetHint("pulse_history_group_status_ended"))
}

// countEnded adds the ended attempt a to its minute of act, as GroupStats counts it: an attempt ended by
// a cancel, a delete or an unsubscribe counts for neither, and one ended after act.To by the database's
// clock (outside the window) for nothing: the next read counts it.
func countEnded(act *pulsetype.GroupActivity, a *endedAttempt) {
	i := int(a.EndedAt.Sub(act.From) / pulsetype.ActivityBucket)
	if i < 0 || i >= len(act.Buckets) || a.Error != nil && a.Error.Code.Ended() {
		return
	}
	switch a.Status {
	case pulsetype.StatusSuccess:
		act.Buckets[i].Succeeded++
	case pulsetype.StatusError:
		act.Buckets[i].Failed++
	}
}

// truncatedAt returns, when endedSince read its limit, the endedAt (UTC) of the oldest attempt it read:
// the counts before it go short. It returns nil otherwise.
func truncatedAt(ended []endedAttempt) *time.Time {
	if len(ended) < pulsetype.ActivityScanLimit {
		return nil
	}
	at := ended[len(ended)-1].EndedAt.UTC()
	return &at
}
