package mongo

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/google/uuid"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// Fan-out: each committed event gets a delivery and a first attempt for every consumer group that wants it
// (pulsetype.Endpoint.Wants), queued first; FanOutStale repairs a fan-out its publisher did not finish.

// deliveryNamespace makes delivery ids deterministic: UUIDv5 of (consumer group, event id). Two replicas
// fanning out the same event compute the same id, so their first attempts land on one delivery.
var deliveryNamespace = uuid.MustParse("6f1c3c1e-5b7a-4b5e-9a63-6d2f0b8c0a11")

// DeliveryID returns the id of the delivery of eventID to consumerGroup.
func DeliveryID(consumerGroup, eventID string) string {
	return uuid.NewSHA1(deliveryNamespace, []byte(consumerGroup+"\x00"+eventID)).String()
}

// FanOut creates, for each event, the delivery and its first attempt for every consumer group subscribed to
// the event's topic, with four commands per batch: one query for the subscriptions, one insert of the first
// attempts' queue documents, one insertMany of deliveries, one of first attempts (see insertDeliveries). It is
// idempotent: duplicate-key errors mean another replica (or an earlier try) already did it. It leaves the
// events' fanout mark for the caller to clear with ClearFanOut (a crash before that is repaired by
// FanOutStale). It returns the first attempts it inserted, unleased.
func (s *Store) FanOut(ctx context.Context, events []*pulsetype.Event) ([]*pulsetype.Attempt, error) {
	return s.FanOutClaiming(ctx, "", events, nil)
}

// FanOutClaiming is FanOut for the dispatcher that runs what it fans out: each first attempt of a consumer
// group for which claim returns true (it is called once per attempt to create, in event order, before any
// write) is inserted already leased to owner, with its queue document carrying the lease's copy, exactly as
// ClaimAttempts would then lease it (one fresh UUIDv7 fencing token for the batch, lockOwner owner,
// lockedAt, heartbeatAt and startedAt now, lockedUntil now + lease timeout). It saves the claim's two
// commands per batch and its two writes per attempt, and no other replica can lease the attempt in between.
// A process that dies before its POST leaves the lease to expire, as after any claim: the reaper records the
// attempt as worker_lost and the retry policy follows. It returns the first attempts it inserted, the leased
// ones with their lease fields set; an attempt another replica created first is not among them, whatever
// claim said. claim nil leases none.
func (s *Store) FanOutClaiming(ctx context.Context, owner string, events []*pulsetype.Event, claim func(group string) bool) ([]*pulsetype.Attempt, error) {
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
	return s.insertDeliveries(ctx, events, subs, owner, claim)
}

// ClearFanOut removes the fanout mark of events whose deliveries exist, with one updateMany, then their
// outbox documents. Clearing late is harmless: FanOutStale only takes marks older than one lease timeout, and
// a repeated fan-out is a no-op.
func (s *Store) ClearFanOut(ctx context.Context, eventIDs []string) error {
	if len(eventIDs) == 0 {
		return nil
	}
	// Filtered on the ids alone: unsetting a mark that is gone changes nothing, and a filter of ids alone is
	// what the embedded database writes cheapest (by _id, without a check first).
	if _, err := s.updateMany(ctx, s.events, bson.M{"_id": bson.M{"$in": eventIDs}}, bson.M{"$unset": bson.M{"fanout": ""}}); err != nil {
		return wrap("clear fanout mark", err)
	}
	if _, err := s.deleteMany(ctx, s.outbox, bson.M{"_id": bson.M{"$in": eventIDs}}); err != nil {
		return wrap("remove outbox documents", err)
	}
	return nil
}

