package mongo

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/google/uuid"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

func newAttemptDoc(ref pulsetype.DeliveryRef, n int, now, nextAt time.Time) *attemptDoc {
	return &attemptDoc{
		ID: uuid.Must(uuid.NewV7()).String(), DeliveryID: ref.DeliveryID, EventID: ref.EventID, ConsumerGroup: ref.ConsumerGroup,
		Topic: ref.Topic, Incarnation: ref.Incarnation, Attempt: n, Status: pulsetype.StatusPending, CreatedAt: now, NextAttemptAt: nextAt,
		Uncounted: ref.Uncounted,
	}
}

// ClaimBatch leases up to limit claimable attempts (pending, no lease, nextAttemptAt ≤ now) of consumer
// groups not in exclude, most overdue first, in two round trips: one query of the queue reads a window of
// candidates (three times limit, at most 64), then one fenced claim leases a random limit of them (see
// ClaimAttempts). Replicas read the same most-overdue window; the random pick spreads them over it. It returns
// the attempts it leased, possibly none.
func (s *Store) ClaimBatch(ctx context.Context, owner string, exclude []string, limit int) ([]*pulsetype.Attempt, error) {
	now := s.now()
	filter := bson.M{"lockedUntil": nil, "nextAttemptAt": bson.M{"$lte": now}, "ended": bson.M{"$ne": true}}
	if len(exclude) > 0 {
		filter["consumerGroup"] = bson.M{"$nin": exclude}
	}
	docs, err := findAll[queueDoc](ctx, s.queue, "find claimable attempts", filter, options.Find().
		SetSort(bson.D{{Key: "lockedUntil", Value: 1}, {Key: "nextAttemptAt", Value: 1}}).
		SetLimit(int64(min(3*limit, 64))))
	if err != nil {
		return nil, err
	}
	rand.Shuffle(len(docs), func(i, j int) { docs[i], docs[j] = docs[j], docs[i] })
	candidates := make([]*pulsetype.Attempt, 0, min(limit, len(docs)))
	for _, d := range docs[:min(limit, len(docs))] {
		candidates = append(candidates, d.attempt())
	}
	return s.ClaimAttempts(ctx, owner, candidates)
}

// attempt returns the queue document as the pending, unleased attempt it stands for.
func (d *queueDoc) attempt() *pulsetype.Attempt {
	return &pulsetype.Attempt{ID: d.ID, DeliveryID: d.DeliveryID, EventID: d.EventID, ConsumerGroup: d.ConsumerGroup, Topic: d.Topic,
		Number: d.Attempt, Uncounted: d.Uncounted, Status: pulsetype.StatusPending, CreatedAt: d.CreatedAt, NextAttemptAt: d.NextAttemptAt,
		Incarnation: d.Incarnation}
}

