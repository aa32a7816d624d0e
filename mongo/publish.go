package mongo

import (
	"context"
	"errors"
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
// createdAt in the write that makes an event visible (docs/delivery.md, "Publishing"): the events are
// inserted staged (invisible), their outbox documents written, then each is committed by an update filtered
// on staged (see publishRound); a crash before the commit leaves staged events that the sweeper removes.
// Concurrent calls with one event each share one round (groupCommit), each returning once its own event is
// durable, with its own outcome. ExpiresAt is set here and the events carry fanout=true until FanOut created
// their deliveries. It returns pulsetype.ErrIDConflict when an id is already used with other content
// (nothing is stored then).
func (s *Store) Publish(ctx context.Context, events []*pulsetype.Event) ([]pulsetype.Published, error) {
	if len(events) == 1 {
		p, err := s.publishes.publish(ctx, events[0])
		if err != nil {
			return nil, err
		}
		return []pulsetype.Published{p}, nil
	}
	s.stamp(events)
	// A concurrent publish of the same ids can make one round fail (its staged documents committed or
	// removed by the other): try again, reading what the other one stored.
	for try := 0; ; try++ {
		outcomes, err := s.publishRound(ctx, events, true)
		if err != nil {
			return nil, err
		}
		out := make([]pulsetype.Published, len(events))
		retry := false
		for i, o := range outcomes {
			switch {
			case errors.Is(o.err, errPublishRace):
				retry = true
			case o.err != nil:
				return nil, o.err
			}
			out[i] = o.published
		}
		if !retry {
			return out, nil
		}
		if try == maxPublishTries-1 {
			return nil, errors.New("publish: concurrent publishes of the same ids kept colliding")
		}
	}
}

// stamp sets the events' CreatedAt (until the commit stamps it) and ExpiresAt.
func (s *Store) stamp(events []*pulsetype.Event) {
	now := s.now()
	for _, e := range events {
		e.CreatedAt, e.ExpiresAt = now, expiry(now, s.opts.EventRetention)
	}
}

// maxPublishTries bounds how often a publish runs its round again after a concurrent publish of the same id
// interfered (errPublishRace).
const maxPublishTries = 4

// errPublishRace reports that a concurrent publish of the same id interfered; the round runs again.
var errPublishRace = errors.New("concurrent publish of the same ids")

// publishOutcome is what one round did with one event: stored (or found stored) as published says, or err.
type publishOutcome struct {
	published pulsetype.Published
	err       error
}

// publishRound stores events (distinct ids, each with its CreatedAt and ExpiresAt set) in at most six
// commands:
//
//  1. one insert of the documents, staged (invisible; a duplicate key means the id is taken);
//  2. one read of the documents whose ids were taken, compared with what is published: the same content
//     (pulsetype.SameJSON for the data) is the event published before (Existing), other content is
//     pulsetype.ErrIDConflict, and a document still staged (a concurrent publish, or one that crashed before
//     its commit) is committed here too, answered as a re-publish (Existing: the publish that staged it is
//     the one that published it), its outbox document recalled from the fan-out repair's deferral;
//  3. one insert of the outbox documents of the events it commits (a duplicate is one a concurrent or
//     earlier round wrote, and stays);
//  4. the commit: one update filtered on the ids and staged that removes staged, sets the fanout mark and
//     stamps createdAt ($currentDate) of each, so of concurrent commits one applies per event (a
//     findAndModify for one event);
//  5. one read of the committed events' createdAt (none for one event).
//
// With all set (an array), a conflict of one event removes what this round inserted and fails the whole
// round with pulsetype.ErrIDConflict; otherwise each event has an outcome of its own. An event whose
// document a concurrent round removed before its commit has errPublishRace: the caller runs it again. The
// returned error is the database's, for the whole round.
func (s *Store) publishRound(ctx context.Context, events []*pulsetype.Event, all bool) ([]publishOutcome, error) {
	out := make([]publishOutcome, len(events))
	docs := make([]any, len(events))
	for i, e := range events {
		docs[i] = s.newEventDoc(e, true)
		out[i].published.Event = e
	}
	taken := map[int]bool{}
	if _, err := s.events.InsertMany(ctx, docs, options.InsertMany().SetOrdered(false)); err != nil {
		var bwe mongo.BulkWriteException
		if !onlyDuplicates(err) || !errors.As(err, &bwe) {
			return nil, wrap("insert events", err)
		}
		for _, we := range bwe.WriteErrors {
			taken[we.Index] = true
		}
	}
	var fresh []string // ids this round inserted
	for i, e := range events {
		if !taken[i] {
			fresh = append(fresh, e.ID)
		}
	}
	undo := func() {
		if len(fresh) > 0 { // only what this round inserted: the rest may be another publish's
			bg := context.WithoutCancel(ctx)
			_, _ = s.events.DeleteMany(bg, bson.M{"_id": bson.M{"$in": fresh}, "staged": true})
			_, _ = s.outbox.DeleteMany(bg, bson.M{"_id": bson.M{"$in": fresh}})
		}
	}
	commit := map[string]bool{}
	for _, id := range fresh {
		commit[id] = true
	}
	var adopted []string // ids another publish staged with the same content, committed here too
	if len(taken) > 0 {
		var err error
		adopted, err = s.resolveTaken(ctx, events, taken, out)
		if err != nil {
			undo()
			return nil, err
		}
		for i := range taken {
			if all && out[i].err != nil {
				undo()
				if errors.Is(out[i].err, pulsetype.ErrIDConflict) {
					return nil, pulsetype.ErrIDConflict
				}
				return out, nil // errPublishRace: the caller runs the round again
			}
		}
		for _, id := range adopted {
			commit[id] = true
		}
	}
	if len(commit) == 0 {
		return out, nil
	}
	var marks []any
	ids := make([]string, 0, len(commit))
	for _, e := range events {
		if commit[e.ID] {
			ids = append(ids, e.ID)
			marks = append(marks, &outboxDoc{ID: e.ID, Topic: e.Topic, OrderingKey: e.OrderingKey, CreatedAt: e.CreatedAt})
		}
	}
	if _, err := s.outbox.InsertMany(ctx, marks, options.InsertMany().SetOrdered(false)); err != nil && !onlyDuplicates(err) {
		undo()
		return nil, wrap("insert outbox documents", err)
	}
	if len(adopted) > 0 {
		// Their outbox documents may have been put aside by the fan-out repair while they were staged
		// (FanOutStale): the repair must see them again once they are committed.
		if _, err := s.outbox.UpdateMany(ctx, bson.M{"_id": bson.M{"$in": adopted}}, bson.M{"$unset": bson.M{"deferredUntil": ""}}); err != nil {
			undo()
			return nil, wrap("recall outbox documents", err)
		}
	}
	stamps, err := s.commitEvents(ctx, ids)
	if err != nil {
		return nil, err // staged documents left behind are removed by the sweeper
	}
	for i, e := range events {
		if !commit[e.ID] {
			continue
		}
		t, ok := stamps[e.ID]
		if !ok {
			out[i].err = errPublishRace // removed by a concurrent round before it was committed
			continue
		}
		e.CreatedAt = t
		// An event another publish staged is that publish's: this one answers as a re-publish.
		out[i].published = pulsetype.Published{Event: e, Existing: slices.Contains(adopted, e.ID)}
	}
	return out, nil
}

// resolveTaken reads the stored documents of the events at the indexes of taken (ids already used) and sets
// their outcomes: Existing, pulsetype.ErrIDConflict, or errPublishRace (gone meanwhile; an expired one is
// removed first). It returns the ids of those still staged with the same content, for the caller to commit.
func (s *Store) resolveTaken(ctx context.Context, events []*pulsetype.Event, taken map[int]bool, out []publishOutcome) (adopted []string, err error) {
	ids := make([]string, 0, len(taken))
	for i := range taken {
		ids = append(ids, events[i].ID)
	}
	existing, err := s.findEvents(ctx, ids)
	if err != nil {
		return nil, err
	}
	now := s.now()
	for i := range taken {
		e := events[i]
		ex, ok := existing[e.ID]
		switch {
		case !ok:
			out[i].err = errPublishRace
		case expired(ex.ExpiresAt, now):
			// Gone for every reader; remove it so the id can be published again.
			if _, err := s.events.DeleteOne(ctx, bson.M{"_id": e.ID, "expiresAt": ex.ExpiresAt}); err != nil {
				return nil, wrap("remove expired event", err)
			}
			out[i].err = errPublishRace
		case !sameContent(ex, e):
			out[i].err = pulsetype.ErrIDConflict
		case ex.Staged:
			adopted = append(adopted, e.ID)
		default:
			out[i].published = pulsetype.Published{Event: ex.event(), Existing: true}
		}
	}
	return adopted, nil
}

// commitEvents commits the staged events ids (step 4 of publishRound) and returns the createdAt of each one
// committed, by this call or a concurrent one; an id missing from the answer was removed before its commit.
// One event costs one findAndModify, more an update and a read.
func (s *Store) commitEvents(ctx context.Context, ids []string) (map[string]time.Time, error) {
	update := bson.M{"$unset": bson.M{"staged": ""}, "$set": bson.M{"fanout": true}, "$currentDate": bson.M{"createdAt": true}}
	if len(ids) == 1 {
		var d eventDoc
		err := s.events.FindOneAndUpdate(ctx, bson.M{"_id": ids[0], "staged": true}, update,
			options.FindOneAndUpdate().SetReturnDocument(options.After)).Decode(&d)
		if err == nil {
			return map[string]time.Time{d.ID: d.CreatedAt.UTC()}, nil
		}
		if !errors.Is(err, mongo.ErrNoDocuments) {
			return nil, wrap("commit event", err)
		}
		// Committed or removed by a concurrent publish: read which.
	} else if _, err := s.events.UpdateMany(ctx, bson.M{"_id": bson.M{"$in": ids}, "staged": true}, update); err != nil {
		// One command, so that a publisher that dies after sending it leaves an array all committed, not
		// in part (the server completes it).
		return nil, wrap("commit events", err)
	}
	committed, err := findAll[eventDoc](ctx, s.events, "read back committed events",
		bson.M{"_id": bson.M{"$in": ids}, "staged": bson.M{"$ne": true}}, options.Find().SetProjection(bson.M{"createdAt": 1}))
	if err != nil {
		return nil, err
	}
	stamps := make(map[string]time.Time, len(committed))
	for _, d := range committed {
		stamps[d.ID] = d.CreatedAt.UTC()
	}
	return stamps, nil
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
	if _, err := s.events.UpdateMany(ctx, bson.M{"_id": bson.M{"$in": eventIDs}}, bson.M{"$unset": bson.M{"fanout": ""}}); err != nil {
		return wrap("clear fanout mark", err)
	}
	if _, err := s.outbox.DeleteMany(ctx, bson.M{"_id": bson.M{"$in": eventIDs}}); err != nil {
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
	until := now.Add(s.opts.LeaseTimeout)
	token := ""
	var deliveries, attempts, queue []any
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
			a := newAttemptDoc(d.delivery().Ref(), 1, now, now)
			q := queued(a, e.OrderingKey, e.CreatedAt)
			if claim != nil && claim(sub.ID) {
				if token == "" {
					token = uuid.Must(uuid.NewV7()).String()
				}
				a.LeaseOwner, a.FencingToken, a.LeasedAt, a.LeasedUntil, a.HeartbeatAt, a.StartedAt = owner, token, &now, &until, &now, &now
				q.LeasedUntil, q.FencingToken = &until, token
			}
			deliveries = append(deliveries, d)
			attempts = append(attempts, a)
			queue = append(queue, q)
		}
	}
	if len(deliveries) == 0 {
		return nil, nil
	}
	unordered := options.InsertMany().SetOrdered(false)
	if _, err := s.queue.InsertMany(ctx, queue, unordered); err != nil && !onlyDuplicates(err) {
		return nil, wrap("queue first attempts", err)
	}
	if _, err := s.deliveries.InsertMany(ctx, deliveries, unordered); err != nil && !onlyDuplicates(err) {
		return nil, wrap("insert deliveries", err)
	}
	_, err := s.history.InsertMany(ctx, attempts, unordered)
	if err != nil && !onlyDuplicates(err) {
		return nil, wrap("insert first attempts", err)
	}
	out := make([]*pulsetype.Attempt, 0, len(attempts))
	for i, doc := range attempts {
		if !failedAt(err, i) {
			out = append(out, doc.(*attemptDoc).attempt())
		}
	}
	if err := s.unqueueDuplicates(ctx, attempts, err); err != nil {
		return nil, err
	}
	return out, nil
}

