package mongo

import (
	"context"
	"math/rand/v2"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// Claiming: attempts are leased from the queue under one fresh fencing token per claim (see lease.go),
// renewed while they run, and given back unstarted.

// Claim leases the single most overdue claimable attempt of the consumer groups groups (nil or empty: of
// any group) (ClaimBatch with limit 1); it returns (nil, nil) when nothing is due.
func (s *Store) Claim(ctx context.Context, owner string, groups []string) (*pulsetype.Attempt, error) {
	out, err := s.ClaimBatch(ctx, owner, groups, 1)
	if len(out) == 0 {
		return nil, err
	}
	return out[0], err
}

// ClaimBatch leases up to limit claimable attempts of the consumer groups groups (nil or empty: of any
// group), most overdue first, in two round trips: DueAttempts reads a window of candidates (three times
// limit, at most 64), then one fenced claim leases a random limit of them (see ClaimAttempts). Replicas read
// the same most-overdue window; the random pick spreads them over it. It returns the attempts it leased,
// possibly none.
func (s *Store) ClaimBatch(ctx context.Context, owner string, groups []string, limit int) ([]*pulsetype.Attempt, error) {
	docs, err := s.DueAttempts(ctx, groups, min(3*limit, 64))
	if err != nil {
		return nil, err
	}
	rand.Shuffle(len(docs), func(i, j int) { docs[i], docs[j] = docs[j], docs[i] })
	return s.ClaimAttempts(ctx, owner, docs[:min(limit, len(docs))])
}

// DueAttempts reads, with one query of the queue, up to limit claimable attempts (pending, no lease,
// nextAttemptAt ≤ now, not ended) of the consumer groups groups (nil or empty: of any group), most overdue
// first, as the pending unleased attempts they stand for; it leases none (ClaimAttempts does, by id). With
// groups the query names them ({consumerGroup: {$in: groups}}, never the groups left out), and on MongoDB it
// is hinted to pulse_queue_group_due, whose leading key makes the server read only those groups' due
// attempts, each group's range in due order, merged (MongoDB merges up to 200 groups' ranges for a sort;
// beyond that it sorts the due attempts of the groups named); without groups pulse_queue_acquisition serves
// it. A server that scans (FerretDB) reads the queue once per call whatever limit is, so a caller that
// drains a backlog reads a large window once and claims from it by id (dispatcher.dueWindow). Errors are
// the database's, wrapped.
func (s *Store) DueAttempts(ctx context.Context, groups []string, limit int) ([]*pulsetype.Attempt, error) {
	filter := bson.M{fieldLeasedUntil: nil, "nextAttemptAt": bson.M{"$lte": s.now()}, "ended": bson.M{"$ne": true}}
	opts := options.Find().SetSort(bson.D{{Key: fieldLeasedUntil, Value: 1}, {Key: "nextAttemptAt", Value: 1}}).SetLimit(int64(limit))
	if len(groups) > 0 {
		filter["consumerGroup"] = bson.M{"$in": groups}
		if !s.caps.ScansFilters {
			opts.SetHint(queueGroupDueIndex)
		}
	}
	docs, err := findAll[queueDoc](ctx, s, s.queue, "find claimable attempts", filter, opts)
	if err != nil {
		return nil, err
	}
	out := make([]*pulsetype.Attempt, len(docs))
	for i := range docs {
		out[i] = docs[i].attempt()
	}
	return out, nil
}

// attempt returns the queue document as the pending, unleased attempt it stands for.
func (d *queueDoc) attempt() *pulsetype.Attempt {
	return &pulsetype.Attempt{ID: d.ID, DeliveryID: d.DeliveryID, EventID: d.EventID, ConsumerGroup: d.ConsumerGroup, Topic: d.Topic,
		Number: d.Attempt, Uncounted: d.Uncounted, Status: pulsetype.StatusPending, CreatedAt: d.CreatedAt, NextAttemptAt: d.NextAttemptAt,
		Incarnation: d.Incarnation, FirstAttemptAt: timeOrZero(d.FirstAttemptAt)}
}

// ClaimAttempts leases the given unleased attempts (as read from the queue, or as FanOut created them) with
// one updateMany of their history documents whose filter holds their ids, status pending and no lease, so
// concurrent replicas never lease one attempt twice. The attempts it wins share one fresh UUIDv7 fencing
// token (the fencing token of every later write, together with the attempt id), lockOwner owner, lockedAt,
// heartbeatAt and startedAt now, and lockedUntil now + lease timeout; one update of their queue documents then
// copies the lease, so claims of the queue skip them. When the update matched fewer than all of them, a
// second query reads back every one's state: the ones leased under the token are ours, and the queue
// documents of the others are corrected (leased elsewhere, or ended). Each write and the read-back are
// re-issued while the database does not answer (an election, a lost reply), for up to the lease timeout.
// It returns the leased attempts with their lease fields set, possibly none; it does not modify its argument.
func (s *Store) ClaimAttempts(ctx context.Context, owner string, attempts []*pulsetype.Attempt) ([]*pulsetype.Attempt, error) {
	if len(attempts) == 0 {
		return nil, nil
	}
	l := s.newLease(owner)
	// The claim's writes are re-issued (see reissue) until the lease they grant would run out: an election
	// that answers none of them for seconds must not leave a claim that applied unknown to this process, to be
	// reaped after its lease as worker_lost (a failed attempt without a POST).
	ctx, cancel := context.WithTimeout(ctx, s.opts.LeaseTimeout)
	defer cancel()
	ids := idsOf(attempts, func(a *pulsetype.Attempt) string { return a.ID })
	// Re-issued on a retryable error with the same lease: a second try matches only what the first did not
	// lease, so its count falls short and the read-back by token below finds every attempt either try won.
	res, err := s.updateMany(ctx, s.history, unleased(bson.M{"$in": ids}), bson.M{"$set": l.historySet()})
	if err != nil {
		return nil, wrap("claim attempts", err)
	}
	var out []*pulsetype.Attempt
	if int(res.MatchedCount) == len(attempts) {
		out = make([]*pulsetype.Attempt, len(attempts))
		for i, a := range attempts {
			c := *a
			c.LeaseOwner, c.FencingToken, c.LeasedUntil, c.StartedAt = l.owner, l.token, &l.until, &l.at
			out[i] = &c
		}
	} else { // some were leased by another replica first, or have ended: read back which are ours
		// Read again while the server does not answer, as the claim was: the read-back is what tells which
		// attempts the claim leased.
		docs, err := reread[attemptDoc](ctx, s, s.history, "read back claimed attempts", bson.M{"_id": bson.M{"$in": ids}})
		if err != nil {
			return nil, err
		}
		var stale []*attemptDoc
		for i := range docs {
			if docs[i].FencingToken == l.token && docs[i].Status == pulsetype.StatusPending {
				out = append(out, docs[i].attempt())
			} else {
				stale = append(stale, &docs[i])
			}
		}
		if err := s.hintQueue(ctx, stale); err != nil { // hints only: the attempts leased are still ours
			s.log.Warn().Err(err).Int("attempts", len(stale)).Msg("correct the queue hints of attempts claimed elsewhere failed")
		}
	}
	if len(out) > 0 {
		leased := idsOf(out, func(a *pulsetype.Attempt) string { return a.ID })
		// Re-issued on a retryable error: the copy of a lease only this call holds sets the same values again.
		// The copy is a hint (see queueDoc): when it fails, the attempts are still this claim's and are run; a
		// claim that finds one in the queue without it matches nothing in the history and corrects the hint.
		if _, err := s.updateMany(ctx, s.queue, bson.M{"_id": bson.M{"$in": leased}}, bson.M{"$set": l.queueSet()}); err != nil {
			s.log.Warn().Err(err).Int("attempts", len(leased)).Msg("copy leases to the queue failed: the claimed attempts run, their queue hints are corrected later")
		}
	}
	return out, nil
}

// Renew extends the given leases to now + lease timeout (never shortening one: a later renewal may have
// landed first) and stamps heartbeatAt, with one updateMany fenced by
// the attempt ids, their tokens and status pending. When it matched fewer than all, one query finds which are
// still held. It returns the leases that were lost (reaped, released or no longer pending).
func (s *Store) Renew(ctx context.Context, leases []pulsetype.LeaseKey) (lost []pulsetype.LeaseKey, err error) {
	if len(leases) == 0 {
		return nil, nil
	}
	now := s.now()
	filter := fence(leases...)
	// $max: renewals may land out of order (the heartbeat does not wait for one before it sends the next), and
	// an earlier one landing last must not shorten the lease a later one granted.
	// Re-issued on a retryable error: $max sets the same values again, and the fence matches every lease
	// still held whichever try applied, so the count below is the same.
	res, err := s.updateMany(ctx, s.history, filter, bson.M{"$max": bson.M{fieldLeasedUntil: now.Add(s.opts.LeaseTimeout), fieldHeartbeatAt: now}})
	if err != nil {
		return nil, wrap("renew leases", err)
	}
	if int(res.MatchedCount) == len(leases) {
		return nil, nil
	}
	held, err := findAll[attemptDoc](ctx, s, s.history, "find renewed leases", filter, options.Find().SetProjection(bson.M{fieldFencingToken: 1}))
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

// ReleaseAttempt gives a leased attempt back unstarted (its lease fields removed, fenced by its token, and
// its queue document's copy of the lease), for a claim that must not run after all. It returns
// pulsetype.ErrLeaseLost when the lease is no longer held.
func (s *Store) ReleaseAttempt(ctx context.Context, a *pulsetype.Attempt) error {
	res, err := s.history.UpdateOne(ctx, fence(a.Key()), bson.M{"$unset": historyLeaseUnset})
	if err != nil {
		return wrap("release attempt", err)
	}
	if res.MatchedCount == 0 {
		return pulsetype.ErrLeaseLost
	}
	// The queue's copy only while it is this lease's: a claim after the release may have copied its own.
	copyOf := bson.M{"_id": a.ID, fieldFencingToken: a.FencingToken}
	if _, err := s.queue.UpdateOne(ctx, copyOf, bson.M{"$unset": queueLeaseUnset}); err != nil {
		return wrap("release attempt in the queue", err)
	}
	return nil
}
