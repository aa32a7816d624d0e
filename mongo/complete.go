package mongo

import (
	"context"
	"slices"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// Completing: a leased attempt's result is recorded fenced by its token, then its follow-up (the next
// attempt, or the delivery's end) is written and its queue document removed.

// FinishAttempt records the result of a leased attempt with a write fenced by its id and fencing token. It
// returns pulsetype.ErrLeaseLost when they no longer match a pending attempt (it was reaped or released):
// then nothing is written.
func (s *Store) FinishAttempt(ctx context.Context, a *pulsetype.Attempt, r pulsetype.AttemptResult) error {
	res, err := s.history.UpdateOne(ctx, fence(a.Key()), bson.M{"$set": s.resultSet(r, s.now())})
	if err != nil {
		return wrap("finish attempt", err)
	}
	if res.MatchedCount == 0 {
		return pulsetype.ErrLeaseLost
	}
	return nil
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
		models = append(models, mongo.NewUpdateOneModel().SetFilter(fence(c.Attempt.Key())).SetUpdate(bson.M{"$set": s.resultSet(c.Result, now)}))
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
	docs, err := reread[attemptDoc](ctx, s, s.history, "read back finished attempts", bson.M{"_id": bson.M{"$in": ids}},
		options.Find().SetProjection(bson.M{fieldFencingToken: 1, "status": 1, "httpStatus": 1, "endedAt": 1, "error": 1}))
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

// FollowUps applies the next step of each recorded completion (see pulsetype.RetryPolicy.Decide), then removes the
// completed attempts from the queue, with at most five commands: one bulk update ends the deliveries that
// ended (pending ones not reopened for a later attempt, see notReopenedAfter: a delivery another replica
// ended, or a retry reopened, stays as it is; successes with the same final attempt share one updateMany); for the retries, one read of their lines from the queue, one insert of the
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
			ends = append(ends, mongo.NewUpdateOneModel().SetFilter(bson.M{"_id": a.DeliveryID, "status": pulsetype.StatusPending, "$or": notReopenedAfter(a.Number)}).
				SetUpdate(bson.M{"$set": endSet(c.Next.EndStatus, a.Number, c.Next.EndError, now, exp)}))
		}
	}
	for n, ids := range succeeded {
		ends = append(ends, mongo.NewUpdateManyModel().SetFilter(bson.M{"_id": bson.M{"$in": ids}, "status": pulsetype.StatusPending, "$or": notReopenedAfter(n)}).
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
	if _, err := s.deleteMany(ctx, s.queue, bson.M{"_id": bson.M{"$in": done}}); err != nil {
		return wrap("remove completed attempts from the queue", err)
	}
	return nil
}

// notReopenedAfter is the $or that fences the end of a delivery by its final attempt n: the delivery was not
// reopened (RetryDelivery, a replay) for a later attempt (reopenedAttempt absent or at most n). An end that is
// re-issued after a reopen landed between its two tries (FollowUps' bulk update is re-issued, see reissue)
// then matches nothing, instead of ending the reopened delivery with the old final attempt.
func notReopenedAfter(n int) bson.A {
	return bson.A{bson.M{"reopenedAttempt": nil}, bson.M{"reopenedAttempt": bson.M{"$lte": n}}}
}

// createAttempts inserts pending attempts: their queue documents first (placed in their deliveries' lines,
// read from the queue, see linesOf), then the attempts; a duplicate (another writer created that attempt
// number) removes this call's queue document again. It returns which ones it created, by index.
func (s *Store) createAttempts(ctx context.Context, attempts []*attemptDoc) ([]bool, error) {
	if len(attempts) == 0 {
		return nil, nil
	}
	ids := idsOf(attempts, func(a *attemptDoc) string { return a.DeliveryID })
	lines, err := s.linesOf(ctx, ids)
	if err != nil {
		return nil, err
	}
	queue, docs := make([]any, len(attempts)), make([]any, len(attempts))
	for i, a := range attempts {
		l := lines[a.DeliveryID]
		queue[i], docs[i] = queued(a, l.OrderingKey, l.EventCreatedAt), a
	}
	if err := s.insertNew(ctx, s.queue, queue); err != nil {
		return nil, wrap("queue attempts", err)
	}
	inserted, err := s.insertAttempts(ctx, docs)
	if err != nil {
		return nil, wrap("insert attempts", err)
	}
	return inserted, s.unqueueDuplicates(ctx, docs, inserted)
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
	queued, err := findAll[queueDoc](ctx, s, s.queue, "read lines of queued deliveries", bson.M{"deliveryId": bson.M{"$in": deliveryIDs}},
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
	docs, err := findAll[deliveryDoc](ctx, s, s.deliveries, "read lines of deliveries", bson.M{"_id": bson.M{"$in": missing}},
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
	if _, err := s.deleteMany(ctx, s.queue, bson.M{"deliveryId": ref.DeliveryID, "attempt": bson.M{"$lt": n}}); err != nil {
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
	if _, err := s.deleteMany(ctx, s.queue, bson.M{"deliveryId": p.DeliveryID, "attempt": bson.M{"$lte": p.FinalAttempt}}); err != nil {
		return false, wrap("remove ended attempts from the queue", err)
	}
	return res.ModifiedCount > 0, nil
}