// insertDeliveries creates the delivery and first attempt of each event for each subscription of its topic:
// one insertMany of the attempts' queue documents first (so that no pending attempt or delivery is ever
// missing from the queue), then one of the deliveries and one of the attempts; duplicates (already created)
// are no-ops, and the queue documents of attempts another replica created first are removed again (that
// replica wrote its own). The attempts of the groups claim accepts are inserted leased to owner (see
// FanOutClaiming). It returns the first attempts it inserted.
func (s *Store) insertDeliveries(ctx context.Context, events []*pulsetype.Event, subs []subscriptionDoc, owner string, claim func(string) bool) ([]*pulsetype.Attempt, error) {
	now := s.now()
	var l *lease // one lease for the batch, taken with its first claimed attempt
	var deliveries, attempts, queue []any
	failed := map[int]bool{} // indices in attempts of the attempts ended as filter_error
	for _, e := range events {
		in := pulsetype.InputOf(e) // one per event: its data is decoded once for every group's filter
		for i := range subs {
			sub := &subs[i]
			ok, ferr := sub.decide(in, &s.filters)
			if !ok && ferr == nil {
				continue
			}
			d := &deliveryDoc{
				ID: DeliveryID(sub.ID, e.ID), EventID: e.ID, ConsumerGroup: sub.ID, Topic: e.Topic, OrderingKey: e.OrderingKey,
				Incarnation:    sub.Incarnation,
				EventCreatedAt: e.CreatedAt, Status: pulsetype.StatusPending, CreatedAt: now, UpdatedAt: now,
			}
			a := newAttemptDoc(d.delivery().Ref(), 1, now, now)
			if ferr != nil {
				s.endByFilter(d, a, sub, ferr, now)
				failed[len(attempts)] = true
				deliveries = append(deliveries, d)
				attempts = append(attempts, a)
				continue
			}
			q := queued(a, e.OrderingKey, e.CreatedAt)
			if claim != nil && claim(sub.ID) {
				if l == nil {
					l = &lease{owner: owner, token: newFencingToken(), at: now, until: now.Add(s.opts.LeaseTimeout)}
				}
				l.apply(a, q)
			}
			deliveries = append(deliveries, d)
			attempts = append(attempts, a)
			queue = append(queue, q)
		}
	}
	if len(deliveries) == 0 {
		return nil, nil
	}
	// Each insert is re-issued while the database does not answer (an election, a lost reply), for up to a
	// lease timeout: attempts inserted leased that this call never learns of would be reaped as worker_lost.
	ctx, cancel := context.WithTimeout(ctx, s.opts.LeaseTimeout)
	defer cancel()
	if len(queue) > 0 { // none when every delivery ended as filter_error
		if err := s.insertNew(ctx, s.queue, queue); err != nil {
			return nil, wrap("queue first attempts", err)
		}
	}
	if err := s.insertNew(ctx, s.deliveries, deliveries); err != nil {
		return nil, wrap("insert deliveries", err)
	}
	inserted, err := s.insertAttempts(ctx, attempts)
	if err != nil {
		return nil, wrap("insert first attempts", err)
	}
	out := make([]*pulsetype.Attempt, 0, len(attempts))
	for i, doc := range attempts {
		if inserted[i] && !failed[i] {
			out = append(out, doc.(*attemptDoc).attempt())
		}
	}
	if err := s.unqueueDuplicates(ctx, attempts, inserted); err != nil {
		return nil, err
	}
	return out, nil
}

// endByFilter makes the delivery d and its first attempt a, not inserted yet, terminal as
// pulsetype.CodeFilterError with ferr's message (no queue document, no POST), counts it
// (Options.FilterErrors) and logs the first of each group and filter in this process.
func (s *Store) endByFilter(d *deliveryDoc, a *attemptDoc, sub *subscriptionDoc, ferr error, now time.Time) {
	info := &pulsetype.ErrorInfo{Code: pulsetype.CodeFilterError, Message: "the consumer group's filter failed for this event: " + ferr.Error()}
	exp := expiry(now, s.opts.HistoryRetention)
	d.Status, d.EndedAt, d.FinalAttempt, d.Error, d.ExpiresAt = pulsetype.StatusError, &now, 1, info, exp
	a.Status, a.EndedAt, a.Terminal, a.Error, a.ExpiresAt = pulsetype.StatusError, &now, true, info, exp
	if s.opts.FilterErrors != nil {
		s.opts.FilterErrors(sub.ID)
	}
	if _, logged := s.filterLogged.LoadOrStore(sub.ID+"\x00"+sub.Filter, true); !logged {
		s.log.Warn().Str("consumer_group", sub.ID).Str("filter", sub.Filter).Str("event_id", d.EventID).Str("error", ferr.Error()).
			Msg("the consumer group's filter failed for an event: its delivery ends as filter_error (logged once per group and filter; pulse_filter_errors_total counts them)")
	}
}

