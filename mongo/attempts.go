package mongo

import (
	"context"
	"errors"
	"maps"
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
// groups not in exclude, most overdue first, in two round trips: one query reads a window of candidates
// (three times limit, at most 64), then one fenced claim leases a random limit of them (see ClaimAttempts).
// Replicas read the same most-overdue window; the random pick spreads them over it. It returns the attempts
// it leased, possibly none.
func (s *Store) ClaimBatch(ctx context.Context, owner string, exclude []string, limit int) ([]*pulsetype.Attempt, error) {
	now := s.now()
	filter := bson.M{"status": pulsetype.StatusPending, "lockedUntil": nil, "nextAttemptAt": bson.M{"$lte": now}}
	if len(exclude) > 0 {
		filter["consumerGroup"] = bson.M{"$nin": exclude}
	}
	docs, err := findAll[attemptDoc](ctx, s.history, "find claimable attempts", filter, options.Find().
		SetSort(bson.D{{Key: "status", Value: 1}, {Key: "lockedUntil", Value: 1}, {Key: "nextAttemptAt", Value: 1}}).
		SetLimit(int64(min(3*limit, 64))))
	if err != nil {
		return nil, err
	}
	rand.Shuffle(len(docs), func(i, j int) { docs[i], docs[j] = docs[j], docs[i] })
	candidates := make([]*pulsetype.Attempt, 0, min(limit, len(docs)))
	for i := range docs[:min(limit, len(docs))] {
		candidates = append(candidates, docs[i].attempt())
	}
	return s.ClaimAttempts(ctx, owner, candidates)
}

// ClaimAttempts leases the given unleased attempts (as read from the database, or as FanOut created them)
// with one updateMany whose filter holds their ids, status pending and no lease, so concurrent replicas never
// lease one attempt twice. The attempts it wins share one fresh UUIDv7 fencing token (the fencing token of
// every later write, together with the attempt id), lockOwner owner, lockedAt, heartbeatAt and startedAt
// now, and lockedUntil now + lease timeout. When the update matched fewer than all of them, a second query
// reads back the ones leased under the token. It returns the leased attempts with their lease fields set,
// possibly none; it does not modify its argument.
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
	if res.MatchedCount == 0 {
		return nil, nil
	}
	if int(res.MatchedCount) < len(attempts) { // some were leased by another replica first: read back ours
		docs, err := findAll[attemptDoc](ctx, s.history, "read back claimed attempts", bson.M{"lockToken": token})
		if err != nil {
			return nil, err
		}
		out := make([]*pulsetype.Attempt, len(docs))
		for i := range docs {
			out[i] = docs[i].attempt()
		}
		return out, nil
	}
	out := make([]*pulsetype.Attempt, len(attempts))
	for i, a := range attempts {
		c := *a
		c.LeaseOwner, c.FencingToken, c.LeasedUntil, c.StartedAt = owner, token, &until, &now
		out[i] = &c
	}
	return out, nil
}

