package mongo

import (
	"context"
	"errors"
	"slices"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// Ordered lines: the head of a (consumer group, topic, ordering key) line is claimed only when no earlier
// event of the line can still appear (docs/delivery.md, "Ordered lines").

// OrderSettle is how long after its createdAt an event may be POSTed at the head of an ordered consumer
// group. createdAt is stamped by the database inside the write that makes the event visible (see
// Publish), so an event with an earlier createdAt can become visible later only while such a write is
// still running on the server; OrderSettle bounds that, and the error of this process's estimate of the
// database clock, with a wide margin.
const OrderSettle = 100 * time.Millisecond

// maxOrderCheck bounds how many unfinished fan-outs one head-of-line check examines.
const maxOrderCheck = 100

// ClaimHead leases the head attempt of an ordered consumer group's line (docs/delivery.md, "Ordered
// lines"): the current attempt of the line's oldest pending delivery, when it is unleased and due, its group
// is active, and no earlier event of the line can still appear. It returns nil when the head is running,
// waiting, blocked or absent; wait > 0 says when to look again without other news. The line is read from
// the queue, which holds pending work only: one query of the line's first queue documents (index
// pulse_queue_line), one read of their deliveries, one of the subscription, one of the head's attempt by id
// and, when the head is due, those of earlierMayAppear; errors are the database's, wrapped.
func (s *Store) ClaimHead(ctx context.Context, owner string, line pulsetype.Line) (a *pulsetype.Attempt, wait time.Duration, err error) {
	head, q, passed, err := s.lineHead(ctx, line)
	if head == nil || err != nil {
		return nil, 0, err
	}
	var sub subscriptionDoc
	err = s.subscriptions.FindOne(ctx, bson.M{"_id": line.ConsumerGroup},
		options.FindOne().SetProjection(bson.M{"backfill": 1, "topics": 1, "filter": 1, "offsetReset": 1, "createdAt": 1, "incarnation": 1, "state": 1})).Decode(&sub)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil, 0, nil // deleted: its pending deliveries are being ended
	}
	if err != nil {
		return nil, 0, wrap("read subscription", err)
	}
	var at attemptDoc
	err = s.history.FindOne(ctx, bson.M{"_id": q.ID}).Decode(&at)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil, 0, nil // being created; the repair scan creates it after a crash
	}
	if err != nil {
		return nil, 0, wrap("find head attempt", err)
	}
	if head.Incarnation != sub.Incarnation {
		// A delivery of an earlier registration of the group (deleted and registered again while its POST
		// ran): it must not hold up the new registration's line, whenever its retry would come due.
		return nil, time.Millisecond, s.endStaleHead(ctx, head, &at)
	}
	if sub.State != "" && sub.State != pulsetype.EndpointActive {
		return nil, 0, nil // paused or disabled: the line waits for resume
	}
	if settled := head.EventCreatedAt.Add(OrderSettle); s.now().Before(settled) {
		return nil, settled.Sub(s.now()), nil
	}
	now := s.now()
	if at.Status == pulsetype.StatusPending && leaseCopyStale(q, &at) {
		// Leased without its copy in the queue (its claimer died between the two writes): copied now, so
		// that the reaper finds the lease once it expires and the line moves on.
		if err := s.hintQueue(ctx, []*attemptDoc{&at}); err != nil {
			return nil, 0, err
		}
	}
	if at.Status != pulsetype.StatusPending || at.LeasedUntil != nil || at.NextAttemptAt.After(now) {
		return nil, 0, nil
	}
	if blocked, err := s.earlierMayAppear(ctx, line, &sub, head); err != nil || blocked {
		return nil, 0, err
	}
	// An earlier event's fan-out may have finished between the line's read and earlierMayAppear's (the repair
	// of an interrupted fan-out: its queue documents written, then its outbox document removed): its queue
	// document, written first, is found by one more read of the line.
	if earlier, err := s.queuedBefore(ctx, line, head, passed); err != nil || earlier {
		return nil, time.Millisecond, err
	}
	a, err = s.claimByID(ctx, owner, at.ID) // the lease runs from now, after the checks' round trips
	return a, 0, err
}

// queuedBefore reports whether the line's queue holds a document of an event before head's (by the event's
// createdAt, then id) other than passed (the ids of those lineHead passed over: of ended deliveries), with one
// query of the line's first queue documents.
func (s *Store) queuedBefore(ctx context.Context, line pulsetype.Line, head *deliveryDoc, passed []string) (bool, error) {
	filter := lineFilter(line)
	filter["eventCreatedAt"] = bson.M{"$lte": head.EventCreatedAt}
	queued, err := findAll[queueDoc](ctx, s.queue, "read the head of line again", filter,
		options.Find().SetSort(lineOrder).SetLimit(int64(len(passed)+1)).SetProjection(bson.M{"eventCreatedAt": 1, "eventId": 1}))
	if err != nil {
		return false, err
	}
	for _, q := range queued {
		before := q.EventCreatedAt.Before(head.EventCreatedAt) || q.EventCreatedAt.Equal(head.EventCreatedAt) && q.EventID < head.EventID
		if before && !slices.Contains(passed, q.ID) {
			return true, nil
		}
	}
	return false, nil
}

