package mongo

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/google/uuid"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

func newAttemptDoc(deliveryID, eventID, group, topic string, n int, now, nextAt time.Time) *attemptDoc {
	return &attemptDoc{
		ID: uuid.Must(uuid.NewV7()).String(), DeliveryID: deliveryID, EventID: eventID, ConsumerGroup: group,
		Topic: topic, Attempt: n, Status: pulsetype.StatusPending, CreatedAt: now, NextAttemptAt: nextAt,
	}
}

// ClaimBatch leases up to limit claimable attempts (pending, no lease, nextAttemptAt ≤ now) of consumer
// groups not in exclude, most overdue first. It reads the candidates with one query, then leases each with an
// atomic findOneAndUpdate by _id that succeeds only while the attempt is still unleased (so concurrent
// replicas never lease one attempt twice), writing lockOwner, a fresh UUIDv7 lockToken, lockedAt,
// lockedUntil (now + lock timeout), heartbeatAt and startedAt. It returns the attempts it leased, possibly
// none.
func (s *Store) ClaimBatch(ctx context.Context, owner string, exclude []string, limit int) ([]*pulsetype.Attempt, error) {
	now := s.now()
	filter := bson.M{"status": pulsetype.StatusPending, "lockedUntil": nil, "nextAttemptAt": bson.M{"$lte": now}}
	if len(exclude) > 0 {
		filter["consumerGroup"] = bson.M{"$nin": exclude}
	}
	cur, err := s.history.Find(ctx, filter, options.Find().
		SetSort(bson.D{{Key: "status", Value: 1}, {Key: "lockedUntil", Value: 1}, {Key: "nextAttemptAt", Value: 1}}).
		SetLimit(int64(min(3*limit, 64))).SetProjection(bson.M{"_id": 1}))
	if err != nil {
		return nil, wrap("find claimable attempts", err)
	}
	var candidates []attemptDoc
	if err := cur.All(ctx, &candidates); err != nil {
		return nil, wrap("find claimable attempts", err)
	}
	// Replicas read the same most-overdue candidates; trying them in a random order from a window three times
	// the batch spreads them out instead of having every replica race for the same first attempts.
	rand.Shuffle(len(candidates), func(i, j int) { candidates[i], candidates[j] = candidates[j], candidates[i] })
	var out []*pulsetype.Attempt
	for _, c := range candidates {
		if len(out) == limit {
			break
		}
		a, err := s.claimByID(ctx, owner, c.ID, now)
		if err != nil {
			return out, err
		}
		if a != nil {
			out = append(out, a)
		}
	}
	return out, nil
}

