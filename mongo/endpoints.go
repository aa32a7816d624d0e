package mongo

import (
	"context"
	"errors"
	"slices"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// PutEndpoint creates or replaces the endpoint of e.ConsumerGroup (e must be normalized) and returns it as
// stored. created is true when the consumer group was new. Concurrent registrations of one group by several
// replicas leave one subscription document (its _id is the group).
func (s *Store) PutEndpoint(ctx context.Context, e *pulsetype.Endpoint) (stored *pulsetype.Endpoint, created bool, err error) {
	now := s.now()
	set := bson.M{
		"url": e.URL, "topics": e.Topics, "delivery": e.Delivery, "ordered": e.Ordered,
		"offsetReset": e.OffsetReset, "maxRetries": *e.MaxRetries, "retryDelayMs": ms(e.RetryDelay),
		"retryBackoffMultiplier": *e.RetryBackoffMultiplier, "maxRetryDelayMs": ms(e.MaxRetryDelay),
		"timeoutMs": ms(e.Timeout), "maxConcurrency": *e.MaxConcurrency, "headers": e.Headers,
		"secret": e.Secret, "insecureSkipVerify": e.InsecureSkipVerify, "updatedAt": now,
	}
	setOnInsert := bson.M{"createdAt": now}
	if e.OffsetReset == pulsetype.OffsetEarliest {
		// A new earliest-offset group receives every retained event: the backfill walks them once. An existing
		// group that adds topics walks again (deliveries that exist already are duplicate-key no-ops).
		prev, err := s.GetEndpoint(ctx, e.ConsumerGroup)
		switch {
		case errors.Is(err, pulsetype.ErrNotFound):
			setOnInsert["backfill"] = backfillState{}
		case err != nil:
			return nil, false, err
		case addsTopics(prev.Topics, e.Topics):
			set["backfill"] = backfillState{}
		}
	}
	update := bson.M{"$set": set, "$setOnInsert": setOnInsert}
	for try := 0; ; try++ {
		res, err := s.subscriptions.UpdateOne(ctx, bson.M{"_id": e.ConsumerGroup}, update, options.UpdateOne().SetUpsert(true))
		if mongo.IsDuplicateKeyError(err) && try < 3 {
			continue // two upserts raced on a new _id: the loser retries as an update
		}
		if err != nil {
			return nil, false, wrap("put endpoint", err)
		}
		stored, err := s.GetEndpoint(ctx, e.ConsumerGroup)
		return stored, res.UpsertedCount > 0, err
	}
}

// GetEndpoint returns the endpoint of a consumer group, or pulsetype.ErrNotFound.
func (s *Store) GetEndpoint(ctx context.Context, group string) (*pulsetype.Endpoint, error) {
	var doc subscriptionDoc
	err := s.subscriptions.FindOne(ctx, bson.M{"_id": group}).Decode(&doc)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil, pulsetype.ErrNotFound
	}
	if err != nil {
		return nil, wrap("get endpoint", err)
	}
	return doc.endpoint(), nil
}

// ListEndpoints returns every endpoint, ordered by consumer group.
func (s *Store) ListEndpoints(ctx context.Context) ([]*pulsetype.Endpoint, error) {
	docs, err := findAll[subscriptionDoc](ctx, s.subscriptions, "list endpoints", bson.M{}, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		return nil, err
	}
	out := make([]*pulsetype.Endpoint, len(docs))
	for i := range docs {
		out[i] = docs[i].endpoint()
	}
	return out, nil
}

// DeleteEndpoint removes a consumer group's endpoint; pending deliveries of the group end with an error when
// they come up. It returns pulsetype.ErrNotFound when the group has no endpoint.
func (s *Store) DeleteEndpoint(ctx context.Context, group string) error {
	res, err := s.subscriptions.DeleteOne(ctx, bson.M{"_id": group})
	if err != nil {
		return wrap("delete endpoint", err)
	}
	if res.DeletedCount == 0 {
		return pulsetype.ErrNotFound
	}
	return nil
}

func (s *Store) subscriptionsFor(ctx context.Context, topics []string) ([]subscriptionDoc, error) {
	return findAll[subscriptionDoc](ctx, s.subscriptions, "find subscriptions", bson.M{"topics": bson.M{"$in": topics}},
		options.Find().SetProjection(bson.M{"_id": 1, "topics": 1, "offsetReset": 1, "createdAt": 1}))
}

func addsTopics(old, new []string) bool {
	for _, t := range new {
		if !slices.Contains(old, t) {
			return true
		}
	}
	return false
}