// lineFilter selects the queue documents of line.
func lineFilter(line pulsetype.Line) bson.M {
	return bson.M{"consumerGroup": line.ConsumerGroup, "topic": line.Topic, "orderingKey": keyFilter(line.OrderingKey)}
}

// lineOrder is the order of a line's queue documents (index pulse_queue_line): by the event's createdAt, then
// its id, the latest attempt of each first.
var lineOrder = bson.D{{Key: "consumerGroup", Value: 1}, {Key: "topic", Value: 1}, {Key: "orderingKey", Value: 1},
	{Key: "eventCreatedAt", Value: 1}, {Key: "eventId", Value: 1}, {Key: "attempt", Value: -1}}

// lineScan bounds the queue documents one look at a line's head reads: deliveries that ended while their
// queue documents wait to be removed come before the pending head.
const lineScan = 8

// lineHead returns the line's oldest pending delivery, the queue document of its latest attempt and the ids
// of the queue documents before it (of ended deliveries), or nil when the line has none among its first
// lineScan queue documents. It removes the queue documents it finds of ended deliveries whose attempts have
// ended (normally removed by the writer that ended them).
func (s *Store) lineHead(ctx context.Context, line pulsetype.Line) (*deliveryDoc, *queueDoc, []string, error) {
	head, q, ended, err := s.readLineHead(ctx, line)
	if err != nil {
		return nil, nil, nil, err
	}
	return head, q, ended, s.unqueueEnded(ctx, ended)
}

// LineHead returns the id of the line's oldest pending delivery, the one its ordered consumer group POSTs
// next (docs/delivery.md, "Ordered lines"), or "" when the line's first lineScan queue documents hold none.
// It only reads: one query of pulse_queue_line and one read of those documents' deliveries by id. The
// inspection API tells with it a delivery behind the head of its line.
func (s *Store) LineHead(ctx context.Context, line pulsetype.Line) (string, error) {
	head, _, _, err := s.readLineHead(ctx, line)
	if head == nil || err != nil {
		return "", err
	}
	return head.ID, nil
}

// readLineHead is lineHead without its removals.
func (s *Store) readLineHead(ctx context.Context, line pulsetype.Line) (*deliveryDoc, *queueDoc, []string, error) {
	queued, err := findAll[queueDoc](ctx, s.queue, "find head of line", lineFilter(line),
		options.Find().SetSort(lineOrder).SetLimit(lineScan))
	if err != nil || len(queued) == 0 {
		return nil, nil, nil, err
	}
	ids := make([]string, 0, len(queued))
	for _, q := range queued {
		if !slices.Contains(ids, q.DeliveryID) {
			ids = append(ids, q.DeliveryID)
		}
	}
	deliveries, err := findAll[deliveryDoc](ctx, s.deliveries, "read deliveries of a line", bson.M{"_id": bson.M{"$in": ids}})
	if err != nil {
		return nil, nil, nil, err
	}
	byID := map[string]*deliveryDoc{}
	for i := range deliveries {
		byID[deliveries[i].ID] = &deliveries[i]
	}
	var ended []string
	for i := range queued {
		q := &queued[i]
		d, ok := byID[q.DeliveryID]
		switch {
		case !ok:
			return nil, nil, nil, nil // its fan-out is under way (queued before written): wait for it
		case d.Status == pulsetype.StatusPending:
			return d, q, ended, nil // every document before it is of an ended delivery
		default:
			ended = append(ended, q.ID)
		}
	}
	return nil, nil, ended, nil
}

// unqueueEnded removes the queue documents ids (of deliveries that ended) whose attempts are not pending: one
// that is (the attempt of a cancelled delivery still in flight) stays queued for the reaper.
func (s *Store) unqueueEnded(ctx context.Context, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	running, err := findAll[attemptDoc](ctx, s.history, "find running attempts of ended deliveries",
		bson.M{"_id": bson.M{"$in": ids}, "status": pulsetype.StatusPending}, options.Find().SetProjection(bson.M{"_id": 1}))
	if err != nil {
		return err
	}
	ids = slices.DeleteFunc(ids, func(id string) bool {
		return slices.ContainsFunc(running, func(a attemptDoc) bool { return a.ID == id })
	})
	if len(ids) == 0 {
		return nil
	}
	if _, err := s.deleteMany(ctx, s.queue, bson.M{"_id": bson.M{"$in": ids}}); err != nil {
		return wrap("remove queue documents of ended deliveries", err)
	}
	return nil
}

// MaxLineKeys bounds the ordering keys OrderingKeys returns for one (consumer group, topic).
const MaxLineKeys = 1000

