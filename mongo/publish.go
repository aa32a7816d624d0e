package mongo

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/google/uuid"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// deliveryNamespace makes delivery ids deterministic: UUIDv5 of (consumer group, event id). Two replicas
// fanning out the same event compute the same id, so their first attempts land on one delivery.
var deliveryNamespace = uuid.MustParse("6f1c3c1e-5b7a-4b5e-9a63-6d2f0b8c0a11")

// DeliveryID returns the id of the delivery of eventID to consumerGroup.
func DeliveryID(consumerGroup, eventID string) string {
	return uuid.NewSHA1(deliveryNamespace, []byte(consumerGroup+"\x00"+eventID)).String()
}

// Publish stores events, all or none, durable when it returns; each must carry its id. The database stamps
// createdAt in the write that makes an event visible (docs/delivery.md, "Publishing"); ExpiresAt is set here
// and the events carry fanout=true until FanOut created their deliveries. It returns pulsetype.ErrIDConflict
// when an id is already used with other content (nothing is stored then).
func (s *Store) Publish(ctx context.Context, events []*pulsetype.Event) ([]pulsetype.Published, error) {
	now := s.now()
	for _, e := range events {
		e.CreatedAt, e.ExpiresAt = now, expiry(now, s.opts.EventRetention)
	}
	if len(events) == 1 {
		e := events[0]
		var stored eventDoc
		doc := s.newEventDoc(e, false)
		// The filter never matches a stored event, so an existing id fails on the unique _id (duplicate key)
		// instead of being modified, and the idempotent path below reads it.
		err := s.events.FindOneAndUpdate(ctx, bson.M{"_id": e.ID, "createdAt": bson.M{"$exists": false}},
			bson.M{"$setOnInsert": doc.insertFields(), "$currentDate": bson.M{"createdAt": true}},
			options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.After)).Decode(&stored)
		if err == nil {
			e.CreatedAt = stored.CreatedAt.UTC()
			return []pulsetype.Published{{Event: e}}, nil
		}
		if !mongo.IsDuplicateKeyError(err) {
			return nil, wrap("insert event", err)
		}
	}
	// A concurrent publish of the same ids can make one try fail (a duplicate key on insert, or its staged
	// documents committed or cleaned up by the other): try again, reading what the other one stored.
	for try := 0; ; try++ {
		out, err := s.publishStaged(ctx, events)
		if !errors.Is(err, errPublishRace) || try == 3 {
			if errors.Is(err, errPublishRace) {
				err = fmt.Errorf("publish: concurrent publishes of the same ids kept colliding")
			}
			return out, err
		}
	}
}

// errPublishRace reports that a concurrent publish of the same ids interfered; Publish tries again.
var errPublishRace = errors.New("concurrent publish of the same ids")

// publishStaged stores events all-or-nothing: the new ones are inserted staged, then every one is committed
// with one update, then checked to be there and committed.
func (s *Store) publishStaged(ctx context.Context, events []*pulsetype.Event) ([]pulsetype.Published, error) {
	out := make([]pulsetype.Published, len(events))
	ids := make([]string, len(events))
	for i, e := range events {
		ids[i] = e.ID
		out[i].Event = e
	}
	existing, err := s.findEvents(ctx, ids)
	if err != nil {
		return nil, err
	}
	var fresh []any
	var commit []string
	for i, e := range events {
		ex, ok := existing[e.ID]
		if ok && expired(ex.ExpiresAt, s.now()) {
			// Gone for every reader; remove it so the id can be published again.
			if _, err := s.events.DeleteOne(ctx, bson.M{"_id": e.ID, "expiresAt": ex.ExpiresAt}); err != nil {
				return nil, wrap("remove expired event", err)
			}
			return nil, errPublishRace
		}
		if ok && !sameContent(ex, e) {
			return nil, pulsetype.ErrIDConflict
		}
		switch {
		case ok && ex.Staged: // staged by a concurrent publish, or one that crashed before its commit
			commit = append(commit, e.ID)
		case ok:
			out[i] = pulsetype.Published{Event: ex.event(), Existing: true}
		default:
			fresh = append(fresh, s.newEventDoc(e, true))
			commit = append(commit, e.ID)
		}
	}
	if len(fresh) > 0 {
		res, err := s.events.InsertMany(ctx, fresh)
		if err != nil {
			// Remove only what this call inserted: the rest may be another publish's staged events.
			if res != nil && len(res.InsertedIDs) > 0 {
				_, _ = s.events.DeleteMany(context.WithoutCancel(ctx), bson.M{"_id": bson.M{"$in": res.InsertedIDs}, "staged": true})
			}
			if mongo.IsDuplicateKeyError(err) {
				return nil, errPublishRace
			}
			return nil, wrap("insert events", err)
		}
	}
	if len(commit) == 0 {
		return out, nil
	}
	if _, err := s.events.UpdateMany(ctx, bson.M{"_id": bson.M{"$in": commit}, "staged": true},
		bson.M{"$unset": bson.M{"staged": ""}, "$set": bson.M{"fanout": true}, "$currentDate": bson.M{"createdAt": true}}); err != nil {
		return nil, wrap("commit events", err)
	}
	committed, err := findAll[eventDoc](ctx, s.events, "read back committed events",
		bson.M{"_id": bson.M{"$in": commit}, "staged": bson.M{"$ne": true}}, options.Find().SetProjection(bson.M{"createdAt": 1}))
	if err != nil {
		return nil, err
	}
	if len(committed) != len(commit) {
		return nil, errPublishRace // a concurrent publish removed staged documents before they were committed
	}
	stamps := make(map[string]time.Time, len(committed))
	for _, d := range committed {
		stamps[d.ID] = d.CreatedAt.UTC()
	}
	for _, p := range out {
		if t, ok := stamps[p.Event.ID]; ok && !p.Existing {
			p.Event.CreatedAt = t
		}
	}
	return out, nil
}