// ClaimAttempts leases the given unleased attempts (as read from the queue, or as FanOut created them) with
// one updateMany of their history documents whose filter holds their ids, status pending and no lease, so
// concurrent replicas never lease one attempt twice. The attempts it wins share one fresh UUIDv7 fencing
// token (the fencing token of every later write, together with the attempt id), lockOwner owner, lockedAt,
// heartbeatAt and startedAt now, and lockedUntil now + lease timeout; one update of their queue documents then
// copies the lease, so claims of the queue skip them. When the update matched fewer than all of them, a
// second query reads back every one's state: the ones leased under the token are ours, and the queue
// documents of the others are corrected (leased elsewhere, or ended). It returns the leased attempts with
// their lease fields set, possibly none; it does not modify its argument.
func (s *Store) ClaimAttempts(ctx context.Context, owner string, attempts []*pulsetype.Attempt) ([]*pulsetype.Attempt, error) {
	if len(attempts) == 0 {
		return nil, nil
	}
	now := s.now()
	token := uuid.Must(uuid.NewV7()).String()
	until := now.Add(s.opts.LeaseTimeout)
	ids := make([]string, len(attempts))
	for i, a := range attempts {
		ids[i] = a.ID
	}
	res, err := s.history.UpdateMany(ctx, bson.M{"_id": bson.M{"$in": ids}, "status": pulsetype.StatusPending, "lockedUntil": nil},
		bson.M{"$set": bson.M{"lockOwner": owner, "lockToken": token, "lockedAt": now, "lockedUntil": until, "heartbeatAt": now, "startedAt": now}})
	if err != nil {
		return nil, wrap("claim attempts", err)
	}
	var out []*pulsetype.Attempt
	if int(res.MatchedCount) == len(attempts) {
		out = make([]*pulsetype.Attempt, len(attempts))
		for i, a := range attempts {
			c := *a
			c.LeaseOwner, c.FencingToken, c.LeasedUntil, c.StartedAt = owner, token, &until, &now
			out[i] = &c
		}
	} else { // some were leased by another replica first, or have ended: read back which are ours
		docs, err := findAll[attemptDoc](ctx, s.history, "read back claimed attempts", bson.M{"_id": bson.M{"$in": ids}})
		if err != nil {
			return nil, err
		}
		var stale []*attemptDoc
		for i := range docs {
			if docs[i].FencingToken == token && docs[i].Status == pulsetype.StatusPending {
				out = append(out, docs[i].attempt())
			} else {
				stale = append(stale, &docs[i])
			}
		}
		if err := s.hintQueue(ctx, stale); err != nil {
			return nil, err
		}
	}
	if len(out) > 0 {
		leased := make([]string, len(out))
		for i, a := range out {
			leased[i] = a.ID
		}
		if _, err := s.queue.UpdateMany(ctx, bson.M{"_id": bson.M{"$in": leased}},
			bson.M{"$set": bson.M{"lockedUntil": until, "lockToken": token}}); err != nil {
			return nil, wrap("copy leases to the queue", err)
		}
	}
	return out, nil
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

// claimByID leases one attempt if it is still pending and unleased, and copies the lease to its queue
// document; it returns nil when another replica leased it first.
func (s *Store) claimByID(ctx context.Context, owner, id string, now time.Time) (*pulsetype.Attempt, error) {
	until := now.Add(s.opts.LeaseTimeout)
	token := uuid.Must(uuid.NewV7()).String()
	update := bson.M{"$set": bson.M{
		"lockOwner": owner, "lockToken": token, "lockedAt": now, "lockedUntil": until, "heartbeatAt": now, "startedAt": now,
	}}
	var doc attemptDoc
	err := s.history.FindOneAndUpdate(ctx, bson.M{"_id": id, "status": pulsetype.StatusPending, "lockedUntil": nil}, update,
		options.FindOneAndUpdate().SetReturnDocument(options.After)).Decode(&doc)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil, nil
	}
	if err != nil {
		return nil, wrap("claim attempt", err)
	}
	if _, err := s.queue.UpdateOne(ctx, bson.M{"_id": id}, bson.M{"$set": bson.M{"lockedUntil": until, "lockToken": token}}); err != nil {
		return nil, wrap("copy lease to the queue", err)
	}
	return doc.attempt(), nil
}

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
		options.FindOne().SetProjection(bson.M{"backfill": 1, "offsetReset": 1, "createdAt": 1, "incarnation": 1, "state": 1})).Decode(&sub)
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
	a, err = s.claimByID(ctx, owner, at.ID, s.now()) // the lease runs from now, after the checks' round trips
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
			return d, q, ended, s.unqueueEnded(ctx, ended) // every document before it is of an ended delivery
		default:
			ended = append(ended, q.ID)
		}
	}
	return nil, nil, nil, s.unqueueEnded(ctx, ended)
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
	if _, err := s.queue.DeleteMany(ctx, bson.M{"_id": bson.M{"$in": ids}}); err != nil {
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
		res, err := s.history.UpdateOne(ctx, bson.M{"_id": at.ID, "status": pulsetype.StatusPending, "lockedUntil": nil},
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
	ids := make([]string, len(marks))
	for i, m := range marks {
		ids[i] = m.ID
	}
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
		wanted := sub.OffsetReset == pulsetype.OffsetEarliest || !e.CreatedAt.Before(sub.CreatedAt)
		if earlier && wanted {
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

// Renew extends the given leases to now + lease timeout and stamps heartbeatAt, with one updateMany fenced by
// the attempt ids, their tokens and status pending. When it matched fewer than all, one query finds which are
// still held. It returns the leases that were lost (reaped, released or no longer pending).
func (s *Store) Renew(ctx context.Context, leases []pulsetype.LeaseKey) (lost []pulsetype.LeaseKey, err error) {
	if len(leases) == 0 {
		return nil, nil
	}
	now := s.now()
	ids, tokens := make([]string, len(leases)), make([]string, len(leases))
	for i, l := range leases {
		ids[i], tokens[i] = l.AttemptID, l.Token
	}
	filter := bson.M{"_id": bson.M{"$in": ids}, "lockToken": bson.M{"$in": distinct(tokens)}, "status": pulsetype.StatusPending}
	res, err := s.history.UpdateMany(ctx, filter, bson.M{"$set": bson.M{"lockedUntil": now.Add(s.opts.LeaseTimeout), "heartbeatAt": now}})
	if err != nil {
		return nil, wrap("renew leases", err)
	}
	if int(res.MatchedCount) == len(leases) {
		return nil, nil
	}
	held, err := findAll[attemptDoc](ctx, s.history, "find renewed leases", filter, options.Find().SetProjection(bson.M{"lockToken": 1}))
	if err != nil {
		return nil, err
	}
	ok := map[pulsetype.LeaseKey]bool{}
	for _, d := range held {
		ok[pulsetype.LeaseKey{AttemptID: d.ID, Token: d.FencingToken}] = true
	}
	for _, l := range leases {
		if !ok[l] {
			lost = append(lost, l)
		}
	}
	return lost, nil
}

// FinishAttempt records the result of a leased attempt with a write fenced by its id and fencing token. It
// returns pulsetype.ErrLeaseLost when they no longer match a pending attempt (it was reaped or released):
// then nothing is written.
func (s *Store) FinishAttempt(ctx context.Context, a *pulsetype.Attempt, r pulsetype.AttemptResult) error {
	res, err := s.history.UpdateOne(ctx, fence(a), bson.M{"$set": s.resultSet(r, s.now())})
	if err != nil {
		return wrap("finish attempt", err)
	}
	if res.MatchedCount == 0 {
		return pulsetype.ErrLeaseLost
	}
	return nil
}

// fence is the filter of a write that only the holder of a's lease may make.
func fence(a *pulsetype.Attempt) bson.M {
	return bson.M{"_id": a.ID, "lockToken": a.FencingToken, "status": pulsetype.StatusPending}
}

// resultSet is the $set of a finished attempt: its outcome (outcomeSet) and its evidence, durationMs (when a
// POST ran, so a POST under a millisecond records 0) and responseBody (when not empty).
func (s *Store) resultSet(r pulsetype.AttemptResult, now time.Time) bson.M {
	set := s.outcomeSet(r, now)
	if r.Duration > 0 {
		set["durationMs"] = r.Duration.Milliseconds()
	}
	if r.ResponseBody != "" {
		set["responseBody"] = r.ResponseBody
	}
	return set
}

// outcomeSet is the part of a finished attempt's $set that is not its evidence: status, HTTP status,
// terminal, error, the receiver's Retry-After (retryAfterMs, when any), endedAt and expiresAt (now + history
// retention), so retention rides in the terminal update. The reaper and a cancel write it alone.
func (s *Store) outcomeSet(r pulsetype.AttemptResult, now time.Time) bson.M {
	set := bson.M{"status": r.Status, "endedAt": now, "httpStatus": r.HTTPStatus, "terminal": r.Terminal}
	if r.RetryAfter > 0 {
		set["retryAfterMs"] = r.RetryAfter.Milliseconds()
	}
	if r.Error != nil {
		set["error"] = r.Error
	}
	if exp := expiry(now, s.opts.HistoryRetention); exp != nil {
		set["expiresAt"] = exp
	}
	return set
}

// FinishAttempts records the results of leased attempts, FinishAttempt for a batch, with one bulk update
// (more past Capabilities.MaxUpdateStatements statements; docs/delivery.md, "Recording results"): one
// statement per attempt, fenced by its id, its fencing token and status pending, that writes its whole
// result (resultSet). It returns, in order, whether each result was recorded (false: the lease was lost,
// nothing was written for that attempt; a second result of one attempt in the batch is never written), and
// the database's error.
func (s *Store) FinishAttempts(ctx context.Context, cs []pulsetype.Completion) ([]bool, error) {
	recorded := make([]bool, len(cs))
	now := s.now().Truncate(time.Millisecond) // BSON dates hold milliseconds: the read-back compares endedAt
	var sent []int                            // indexes of cs written: the first result of each attempt
	seen := make(map[string]bool, len(cs))
	models := make([]mongo.WriteModel, 0, len(cs))
	for i, c := range cs {
		if seen[c.Attempt.ID] {
			continue
		}
		seen[c.Attempt.ID] = true
		sent = append(sent, i)
		models = append(models, mongo.NewUpdateOneModel().SetFilter(fence(c.Attempt)).SetUpdate(bson.M{"$set": s.resultSet(c.Result, now)}))
	}
	if len(models) == 0 {
		return recorded, nil
	}
	matched, err := s.bulkUpdate(ctx, s.history, models)
	if err != nil {
		return nil, wrap("finish attempts", err)
	}
	if int(matched) == len(sent) {
		for _, i := range sent {
			recorded[i] = true
		}
		return recorded, nil
	}
	if err := s.readBackFinished(ctx, cs, sent, now, recorded); err != nil {
		return nil, err
	}
	return recorded, nil
}

// readBackFinished sets recorded[i], for each i of sent, when the attempt of cs[i] now carries its result
// written at now: its fencing token, status, HTTP status, error code and endedAt.
func (s *Store) readBackFinished(ctx context.Context, cs []pulsetype.Completion, sent []int, now time.Time, recorded []bool) error {
	ids := make([]string, len(sent))
	for j, i := range sent {
		ids[j] = cs[i].Attempt.ID
	}
	docs, err := findAll[attemptDoc](ctx, s.history, "read back finished attempts", bson.M{"_id": bson.M{"$in": ids}},
		options.Find().SetProjection(bson.M{"lockToken": 1, "status": 1, "httpStatus": 1, "endedAt": 1, "error": 1}))
	if err != nil {
		return err
	}
	byID := map[string]attemptDoc{}
	for _, d := range docs {
		byID[d.ID] = d
	}
	for _, i := range sent {
		// A reaped attempt keeps its token but carries worker_lost and the reaper's endedAt.
		c := cs[i]
		d, ok := byID[c.Attempt.ID]
		recorded[i] = ok && d.FencingToken == c.Attempt.FencingToken && d.Status == c.Result.Status && d.HTTPStatus == c.Result.HTTPStatus &&
			d.EndedAt != nil && d.EndedAt.Equal(now) && d.Error.CodeOrEmpty() == c.Result.Error.CodeOrEmpty()
	}
	return nil
}

// FollowUps applies the next step of each recorded completion (see pulsetype.RetryPolicy.Decide), then removes the
// completed attempts from the queue, with at most five commands: one bulk update ends the deliveries that
// ended (pending ones only: a delivery another replica ended stays as it is; successes with the same final
// attempt share one updateMany); for the retries, one read of their lines from the queue, one insert of the
// next attempts' queue documents and one unordered insertMany of the next attempts (a duplicate means
// another writer created that attempt, with its own queue document); last, one delete of the completed
// attempts' queue documents. All are idempotent; after a crash in between, the repair scan finds the rest
// through the queue documents still there.
func (s *Store) FollowUps(ctx context.Context, cs []pulsetype.Completion) error {
	now := s.now()
	exp := expiry(now, s.opts.HistoryRetention)
	var ends []mongo.WriteModel
	var retries []*attemptDoc
	succeeded := map[int][]string{} // delivery ids by final attempt
	done := make([]string, len(cs))
	for i, c := range cs {
		a := c.Attempt
		done[i] = a.ID
		switch {
		case c.Next.Retry:
			retries = append(retries, newAttemptDoc(pulsetype.NextRef(a, c.Next), a.Number+1, now, now.Add(c.Next.Delay)))
		case c.Next.EndStatus == pulsetype.StatusSuccess:
			succeeded[a.Number] = append(succeeded[a.Number], a.DeliveryID)
		default:
			ends = append(ends, mongo.NewUpdateOneModel().SetFilter(bson.M{"_id": a.DeliveryID, "status": pulsetype.StatusPending}).
				SetUpdate(bson.M{"$set": endSet(c.Next.EndStatus, a.Number, c.Next.EndError, now, exp)}))
		}
	}
	for n, ids := range succeeded {
		ends = append(ends, mongo.NewUpdateManyModel().SetFilter(bson.M{"_id": bson.M{"$in": ids}, "status": pulsetype.StatusPending}).
			SetUpdate(bson.M{"$set": endSet(pulsetype.StatusSuccess, n, nil, now, exp)}))
	}
	if len(ends) > 0 {
		if _, err := s.bulkUpdate(ctx, s.deliveries, ends); err != nil {
			return wrap("end deliveries", err)
		}
	}
	if _, err := s.createAttempts(ctx, retries); err != nil {
		return wrap("create next attempts", err)
	}
	if _, err := s.queue.DeleteMany(ctx, bson.M{"_id": bson.M{"$in": done}}); err != nil {
		return wrap("remove completed attempts from the queue", err)
	}
	return nil
}

// createAttempts inserts pending attempts: their queue documents first (placed in their deliveries' lines,
// read from the queue, see linesOf), then the attempts; a duplicate (another writer created that attempt
// number) removes this call's queue document again. It returns which ones it created, by index.
func (s *Store) createAttempts(ctx context.Context, attempts []*attemptDoc) ([]bool, error) {
	if len(attempts) == 0 {
		return nil, nil
	}
	ids := make([]string, len(attempts))
	for i, a := range attempts {
		ids[i] = a.DeliveryID
	}
	lines, err := s.linesOf(ctx, ids)
	if err != nil {
		return nil, err
	}
	queue, docs := make([]any, len(attempts)), make([]any, len(attempts))
	for i, a := range attempts {
		l := lines[a.DeliveryID]
		queue[i], docs[i] = queued(a, l.OrderingKey, l.EventCreatedAt), a
	}
	if _, err := s.queue.InsertMany(ctx, queue, options.InsertMany().SetOrdered(false)); err != nil && !onlyDuplicates(err) {
		return nil, wrap("queue attempts", err)
	}
	_, err = s.history.InsertMany(ctx, docs, options.InsertMany().SetOrdered(false))
	if err != nil && !onlyDuplicates(err) {
		return nil, wrap("insert attempts", err)
	}
	inserted := make([]bool, len(attempts))
	for i := range attempts {
		inserted[i] = !failedAt(err, i)
	}
	return inserted, s.unqueueDuplicates(ctx, docs, err)
}

// line is where a delivery's attempts stand in its line (see queueDoc).
type line struct {
	OrderingKey    string    `bson:"orderingKey,omitempty"`
	EventCreatedAt time.Time `bson:"eventCreatedAt"`
}

// linesOf returns the line of each delivery: from its queue documents, else (none queued: a delivery
// reopened, or repaired) from the delivery itself. It costs one query of the queue and, for deliveries
// without queue documents, one read of them by id.
func (s *Store) linesOf(ctx context.Context, deliveryIDs []string) (map[string]line, error) {
	queued, err := findAll[queueDoc](ctx, s.queue, "read lines of queued deliveries", bson.M{"deliveryId": bson.M{"$in": deliveryIDs}},
		options.Find().SetProjection(bson.M{"deliveryId": 1, "orderingKey": 1, "eventCreatedAt": 1}))
	if err != nil {
		return nil, err
	}
	out := make(map[string]line, len(deliveryIDs))
	for _, q := range queued {
		out[q.DeliveryID] = line{OrderingKey: q.OrderingKey, EventCreatedAt: q.EventCreatedAt}
	}
	var missing []string
	for _, id := range deliveryIDs {
		if _, ok := out[id]; !ok && !slices.Contains(missing, id) {
			missing = append(missing, id)
		}
	}
	if len(missing) == 0 {
		return out, nil
	}
	docs, err := findAll[deliveryDoc](ctx, s.deliveries, "read lines of deliveries", bson.M{"_id": bson.M{"$in": missing}},
		options.Find().SetProjection(bson.M{"orderingKey": 1, "eventCreatedAt": 1}))
	if err != nil {
		return nil, err
	}
	for _, d := range docs {
		out[d.ID] = line{OrderingKey: d.OrderingKey, EventCreatedAt: d.EventCreatedAt}
	}
	return out, nil
}

// endSet is the $set that makes a delivery terminal, with expiresAt riding in the same update.
func endSet(status pulsetype.Status, finalAttempt int, e *pulsetype.ErrorInfo, now time.Time, exp *time.Time) bson.M {
	set := bson.M{"status": status, "endedAt": now, "updatedAt": now, "finalAttempt": finalAttempt}
	if e != nil {
		set["error"] = e
	}
	if exp != nil {
		set["expiresAt"] = exp
	}
	return set
}

// CreateAttempt inserts attempt number n of the delivery ref names, due after delay, queued first (see
// createAttempts), and removes the queue documents of the delivery's earlier attempts, which have ended. It
// returns created=false when that attempt already exists (another replica or an earlier try created it: the
// unique index on deliveryId + attempt makes this exactly-once).
func (s *Store) CreateAttempt(ctx context.Context, ref pulsetype.DeliveryRef, n int, delay time.Duration) (created bool, err error) {
	now := s.now()
	inserted, err := s.createAttempts(ctx, []*attemptDoc{newAttemptDoc(ref, n, now, now.Add(delay))})
	if err != nil {
		return false, wrap("create attempt", err)
	}
	if _, err := s.queue.DeleteMany(ctx, bson.M{"deliveryId": ref.DeliveryID, "attempt": bson.M{"$lt": n}}); err != nil {
		return false, wrap("remove ended attempts from the queue", err)
	}
	return inserted[0], nil
}

// EndDelivery makes a pending delivery terminal (success or error) with its final attempt number, error and
// expiresAt (now + history retention) in one update, then removes the queue documents of its attempts up to
// p.FinalAttempt (which have ended). It returns ended=false when the delivery was not pending any more
// (another replica ended it first).
func (s *Store) EndDelivery(ctx context.Context, p pulsetype.EndDeliveryParams) (ended bool, err error) {
	now := s.now()
	res, err := s.deliveries.UpdateOne(ctx, bson.M{"_id": p.DeliveryID, "status": pulsetype.StatusPending},
		bson.M{"$set": endSet(p.Status, p.FinalAttempt, p.Error, now, expiry(now, s.opts.HistoryRetention))})
	if err != nil {
		return false, wrap("end delivery", err)
	}
	if _, err := s.queue.DeleteMany(ctx, bson.M{"deliveryId": p.DeliveryID, "attempt": bson.M{"$lte": p.FinalAttempt}}); err != nil {
		return false, wrap("remove ended attempts from the queue", err)
	}
	return res.ModifiedCount > 0, nil
}

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
	queued, err := findAll[queueDoc](ctx, s.queue, "find expired leases", bson.M{"lockedUntil": bson.M{"$lt": now}, "ended": bson.M{"$ne": true}},
		options.Find().SetSort(bson.D{{Key: "lockedUntil", Value: 1}}).SetLimit(reapScan).SetProjection(bson.M{"_id": 1}))
	if err != nil || len(queued) == 0 {
		return nil, err
	}
	ids := make([]string, len(queued))
	for i, q := range queued {
		ids[i] = q.ID
	}
	docs, err := findAll[attemptDoc](ctx, s.history, "read expired leases", bson.M{"_id": bson.M{"$in": ids}})
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
	res, err := s.history.UpdateOne(ctx, bson.M{
		"_id": doc.ID, "status": pulsetype.StatusPending, "lockToken": doc.FencingToken, "lockedUntil": bson.M{"$lt": now},
	}, bson.M{"$set": set})
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

// Claim leases the single most overdue claimable attempt (ClaimBatch with limit 1); it returns (nil, nil)
// when nothing is due.
func (s *Store) Claim(ctx context.Context, owner string, exclude []string) (*pulsetype.Attempt, error) {
	out, err := s.ClaimBatch(ctx, owner, exclude, 1)
	if len(out) == 0 {
		return nil, err
	}
	return out[0], err
}

// ReleaseAttempt gives a leased attempt back unstarted (its lease fields removed, fenced by its token, and
// its queue document's copy of the lease), for a claim that must not run after all. It returns
// pulsetype.ErrLeaseLost when the lease is no longer held.
func (s *Store) ReleaseAttempt(ctx context.Context, a *pulsetype.Attempt) error {
	res, err := s.history.UpdateOne(ctx, bson.M{"_id": a.ID, "lockToken": a.FencingToken, "status": pulsetype.StatusPending},
		bson.M{"$unset": bson.M{"lockOwner": "", "lockToken": "", "lockedAt": "", "lockedUntil": "", "heartbeatAt": "", "startedAt": ""}})
	if err != nil {
		return wrap("release attempt", err)
	}
	if res.MatchedCount == 0 {
		return pulsetype.ErrLeaseLost
	}
	if _, err := s.queue.UpdateOne(ctx, bson.M{"_id": a.ID, "lockToken": a.FencingToken}, bson.M{"$unset": bson.M{"lockedUntil": "", "lockToken": ""}}); err != nil {
		return wrap("release attempt in the queue", err)
	}
	return nil
}

// bulkUpdate runs update models as unordered bulk writes of at most Capabilities.MaxUpdateStatements
// statements each (all in one when it is 0) and returns how many documents their filters matched in total.
func (s *Store) bulkUpdate(ctx context.Context, coll *mongo.Collection, models []mongo.WriteModel) (matched int64, err error) {
	size := s.caps.MaxUpdateStatements
	if size <= 0 {
		size = max(len(models), 1)
	}
	for chunk := range slices.Chunk(models, size) {
		res, err := coll.BulkWrite(ctx, chunk, options.BulkWrite().SetOrdered(false))
		if err != nil {
			return matched, err
		}
		matched += res.MatchedCount
	}
	return matched, nil
}

// distinct returns the distinct values of vs, in first-seen order.
func distinct(vs []string) []string {
	seen := make(map[string]bool, len(vs))
	out := vs[:0:0]
	for _, v := range vs {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}