// claimByID leases one attempt if it is still pending and unleased; it returns nil when another replica
// leased it first.
func (s *Store) claimByID(ctx context.Context, owner, id string, now time.Time) (*pulsetype.Attempt, error) {
	update := bson.M{"$set": bson.M{
		"lockOwner": owner, "lockToken": uuid.Must(uuid.NewV7()).String(), "lockedAt": now,
		"lockedUntil": now.Add(s.opts.LeaseTimeout), "heartbeatAt": now, "startedAt": now,
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
// lines"): the current attempt of the line's oldest pending delivery, when it is unleased and due and no
// earlier event of the line can still appear. It returns nil when the head is running, waiting, blocked or
// absent; wait > 0 says when to look again without other news. It costs one query of the head (index
// pulse_deliveries_line), one of the subscription, one of the head's attempts and, when the head is due,
// those of earlierMayAppear; errors are the database's, wrapped.
func (s *Store) ClaimHead(ctx context.Context, owner string, line pulsetype.Line) (a *pulsetype.Attempt, wait time.Duration, err error) {
	group, topic := line.ConsumerGroup, line.Topic
	var head deliveryDoc
	err = s.deliveries.FindOne(ctx, bson.M{"consumerGroup": group, "topic": topic, "status": pulsetype.StatusPending, "orderingKey": keyFilter(line.OrderingKey)},
		options.FindOne().SetSort(bson.D{{Key: "consumerGroup", Value: 1}, {Key: "topic", Value: 1}, {Key: "status", Value: 1},
			{Key: "orderingKey", Value: 1}, {Key: "eventCreatedAt", Value: 1}, {Key: "eventId", Value: 1}})).Decode(&head)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, wrap("find head of line", err)
	}
	var sub subscriptionDoc
	err = s.subscriptions.FindOne(ctx, bson.M{"_id": group},
		options.FindOne().SetProjection(bson.M{"backfill": 1, "offsetReset": 1, "createdAt": 1, "incarnation": 1, "state": 1})).Decode(&sub)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil, 0, nil // deleted: its pending deliveries are being ended
	}
	if err != nil {
		return nil, 0, wrap("read subscription", err)
	}
	var at attemptDoc
	err = s.history.FindOne(ctx, bson.M{"deliveryId": head.ID},
		options.FindOne().SetSort(bson.D{{Key: "deliveryId", Value: 1}, {Key: "attempt", Value: -1}})).Decode(&at)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil, 0, nil // the reconciler creates its first attempt
	}
	if err != nil {
		return nil, 0, wrap("find head attempt", err)
	}
	if head.Incarnation != sub.Incarnation {
		// A delivery of an earlier registration of the group (deleted and registered again while its POST
		// ran): it must not hold up the new registration's line, whenever its retry would come due.
		return nil, time.Millisecond, s.endStaleHead(ctx, &head, &at)
	}
	if sub.State != "" && sub.State != pulsetype.EndpointActive {
		return nil, 0, nil // paused or disabled: the line waits for resume
	}
	if settled := head.EventCreatedAt.Add(OrderSettle); s.now().Before(settled) {
		return nil, settled.Sub(s.now()), nil
	}
	now := s.now()
	if at.Status != pulsetype.StatusPending || at.LeasedUntil != nil || at.NextAttemptAt.After(now) {
		return nil, 0, nil
	}
	if blocked, err := s.earlierMayAppear(ctx, line, &sub, &head); err != nil || blocked {
		return nil, 0, err
	}
	a, err = s.claimByID(ctx, owner, at.ID, now)
	return a, 0, err
}

// MaxLineKeys bounds the ordering keys OrderingKeys returns for one (consumer group, topic).
const MaxLineKeys = 1000