// insertFields are the fields of a new event's document but _id and createdAt (which the database stamps).
func (d *eventDoc) insertFields() bson.M {
	f := bson.M{"topic": d.Topic, "data": d.Data, "fanout": d.Fanout}
	if len(d.Headers) > 0 {
		f["headers"] = d.Headers
	}
	if d.OrderingKey != "" {
		f["orderingKey"] = d.OrderingKey
	}
	if d.TraceParent != "" {
		f["traceparent"] = d.TraceParent
	}
	if d.TraceState != "" {
		f["tracestate"] = d.TraceState
	}
	if d.ExpiresAt != nil {
		f["expiresAt"] = d.ExpiresAt
	}
	return f
}

func (s *Store) newEventDoc(e *pulsetype.Event, staged bool) *eventDoc {
	return &eventDoc{
		ID: e.ID, Topic: e.Topic, Data: string(e.Data), Headers: e.Headers, OrderingKey: e.OrderingKey, CreatedAt: e.CreatedAt,
		TraceParent: e.TraceParent, TraceState: e.TraceState,
		Fanout: !staged, Staged: staged, ExpiresAt: e.ExpiresAt,
	}
}

// sameContent reports whether a re-publish of a stored id carries the same event: the same topic, ordering
// key and headers, and data holding the same JSON value however it is spelled (pulsetype.SameJSON: member order,
// whitespace, escapes and number spelling do not matter).
func sameContent(d *eventDoc, e *pulsetype.Event) bool {
	return d.Topic == e.Topic && d.OrderingKey == e.OrderingKey && maps.Equal(d.Headers, e.Headers) &&
		(d.Data == string(e.Data) || pulsetype.SameJSON([]byte(d.Data), e.Data))
}

// findEvents returns every stored event with these ids (staged and expired ones included: Publish decides
// what they mean), by id.
func (s *Store) findEvents(ctx context.Context, ids []string) (map[string]*eventDoc, error) {
	docs, err := findAll[*eventDoc](ctx, s.events, "find events", bson.M{"_id": bson.M{"$in": ids}})
	if err != nil {
		return nil, err
	}
	out := make(map[string]*eventDoc, len(docs))
	for _, d := range docs {
		out[d.ID] = d
	}
	return out, nil
}

// GetEvent returns a visible, unexpired event, or pulsetype.ErrNotFound. It filters on _id alone, the one
// filter every FerretDB handler pushes down to its storage.
func (s *Store) GetEvent(ctx context.Context, id string) (*pulsetype.Event, error) {
	var d eventDoc
	err := s.events.FindOne(ctx, bson.M{"_id": id}).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) || (err == nil && (d.Staged || expired(d.ExpiresAt, s.now()))) {
		return nil, pulsetype.ErrNotFound
	}
	if err != nil {
		return nil, wrap("get event", err)
	}
	return d.event(), nil
}

// GetEvents returns the visible, unexpired events among ids, by id, with one query; missing ids are absent
// from the map.
func (s *Store) GetEvents(ctx context.Context, ids []string) (map[string]*pulsetype.Event, error) {
	docs, err := s.findEvents(ctx, ids)
	if err != nil {
		return nil, err
	}
	now := s.now()
	out := make(map[string]*pulsetype.Event, len(docs))
	for id, d := range docs {
		if !d.Staged && !expired(d.ExpiresAt, now) {
			out[id] = d.event()
		}
	}
	return out, nil
}

// FanOut creates, for each event, the delivery and its first attempt for every consumer group subscribed to
// the event's topic, with three commands per batch: one query for the subscriptions, one insertMany of
// deliveries, one of first attempts. It is idempotent: duplicate-key errors mean another replica (or an
// earlier try) already did it. It leaves the events' fanout mark for the caller to clear with ClearFanOut
// (a crash before that is repaired by FanOutStale). It returns the first attempts it inserted, unleased.
func (s *Store) FanOut(ctx context.Context, events []*pulsetype.Event) ([]*pulsetype.Attempt, error) {
	if len(events) == 0 {
		return nil, nil
	}
	topics := map[string]bool{}
	for _, e := range events {
		topics[e.Topic] = true
	}
	subs, err := s.subscriptionsFor(ctx, slices.Collect(maps.Keys(topics)))
	if err != nil {
		return nil, err
	}
	return s.insertDeliveries(ctx, events, subs)
}