// OrderingKeys returns the ordering keys of the pending deliveries of a consumer group's topic, "" (the
// events without a key) first and always present, then the others in ascending order, at most MaxLineKeys of
// them (an arbitrary subset when there are more: the rest wait for a later turn); the
// dispatcher claims the head of each of these lines. It costs one aggregation of the queue ($match on index
// pulse_queue_line, then $group by key); errors are the database's, wrapped.
func (s *Store) OrderingKeys(ctx context.Context, group, topic string) ([]string, error) {
	cur, err := s.queue.Aggregate(ctx, bson.A{
		bson.M{"$match": bson.M{"consumerGroup": group, "topic": topic}},
		bson.M{"$group": bson.M{"_id": "$orderingKey"}},
		bson.M{"$limit": MaxLineKeys + 1},
	})
	if err != nil {
		return nil, wrap("list ordering keys", err)
	}
	var rows []struct {
		Key *string `bson:"_id"`
	}
	if err := cur.All(ctx, &rows); err != nil {
		return nil, wrap("list ordering keys", err)
	}
	out := []string{""}
	for _, r := range rows {
		if r.Key != nil && *r.Key != "" {
			out = append(out, *r.Key)
		}
	}
	slices.Sort(out[1:])
	return out[:min(len(out), MaxLineKeys+1)], nil
}

// endStaleHead ends a pending delivery that belongs to an earlier registration of its group, and its current
// attempt unless a worker holds its lease (that worker ends the delivery when its POST returns): error
// endpoint_deleted, with endedAt and expiresAt.
func (s *Store) endStaleHead(ctx context.Context, d *deliveryDoc, at *attemptDoc) error {
	now := s.now()
	info := &pulsetype.ErrorInfo{Code: pulsetype.CodeEndpointDeleted, Message: "the consumer group " + d.ConsumerGroup +
		" was deleted and registered again; this delivery belongs to the earlier registration"}
	if at.Status == pulsetype.StatusPending {
		res, err := s.history.UpdateOne(ctx, unleased(at.ID),
			bson.M{"$set": s.outcomeSet(pulsetype.AttemptResult{Status: pulsetype.StatusError, Terminal: true, Error: info}, now)})
		if err != nil {
			return wrap("end attempt of an earlier registration", err)
		}
		if res.MatchedCount == 0 {
			return nil // leased meanwhile: its worker ends the delivery
		}
	}
	_, err := s.EndDelivery(ctx, pulsetype.EndDeliveryParams{DeliveryID: d.ID, Status: pulsetype.StatusError, FinalAttempt: at.Attempt, Error: info})
	return err
}

// keyFilter matches an ordering key in a query: the key itself, or for "" documents without one (a null
// equality, which an index on orderingKey serves).
func keyFilter(key string) any {
	if key == "" {
		return nil
	}
	return key
}

// earlierMayAppear reports whether an event of the line (topic and ordering key) before the head delivery's
// event (createdAt, then id) that the group of sub will receive may still lack its delivery: the group's
// backfill is unfinished, or an earlier event of the line still marked for fan-out has no delivery for the
// group (see ClaimHead). It costs one query of the line's unfinished fan-outs (the outbox, index
// pulse_outbox_line) and, when there are some, one read of their events and one of the group's deliveries of
// them, both by id. An outbox document whose event is not committed yet counts for nothing: its commit
// stamps a createdAt later than this check.
func (s *Store) earlierMayAppear(ctx context.Context, line pulsetype.Line, sub *subscriptionDoc, head *deliveryDoc) (bool, error) {
	if sub.Backfill != nil {
		return true, nil
	}
	marks, err := findAll[outboxDoc](ctx, s.outbox, "find earlier unfinished fan-outs",
		bson.M{"topic": line.Topic, "orderingKey": keyFilter(line.OrderingKey)},
		options.Find().SetSort(bson.D{{Key: "topic", Value: 1}, {Key: "orderingKey", Value: 1}, {Key: "createdAt", Value: 1}}).SetLimit(maxOrderCheck))
	if err != nil || len(marks) == 0 {
		return false, err
	}
	ids := idsOf(marks, func(m outboxDoc) string { return m.ID })
	events, err := s.findEvents(ctx, ids)
	if err != nil {
		return false, err
	}
	var deliveries []string
	for _, e := range events {
		if !e.Fanout || e.Staged {
			continue
		}
		earlier := e.CreatedAt.Before(head.EventCreatedAt) || e.CreatedAt.Equal(head.EventCreatedAt) && e.ID < head.EventID
		if earlier && sub.wants(pulsetype.InputOf(e.event()), &s.filters) { // the whole event: a filter reads its data
			deliveries = append(deliveries, DeliveryID(sub.ID, e.ID))
		}
	}
	if len(deliveries) == 0 {
		return false, nil
	}
	found, err := findAll[deliveryDoc](ctx, s.deliveries, "find deliveries of earlier events", bson.M{"_id": bson.M{"$in": deliveries}},
		options.Find().SetProjection(bson.M{"_id": 1}))
	if err != nil {
		return false, err
	}
	return len(found) < len(deliveries), nil
}
