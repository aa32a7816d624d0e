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

// OldestPending returns, for each registered consumer group with a pending delivery, the createdAt of its
// oldest one (UTC); a group with nothing pending is absent. Its cost is bounded whatever the backlog: one
// query of the registered groups (ids only), then per group one indexed query that reads one key of
// pulse_deliveries_group_status_created (sorted by createdAt, limit 1), never the pending deliveries
// themselves. A server that evaluates filters by scanning (Capabilities.ScansFilters: FerretDB) would scan
// the deliveries once per group; there one query reads the pending deliveries' group and createdAt (as
// Stats does there), one scan whatever the number of groups. /metrics
// serves it as pulse_oldest_pending_delivery_age_seconds, opsevents.BacklogWatcher for pulse.backlog.high.
func (s *Store) OldestPending(ctx context.Context) (map[string]time.Time, error) {
	groups, err := findAll[subscriptionDoc](ctx, s, s.subscriptions, "list consumer groups", bson.M{}, options.Find().SetProjection(bson.M{"_id": 1}))
	if err != nil {
		return nil, err
	}
	out := make(map[string]time.Time, len(groups))
	if s.caps.ScansFilters {
		return s.oldestPendingByScan(ctx, groups, out)
	}
	for _, g := range groups {
		var oldest deliveryDoc
		err := s.deliveries.FindOne(ctx, bson.M{"consumerGroup": g.ID, "status": pulsetype.StatusPending},
			options.FindOne().SetSort(bson.D{{Key: "createdAt", Value: 1}, {Key: "_id", Value: 1}}).
				SetProjection(bson.M{"createdAt": 1}).SetHint("pulse_deliveries_group_status_created")).Decode(&oldest)
		switch {
		case errors.Is(err, mongo.ErrNoDocuments):
		case err != nil:
			return nil, wrap("find the oldest pending delivery", err)
		default:
			out[g.ID] = oldest.CreatedAt.UTC()
		}
	}
	return out, nil
}

// oldestPendingByScan fills out with the oldest pending createdAt of each of groups from one query of the
// pending deliveries (consumer group and createdAt only): the one scan a per-group query would repeat per
// group. FerretDB has neither $min nor $first in $group, so the minimum is taken here.
func (s *Store) oldestPendingByScan(ctx context.Context, groups []subscriptionDoc, out map[string]time.Time) (map[string]time.Time, error) {
	pending, err := findAll[deliveryDoc](ctx, s, s.deliveries, "scan pending deliveries", bson.M{"status": pulsetype.StatusPending},
		options.Find().SetProjection(bson.M{"consumerGroup": 1, "createdAt": 1}))
	if err != nil {
		return nil, err
	}
	registered := make(map[string]bool, len(groups))
	for _, g := range groups {
		registered[g.ID] = true
	}
	for _, d := range pending {
		if at, seen := out[d.ConsumerGroup]; registered[d.ConsumerGroup] && (!seen || d.CreatedAt.Before(at)) {
			out[d.ConsumerGroup] = d.CreatedAt.UTC()
		}
	}
	return out, nil
}

// SetBacklogHigh records whether pulse.backlog.high is raised for the consumer group, with one conditional
// update: it reports whether this call changed it, so that of several replicas that see the same backlog
// only the one whose write flipped the state publishes the event. It returns false, nil for a group
// without endpoint.
func (s *Store) SetBacklogHigh(ctx context.Context, group string, high bool) (bool, error) {
	filter, update := bson.M{"_id": group, "backlogHigh": bson.M{"$ne": true}}, bson.M{"$set": bson.M{"backlogHigh": true}}
	if !high {
		filter, update = bson.M{"_id": group, "backlogHigh": true}, bson.M{"$unset": bson.M{"backlogHigh": ""}}
	}
	res, err := s.subscriptions.UpdateOne(ctx, filter, update)
	if err != nil {
		return false, wrap("set backlog high", err)
	}
	return res.ModifiedCount == 1, nil
}