// claimByID leases one attempt if it is still pending and unleased; it returns nil when another replica
// leased it first.
func (s *Store) claimByID(ctx context.Context, owner, id string, now time.Time) (*pulsetype.Attempt, error) {
	update := bson.M{"$set": bson.M{
		"lockOwner": owner, "lockToken": uuid.Must(uuid.NewV7()).String(), "lockedAt": now,
		"lockedUntil": now.Add(s.opts.LockTimeout), "heartbeatAt": now, "startedAt": now,
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

// ClaimHead leases the attempt at the head of line of an ordered consumer group's topic: the current attempt
// of its oldest pending delivery (by event createdAt, then event id), if that attempt is unleased and due.
// Only the head may run, so a failing delivery blocks the ones after it until it succeeds or becomes
// terminal; the head attempt's lease is the ordering lease (renewed by the heartbeat, fenced by its token).
// It returns nil when the head is running, waiting for its retry, or absent.
func (s *Store) ClaimHead(ctx context.Context, owner, group, topic string) (*pulsetype.Attempt, error) {
	var head deliveryDoc
	err := s.deliveries.FindOne(ctx, bson.M{"consumerGroup": group, "topic": topic, "status": pulsetype.StatusPending},
		options.FindOne().SetSort(bson.D{{Key: "consumerGroup", Value: 1}, {Key: "topic", Value: 1}, {Key: "status", Value: 1},
			{Key: "eventCreatedAt", Value: 1}, {Key: "eventId", Value: 1}})).Decode(&head)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil, nil
	}
	if err != nil {
		return nil, wrap("find head of line", err)
	}
	var a attemptDoc
	err = s.history.FindOne(ctx, bson.M{"deliveryId": head.ID},
		options.FindOne().SetSort(bson.D{{Key: "deliveryId", Value: 1}, {Key: "attempt", Value: -1}})).Decode(&a)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil, nil // the reconciler creates its first attempt
	}
	if err != nil {
		return nil, wrap("find head attempt", err)
	}
	now := s.now()
	if a.Status != pulsetype.StatusPending || a.LockedUntil != nil || a.NextAttemptAt.After(now) {
		return nil, nil
	}
	return s.claimByID(ctx, owner, a.ID, now)
}

// Renew extends the leases held under tokens to now + lock timeout and stamps heartbeatAt, with one write
// fenced by the tokens. It returns the tokens whose lease was lost (taken over, reaped or no longer pending).
func (s *Store) Renew(ctx context.Context, tokens []string) (lost []string, err error) {
	if len(tokens) == 0 {
		return nil, nil
	}
	now := s.now()
	filter := bson.M{"lockToken": bson.M{"$in": tokens}, "status": pulsetype.StatusPending}
	res, err := s.history.UpdateMany(ctx, filter, bson.M{"$set": bson.M{"lockedUntil": now.Add(s.opts.LockTimeout), "heartbeatAt": now}})
	if err != nil {
		return nil, wrap("renew leases", err)
	}
	if int(res.MatchedCount) == len(tokens) {
		return nil, nil
	}
	cur, err := s.history.Find(ctx, filter, options.Find().SetProjection(bson.M{"lockToken": 1}))
	if err != nil {
		return nil, wrap("find renewed leases", err)
	}
	var held []attemptDoc
	if err := cur.All(ctx, &held); err != nil {
		return nil, wrap("find renewed leases", err)
	}
	ok := map[string]bool{}
	for _, d := range held {
		ok[d.LockToken] = true
	}
	for _, t := range tokens {
		if !ok[t] {
			lost = append(lost, t)
		}
	}
	return lost, nil
}

// FinishAttempt records the result of a leased attempt with a write fenced by its lock token. It returns
// pulsetype.ErrLeaseLost when the token no longer matches a pending attempt (another worker took it over):
// then nothing is written.
func (s *Store) FinishAttempt(ctx context.Context, a *pulsetype.Attempt, r pulsetype.AttemptResult) error {
	now := s.now()
	set := bson.M{
		"status": r.Status, "endedAt": now, "durationMs": r.Duration.Milliseconds(), "httpStatus": r.HTTPStatus,
		"responseBody": r.ResponseBody, "terminal": r.Terminal,
	}
	if r.Error != nil {
		set["error"] = r.Error
	}
	if exp := expiry(now, s.opts.HistoryRetention); exp != nil {
		set["expiresAt"] = exp
	}
	res, err := s.history.UpdateOne(ctx, bson.M{"_id": a.ID, "lockToken": a.LockToken, "status": pulsetype.StatusPending}, bson.M{"$set": set})
	if err != nil {
		return wrap("finish attempt", err)
	}
	if res.MatchedCount == 0 {
		return pulsetype.ErrLeaseLost
	}
	return nil
}

// CreateAttempt inserts attempt number n of a delivery, due after delay. It returns created=false when that
// attempt already exists (another replica or an earlier try created it: the unique index on deliveryId +
// attempt makes this exactly-once).
func (s *Store) CreateAttempt(ctx context.Context, deliveryID, eventID, group, topic string, n int, delay time.Duration) (created bool, err error) {
	now := s.now()
	_, err = s.history.InsertOne(ctx, newAttemptDoc(deliveryID, eventID, group, topic, n, now, now.Add(delay)))
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
func (s *Store) EndDelivery(ctx context.Context, deliveryID string, status pulsetype.Status, finalAttempt int, e *pulsetype.ErrorInfo) (ended bool, err error) {
	now := s.now()
	set := bson.M{"status": status, "endedAt": now, "updatedAt": now, "finalAttempt": finalAttempt}
	if e != nil {
		set["error"] = e
	}
	if exp := expiry(now, s.opts.HistoryRetention); exp != nil {
		set["expiresAt"] = exp
	}
	res, err := s.deliveries.UpdateOne(ctx, bson.M{"_id": deliveryID, "status": pulsetype.StatusPending}, bson.M{"$set": set})
	if err != nil {
		return false, wrap("end delivery", err)
	}
	return res.ModifiedCount > 0, nil
}

// ReapOne turns one pending attempt whose lease expired into error/worker_lost, through a write whose filter
// still holds the old lock token and the expired lockedUntil (a lease renewed meanwhile is not reaped). It
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
	e := &pulsetype.ErrorInfo{Code: pulsetype.CodeWorkerLost, Message: "the attempt's lease expired before it completed (lock owner " + doc.LockOwner + ")"}
	set := bson.M{"status": pulsetype.StatusError, "endedAt": now, "error": e}
	if exp := expiry(now, s.opts.HistoryRetention); exp != nil {
		set["expiresAt"] = exp
	}
	res, err := s.history.UpdateOne(ctx, bson.M{
		"_id": doc.ID, "status": pulsetype.StatusPending, "lockToken": doc.LockToken, "lockedUntil": bson.M{"$lt": now},
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
	res, err := s.history.UpdateOne(ctx, bson.M{"_id": a.ID, "lockToken": a.LockToken, "status": pulsetype.StatusPending},
		bson.M{"$unset": bson.M{"lockOwner": "", "lockToken": "", "lockedAt": "", "lockedUntil": "", "heartbeatAt": "", "startedAt": ""}})
	if err != nil {
		return wrap("release attempt", err)
	}
	if res.MatchedCount == 0 {
		return pulsetype.ErrLeaseLost
	}
	return nil
}