// unqueueDuplicates removes the queue documents of the attempts that were not inserted (insertAttempts):
// another writer created that attempt number of the delivery first, with its own queue document.
func (s *Store) unqueueDuplicates(ctx context.Context, attempts []any, inserted []bool) error {
	var ids []string
	for i, doc := range attempts {
		if !inserted[i] {
			ids = append(ids, doc.(*attemptDoc).ID)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	if _, err := s.deleteMany(ctx, s.queue, bson.M{"_id": bson.M{"$in": ids}}); err != nil {
		return wrap("remove queue documents of duplicate attempts", err)
	}
	return nil
}

// FanOutStale runs FanOut for up to limit events still marked for fan-out whose outbox documents are older
// than age: events whose publisher died before fanning them out (docs/delivery.md, "Recovery after a
// crash"). It reads the outbox, never the retained events, and removes outbox documents left without a
// mark: of events whose marks were cleared, and, after StagedTimeout, of publishes that never committed.
// An event still staged whose array has a committed event is committed first and fanned out with the
// others (rollForward).
// Until then it puts aside the documents of events still staged or missing (deferredUntil, deferFactor ×
// age from now), so that a crowd of them never hides a newer interrupted fan-out; it reads on past a page of
// such documents, up to maxFanOutPages pages. It returns how many first attempts it inserted.
func (s *Store) FanOutStale(ctx context.Context, age time.Duration, limit int) (int, error) {
	total := 0
	for range maxFanOutPages {
		n, readOn, err := s.fanOutStalePage(ctx, age, limit)
		total += n
		if err != nil || !readOn {
			return total, err
		}
	}
	return total, nil
}

// maxFanOutPages bounds the pages of outbox documents one FanOutStale reads while it only finds documents to
// put aside.
const maxFanOutPages = 10

// deferFactor × the age FanOutStale is given is how long it puts aside the outbox document of an event still
// staged (its publish may yet commit it) or missing.
const deferFactor = 10

// fanOutStalePage is one page of FanOutStale: it returns the first attempts it inserted and whether the
// page was full and all put aside (the next page may hold work).
func (s *Store) fanOutStalePage(ctx context.Context, age time.Duration, limit int) (int, bool, error) {
	now := s.now()
	filter := bson.M{"createdAt": bson.M{"$lt": now.Add(-age)},
		"$or": bson.A{bson.M{"deferredUntil": bson.M{"$exists": false}}, bson.M{"deferredUntil": bson.M{"$lte": now}}}}
	marks, err := findAll[outboxDoc](ctx, s, s.outbox, "find unfinished fan-outs", filter,
		options.Find().SetSort(bson.D{{Key: "createdAt", Value: 1}}).SetLimit(int64(limit)))
	if err != nil || len(marks) == 0 {
		return 0, false, err
	}
	ids := idsOf(marks, func(m outboxDoc) string { return m.ID })
	docs, err := s.findEvents(ctx, ids)
	if err != nil {
		return 0, false, err
	}
	if err := s.rollForwardStaged(ctx, docs); err != nil {
		return 0, false, err
	}
	var events []*pulsetype.Event
	var done, aside []string
	for _, m := range marks {
		d, ok := docs[m.ID]
		switch {
		case ok && d.Fanout && !d.Staged:
			events = append(events, d.event())
			done = append(done, m.ID)
		case ok && !d.Staged && !d.Fanout, m.CreatedAt.Before(now.Add(-StagedTimeout)):
			done = append(done, m.ID) // fanned out already, or a publish that never committed
		default: // staged (its publish may still commit it), or not written yet
			aside = append(aside, m.ID)
		}
	}
	if len(aside) > 0 {
		if _, err := s.updateMany(ctx, s.outbox, bson.M{"_id": bson.M{"$in": aside}},
			bson.M{"$set": bson.M{"deferredUntil": now.Add(deferFactor * age)}}); err != nil {
			return 0, false, wrap("put aside outbox documents", err)
		}
	}
	inserted, err := s.FanOut(ctx, events)
	if err != nil {
		return 0, false, err
	}
	readOn := len(aside) == limit
	return len(inserted), readOn, s.ClearFanOut(ctx, done)
}

// rollForwardStaged rolls forward the arrays of the staged events among docs (rollForward) and replaces, in
// docs, each event it committed by its committed document.
func (s *Store) rollForwardStaged(ctx context.Context, docs map[string]*eventDoc) error {
	batches := map[string]bool{}
	for _, d := range docs {
		if d.Staged && d.Batch != "" {
			batches[d.Batch] = true
		}
	}
	committed, err := s.rollForward(ctx, slices.Collect(maps.Keys(batches)))
	if err != nil {
		return err
	}
	for id, d := range committed {
		if _, ok := docs[id]; ok {
			docs[id] = d
		}
	}
	return nil
}
