package mongo

import (
	"context"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// GetDelivery returns a delivery and its attempts in attempt order, each pending one with its lease state. It
// returns pulsetype.ErrNotFound when the delivery does not exist or has expired.
func (s *Store) GetDelivery(ctx context.Context, id string) (*pulsetype.Delivery, []*pulsetype.Attempt, error) {
	doc, err := s.deliveryDoc(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	byDelivery, err := s.AttemptsOf(ctx, []string{id})
	if err != nil {
		return nil, nil, err
	}
	attempts := byDelivery[id]
	now := s.now()
	for _, a := range attempts {
		a.LeaseState = a.LeaseStateAt(now)
	}
	return doc.delivery(), attempts, nil
}

// AttemptsOf returns the attempts of each delivery, in attempt order, keyed by delivery id (served by the
// unique index on deliveryId + attempt).
func (s *Store) AttemptsOf(ctx context.Context, deliveryIDs []string) (map[string][]*pulsetype.Attempt, error) {
	docs, err := findAll[attemptDoc](ctx, s, s.history, "find attempts", bson.M{"deliveryId": bson.M{"$in": deliveryIDs}},
		options.Find().SetSort(bson.D{{Key: "deliveryId", Value: 1}, {Key: "attempt", Value: 1}}))
	if err != nil {
		return nil, err
	}
	out := make(map[string][]*pulsetype.Attempt, len(deliveryIDs))
	for i := range docs {
		out[docs[i].DeliveryID] = append(out[docs[i].DeliveryID], docs[i].attempt())
	}
	return out, nil
}

// DeliveriesOfEvent returns the unexpired deliveries of an event, by consumer group.
func (s *Store) DeliveriesOfEvent(ctx context.Context, eventID string) ([]*pulsetype.Delivery, error) {
	cur, err := s.find(ctx, s.deliveries, bson.M{"eventId": eventID},
		options.Find().SetSort(bson.D{{Key: "consumerGroup", Value: 1}}))
	if err != nil {
		return nil, wrap("find deliveries", err)
	}
	return s.decodeDeliveries(ctx, cur)
}

func (s *Store) decodeDeliveries(ctx context.Context, cur *mongo.Cursor) ([]*pulsetype.Delivery, error) {
	var docs []deliveryDoc
	if err := cur.All(ctx, &docs); err != nil {
		return nil, wrap("decode deliveries", err)
	}
	now := s.now()
	out := make([]*pulsetype.Delivery, 0, len(docs))
	for i := range docs {
		if !expired(docs[i].ExpiresAt, now) {
			out = append(out, docs[i].delivery())
		}
	}
	return out, nil
}

func expired(at *time.Time, now time.Time) bool { return at != nil && !at.After(now) }

// PendingByGroup counts pending deliveries by consumer group, for /metrics (every PendingCountMaxAge on
// each replica that is scraped). On MongoDB it reads the registered groups (ids only) and counts each
// group's pending deliveries with a count hinted to pulse_deliveries_group_status_created, whose leading
// keys are the count's equalities: the server counts index keys and fetches no delivery. A group that is no
// longer registered is not counted there (its pending deliveries are being ended: DeleteEndpoint, the
// repair scan). A server that scans its collections (Capabilities.ScansFilters: FerretDB) would read the
// deliveries once per group; there one aggregation counts every group's in one read, and a group with
// pending deliveries that is no longer registered is counted too. A registered group with nothing pending
// reads 0.
func (s *Store) PendingByGroup(ctx context.Context) (map[string]int64, error) {
	groups, err := findAll[subscriptionDoc](ctx, s, s.subscriptions, "list consumer groups", bson.M{}, options.Find().SetProjection(bson.M{"_id": 1}))
	if err != nil {
		return nil, err
	}
	out := make(map[string]int64, len(groups))
	if !s.caps.ScansFilters {
		for _, g := range groups {
			n, err := s.deliveries.CountDocuments(ctx, bson.M{"consumerGroup": g.ID, "status": pulsetype.StatusPending},
				options.Count().SetHint("pulse_deliveries_group_status_created"))
			if err != nil {
				return nil, wrap("count pending deliveries", err)
			}
			out[g.ID] = n
		}
		return out, nil
	}
	cur, err := s.aggregate(ctx, s.deliveries, mongo.Pipeline{
		{{Key: "$match", Value: bson.M{"status": pulsetype.StatusPending}}},
		{{Key: "$group", Value: bson.M{"_id": "$consumerGroup", "n": bson.M{"$sum": 1}}}},
	}, "")
	if err != nil {
		return nil, wrap("count pending deliveries", err)
	}
	var rows []struct {
		Group string `bson:"_id"`
		N     int64  `bson:"n"`
	}
	if err := cur.All(ctx, &rows); err != nil {
		return nil, wrap("count pending deliveries", err)
	}
	for _, r := range rows {
		out[r.Group] = r.N
	}
	for _, g := range groups {
		out[g.ID] += 0 // a registered group with nothing pending reads 0
	}
	return out, nil
}