// OrderingKeys returns the ordering keys of the pending deliveries of a consumer group's topic, "" (the
// events without a key) first and always present, then the others in ascending order, at most MaxLineKeys of
// them (an arbitrary subset when there are more: the rest wait for a later turn); the
// dispatcher claims the head of each of these lines. It costs one aggregation ($match on index
// pulse_deliveries_line, then $group by key); errors are the database's, wrapped.
func (s *Store) OrderingKeys(ctx context.Context, group, topic string) ([]string, error) {
	cur, err := s.deliveries.Aggregate(ctx, bson.A{
		bson.M{"$match": bson.M{"consumerGroup": group, "topic": topic, "status": pulsetype.StatusPending}},
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
// group (see ClaimHead). It costs one query of marked events (index pulse_events_fanout) and, when there are
// some, one count of the group's deliveries of them.
func (s *Store) earlierMayAppear(ctx context.Context, line pulsetype.Line, sub *subscriptionDoc, head *deliveryDoc) (bool, error) {
	if sub.Backfill != nil {
		return true, nil
	}
	marked, err := findAll[eventDoc](ctx, s.events, "find earlier unfinished fan-outs",
		bson.M{"fanout": true, "createdAt": bson.M{"$lte": head.EventCreatedAt}, "topic": line.Topic, "orderingKey": keyFilter(line.OrderingKey)},
		options.Find().SetSort(bson.D{{Key: "fanout", Value: 1}, {Key: "createdAt", Value: 1}}).SetLimit(maxOrderCheck).
			SetProjection(bson.M{"createdAt": 1}))
	if err != nil {
		return false, err
	}
	var ids []string
	for _, e := range marked {
		earlier := e.CreatedAt.Before(head.EventCreatedAt) || e.CreatedAt.Equal(head.EventCreatedAt) && e.ID < head.EventID
		wanted := sub.OffsetReset == pulsetype.OffsetEarliest || !e.CreatedAt.Before(sub.CreatedAt)
		if earlier && wanted {
			ids = append(ids, e.ID)
		}
	}
	if len(ids) == 0 {
		return false, nil
	}
	n, err := s.deliveries.CountDocuments(ctx, bson.M{"consumerGroup": sub.ID, "eventId": bson.M{"$in": ids}})
	if err != nil {
		return false, wrap("count deliveries of earlier events", err)
	}
	return int(n) < len(ids), nil
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

// resultSet is the $set of a finished attempt: its outcome (outcomeSet) and its evidence.
func (s *Store) resultSet(r pulsetype.AttemptResult, now time.Time) bson.M {
	set := s.outcomeSet(r, now)
	maps.Copy(set, evidenceSet(r))
	return set
}

// outcomeSet is the part of a finished attempt's $set that attempts with the same outcome share: status,
// HTTP status, terminal, error, the receiver's Retry-After (retryAfterMs, when any), endedAt and expiresAt
// (now + history retention), so retention rides in the terminal update.
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

// evidenceSet is the part of a finished attempt's $set that is its own: durationMs and responseBody.
func evidenceSet(r pulsetype.AttemptResult) bson.M {
	return bson.M{"durationMs": r.Duration.Milliseconds(), "responseBody": r.ResponseBody}
}

// FinishAttempts records the results of leased attempts, FinishAttempt for a batch, in two bulk updates (more
// past Capabilities.MaxUpdateStatements statements; docs/delivery.md, "Recording results"): one fenced
// updateMany per distinct outcome, then each attempt's evidence by _id (best effort: a failure is logged). It
// returns, in order, whether each result was recorded (false: the lease was lost, nothing was written).
func (s *Store) FinishAttempts(ctx context.Context, cs []pulsetype.Completion) ([]bool, error) {
	recorded := make([]bool, len(cs))
	if len(cs) == 0 {
		return recorded, nil
	}
	now := s.now().Truncate(time.Millisecond) // BSON dates hold milliseconds: the read-back compares endedAt
	type outcome struct {
		status     pulsetype.Status
		httpStatus int
		terminal   bool
		code       pulsetype.ErrorCode
		msg        string
		retryAfter time.Duration
	}
	groups := map[outcome][]int{}
	var order []outcome
	for i, c := range cs {
		r := c.Result
		k := outcome{status: r.Status, httpStatus: r.HTTPStatus, terminal: r.Terminal, code: r.Error.CodeOrEmpty(), retryAfter: r.RetryAfter}
		if r.Error != nil {
			k.msg = r.Error.Message
		}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], i)
	}
	models := make([]mongo.WriteModel, 0, len(order))
	for _, k := range order {
		idx := groups[k]
		ids, tokens := make([]string, len(idx)), make([]string, len(idx))
		for j, i := range idx {
			ids[j], tokens[j] = cs[i].Attempt.ID, cs[i].Attempt.FencingToken
		}
		filter := bson.M{"_id": bson.M{"$in": ids}, "lockToken": bson.M{"$in": distinct(tokens)}, "status": pulsetype.StatusPending}
		models = append(models, mongo.NewUpdateManyModel().SetFilter(filter).SetUpdate(bson.M{"$set": s.outcomeSet(cs[idx[0]].Result, now)}))
	}
	matched, err := s.bulkUpdate(ctx, s.history, models)
	if err != nil {
		return nil, wrap("finish attempts", err)
	}
	if int(matched) == len(cs) {
		for i := range recorded {
			recorded[i] = true
		}
	} else if err := s.readBackFinished(ctx, cs, now, recorded); err != nil {
		return nil, err
	}
	var evidence []mongo.WriteModel
	for i, c := range cs {
		if recorded[i] && (c.Result.Duration > 0 || c.Result.ResponseBody != "") {
			evidence = append(evidence, mongo.NewUpdateOneModel().SetFilter(bson.M{"_id": c.Attempt.ID}).
				SetUpdate(bson.M{"$set": evidenceSet(c.Result)}))
		}
	}
	if len(evidence) > 0 {
		if _, err := s.bulkUpdate(ctx, s.history, evidence); err != nil {
			// The results are recorded; only their duration and response body are missing.
			s.log.Warn().Err(err).Int("attempts", len(evidence)).Msg("recording attempt evidence (durationMs, responseBody) failed")
		}
	}
	return recorded, nil
}

// readBackFinished sets recorded[i] for each attempt that now carries cs[i]'s result written at now.
func (s *Store) readBackFinished(ctx context.Context, cs []pulsetype.Completion, now time.Time, recorded []bool) error {
	ids := make([]string, len(cs))
	for i, c := range cs {
		ids[i] = c.Attempt.ID
	}
	docs, err := findAll[attemptDoc](ctx, s.history, "read back finished attempts", bson.M{"_id": bson.M{"$in": ids}},
		options.Find().SetProjection(bson.M{"lockToken": 1, "status": 1, "endedAt": 1, "error": 1}))
	if err != nil {
		return err
	}
	byID := map[string]attemptDoc{}
	for _, d := range docs {
		byID[d.ID] = d
	}
	for i, c := range cs {
		// A reaped attempt keeps its token but carries worker_lost and the reaper's endedAt.
		d, ok := byID[c.Attempt.ID]
		recorded[i] = ok && d.FencingToken == c.Attempt.FencingToken && d.Status == c.Result.Status &&
			d.EndedAt != nil && d.EndedAt.Equal(now) && d.Error.CodeOrEmpty() == c.Result.Error.CodeOrEmpty()
	}
	return nil
}

// FollowUps applies the next step of each recorded completion (see pulsetype.RetryPolicy.Decide) with at most two
// commands: one bulk update ends the deliveries that ended (pending ones only: a delivery another replica
// ended stays as it is; successes with the same final attempt share one updateMany), and one unordered
// insertMany creates the next attempts (a duplicate means another replica created it). Both are idempotent;
// after a crash in between, the reconciler finds the rest.
func (s *Store) FollowUps(ctx context.Context, cs []pulsetype.Completion) error {
	now := s.now()
	exp := expiry(now, s.opts.HistoryRetention)
	var ends []mongo.WriteModel
	var retries []any
	succeeded := map[int][]string{} // delivery ids by final attempt
	for _, c := range cs {
		a := c.Attempt
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
	if len(retries) > 0 {
		if _, err := s.history.InsertMany(ctx, retries, options.InsertMany().SetOrdered(false)); err != nil && !onlyDuplicates(err) {
			return wrap("create next attempts", err)
		}
	}
	return nil
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

// CreateAttempt inserts attempt number n of the delivery ref names, due after delay. It returns created=false
// when that attempt already exists (another replica or an earlier try created it: the unique index on
// deliveryId + attempt makes this exactly-once).
func (s *Store) CreateAttempt(ctx context.Context, ref pulsetype.DeliveryRef, n int, delay time.Duration) (created bool, err error) {
	now := s.now()
	_, err = s.history.InsertOne(ctx, newAttemptDoc(ref, n, now, now.Add(delay)))
	if mongo.IsDuplicateKeyError(err) {
		return false, nil
	}
	if err != nil {
		return false, wrap("create attempt", err)
	}
	return true, nil
}

// EndDelivery makes a pending delivery terminal (success or error) with its final attempt number, error and
// expiresAt (now + history retention) in one update. It returns ended=false when the delivery was not
// pending any more (another replica ended it first).
func (s *Store) EndDelivery(ctx context.Context, p pulsetype.EndDeliveryParams) (ended bool, err error) {
	now := s.now()
	res, err := s.deliveries.UpdateOne(ctx, bson.M{"_id": p.DeliveryID, "status": pulsetype.StatusPending},
		bson.M{"$set": endSet(p.Status, p.FinalAttempt, p.Error, now, expiry(now, s.opts.HistoryRetention))})
	if err != nil {
		return false, wrap("end delivery", err)
	}
	return res.ModifiedCount > 0, nil
}

// ReapOne turns one pending attempt whose lease expired into error/worker_lost, through a write whose filter
// still holds the old fencing token and the expired lockedUntil (a lease renewed meanwhile is not reaped). It
// returns the reaped attempt, or nil when there was none or another replica reaped it first.
func (s *Store) ReapOne(ctx context.Context) (*pulsetype.Attempt, error) {
	now := s.now()
	var doc attemptDoc
	err := s.history.FindOne(ctx, bson.M{"status": pulsetype.StatusPending, "lockedUntil": bson.M{"$lt": now}},
		options.FindOne().SetSort(bson.D{{Key: "status", Value: 1}, {Key: "lockedUntil", Value: 1}})).Decode(&doc)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil, nil
	}
	if err != nil {
		return nil, wrap("find expired lease", err)
	}
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

// ReleaseAttempt gives a leased attempt back unstarted (its lease fields removed, fenced by its token), for
// a claim that must not run after all. It returns pulsetype.ErrLeaseLost when the lease is no longer held.
func (s *Store) ReleaseAttempt(ctx context.Context, a *pulsetype.Attempt) error {
	res, err := s.history.UpdateOne(ctx, bson.M{"_id": a.ID, "lockToken": a.FencingToken, "status": pulsetype.StatusPending},
		bson.M{"$unset": bson.M{"lockOwner": "", "lockToken": "", "lockedAt": "", "lockedUntil": "", "heartbeatAt": "", "startedAt": ""}})
	if err != nil {
		return wrap("release attempt", err)
	}
	if res.MatchedCount == 0 {
		return pulsetype.ErrLeaseLost
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