// ClearFanOut removes the fanout mark of events whose deliveries exist, with one updateMany. Clearing late
// is harmless: FanOutStale only takes marks older than one lease timeout, and a repeated fan-out is a no-op.
func (s *Store) ClearFanOut(ctx context.Context, eventIDs []string) error {
	if len(eventIDs) == 0 {
		return nil
	}
	if _, err := s.events.UpdateMany(ctx, bson.M{"_id": bson.M{"$in": eventIDs}, "fanout": true}, bson.M{"$unset": bson.M{"fanout": ""}}); err != nil {
		return wrap("clear fanout mark", err)
	}
	return nil
}

// insertDeliveries creates the delivery and first attempt of each event for each subscription of its topic,
// with one insertMany per collection; duplicates (already created) are no-ops. It returns the first attempts
// it inserted.
func (s *Store) insertDeliveries(ctx context.Context, events []*pulsetype.Event, subs []subscriptionDoc) ([]*pulsetype.Attempt, error) {
	now := s.now()
	var deliveries, attempts []any
	for _, e := range events {
		for _, sub := range subs {
			if !slices.Contains(sub.Topics, e.Topic) {
				continue
			}
			if sub.OffsetReset != pulsetype.OffsetEarliest && e.CreatedAt.Before(sub.CreatedAt) {
				continue // offsetReset latest: the group registered after this event was published
			}
			d := &deliveryDoc{
				ID: DeliveryID(sub.ID, e.ID), EventID: e.ID, ConsumerGroup: sub.ID, Topic: e.Topic, OrderingKey: e.OrderingKey,
				Incarnation:    sub.Incarnation,
				EventCreatedAt: e.CreatedAt, Status: pulsetype.StatusPending, CreatedAt: now, UpdatedAt: now,
			}
			deliveries = append(deliveries, d)
			attempts = append(attempts, newAttemptDoc(d.delivery().Ref(), 1, now, now))
		}
	}
	if len(deliveries) == 0 {
		return nil, nil
	}
	unordered := options.InsertMany().SetOrdered(false)
	if _, err := s.deliveries.InsertMany(ctx, deliveries, unordered); err != nil && !onlyDuplicates(err) {
		return nil, wrap("insert deliveries", err)
	}
	_, err := s.history.InsertMany(ctx, attempts, unordered)
	if err != nil && !onlyDuplicates(err) {
		return nil, wrap("insert first attempts", err)
	}
	failed := map[int]bool{}
	var bwe mongo.BulkWriteException
	if errors.As(err, &bwe) {
		for _, we := range bwe.WriteErrors {
			failed[we.Index] = true
		}
	}
	out := make([]*pulsetype.Attempt, 0, len(attempts))
	for i, doc := range attempts {
		if !failed[i] {
			out = append(out, doc.(*attemptDoc).attempt())
		}
	}
	return out, nil
}

// FanOutStale runs FanOut for up to limit events still marked for fan-out and created more than age ago:
// events whose publisher died before fanning them out (docs/delivery.md, "Recovery after a crash"). It
// returns how many first attempts it inserted.
func (s *Store) FanOutStale(ctx context.Context, age time.Duration, limit int) (int, error) {
	cutoff := s.now().Add(-age)
	docs, err := findAll[*eventDoc](ctx, s.events, "find events to fan out", bson.M{"fanout": true, "createdAt": bson.M{"$lt": cutoff}},
		options.Find().SetSort(bson.D{{Key: "fanout", Value: 1}, {Key: "createdAt", Value: 1}}).SetLimit(int64(limit)))
	if err != nil {
		return 0, err
	}
	events := make([]*pulsetype.Event, len(docs))
	ids := make([]string, len(docs))
	for i, d := range docs {
		events[i], ids[i] = d.event(), d.ID
	}
	inserted, err := s.FanOut(ctx, events)
	if err != nil {
		return 0, err
	}
	return len(inserted), s.ClearFanOut(ctx, ids)
}

// onlyDuplicates reports whether err is a bulk write error made only of duplicate-key errors ("already
// done").
func onlyDuplicates(err error) bool {
	var bwe mongo.BulkWriteException
	if !errors.As(err, &bwe) || bwe.WriteConcernError != nil || len(bwe.WriteErrors) == 0 {
		return false
	}
	for _, we := range bwe.WriteErrors {
		if we.Code != 11000 && we.Code != 11001 && we.Code != 12582 {
			return false
		}
	}
	return true
}