// failedAt reports whether the insertMany that returned err failed to insert its document at index i.
func failedAt(err error, i int) bool {
	var bwe mongo.BulkWriteException
	if !errors.As(err, &bwe) {
		return false
	}
	return slices.ContainsFunc(bwe.WriteErrors, func(we mongo.BulkWriteError) bool { return we.Index == i })
}

// unqueueDuplicates removes the queue documents of the attempts (as inserted into the history with the
// insertMany that returned err) that were duplicates: another writer created that attempt number of the
// delivery first, with its own queue document.
func (s *Store) unqueueDuplicates(ctx context.Context, attempts []any, err error) error {
	var ids []string
	for i, doc := range attempts {
		if failedAt(err, i) {
			ids = append(ids, doc.(*attemptDoc).ID)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	if _, err := s.queue.DeleteMany(ctx, bson.M{"_id": bson.M{"$in": ids}}); err != nil {
		return wrap("remove queue documents of duplicate attempts", err)
	}
	return nil
}

// FanOutStale runs FanOut for up to limit events still marked for fan-out whose outbox documents are older
// than age: events whose publisher died before fanning them out (docs/delivery.md, "Recovery after a
// crash"). It reads the outbox, never the retained events, and removes outbox documents left without a
// mark: of events whose marks were cleared, and, after StagedTimeout, of publishes that never committed.
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
	marks, err := findAll[outboxDoc](ctx, s.outbox, "find unfinished fan-outs", filter,
		options.Find().SetSort(bson.D{{Key: "createdAt", Value: 1}}).SetLimit(int64(limit)))
	if err != nil || len(marks) == 0 {
		return 0, false, err
	}
	ids := make([]string, len(marks))
	for i, m := range marks {
		ids[i] = m.ID
	}
	docs, err := s.findEvents(ctx, ids)
	if err != nil {
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
		if _, err := s.outbox.UpdateMany(ctx, bson.M{"_id": bson.M{"$in": aside}},
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
