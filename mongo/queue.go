package mongo

import (
	"context"
	"errors"
	"slices"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/rs/zerolog"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// QueuedDeliveries is the repair scan's read of pending work: the deliveries of the queue documents after
// afterID (by delivery id), at most limit of them, with one query of the queue and one read each of their
// deliveries and of their attempts by id. It returns the pending ones, each delivery's queued attempts as
// their history documents say (by number, the latest last), and the delivery id to continue after ("" once
// the queue's end is reached). Deliveries of limit are read whether pending or not, so repeated calls walk
// the whole queue.
//
// A delivery's attempts are those of its queue documents that exist: one queued but not inserted (its
// creator is under way, or died in between) is left out, so the repair scan creates the attempt after the
// latest one listed (or the first, or reopenedAttempt, when none is). A delivery whose latest attempt ended
// less than half a lease timeout ago is left out: the worker that ended it is recording its next step. On
// the way it notes what the queue holds for nothing (Repairs.Unqueue), one lease timeout after it was queued
// where a writer may still be under way: the documents of an ended delivery whose attempts are not pending;
// of a delivery that does not exist (its fan-out died before writing it; the event's fanout mark makes it
// again); of an ended attempt with a later one inserted; and of an attempt never inserted. It also notes the
// pending attempts whose lease copies differ from their leases (Repairs.Attempts), so that once they are
// corrected the reaper finds every expired lease.
func (s *Store) QueuedDeliveries(ctx context.Context, afterID string, limit int) (pulsetype.QueuedPage, error) {
	var page pulsetype.QueuedPage
	queued, more, err := s.queuedAfter(ctx, afterID, limit)
	if err != nil || len(queued) == 0 {
		return page, err
	}
	var deliveryIDs, attemptIDs []string
	for _, q := range queued { // by delivery id: a delivery's documents are adjacent
		if len(deliveryIDs) == 0 || deliveryIDs[len(deliveryIDs)-1] != q.DeliveryID {
			deliveryIDs = append(deliveryIDs, q.DeliveryID)
		}
		attemptIDs = append(attemptIDs, q.ID)
	}
	if more {
		page.Next = deliveryIDs[len(deliveryIDs)-1]
	}
	deliveries, err := findAll[deliveryDoc](ctx, s, s.deliveries, "read queued deliveries", bson.M{"_id": bson.M{"$in": deliveryIDs}})
	if err != nil {
		return page, err
	}
	history, err := findAll[attemptDoc](ctx, s, s.history, "read queued attempts", bson.M{"_id": bson.M{"$in": attemptIDs}})
	if err != nil {
		return page, err
	}
	byDelivery := map[string]*deliveryDoc{}
	for i := range deliveries {
		byDelivery[deliveries[i].ID] = &deliveries[i]
	}
	byAttempt := map[string]*attemptDoc{}
	for i := range history {
		byAttempt[history[i].ID] = &history[i]
	}
	now := s.now()
	old, settling := now.Add(-s.opts.LeaseTimeout), now.Add(-s.opts.LeaseTimeout/2)
	var unqueue []string
	var stale []*pulsetype.Attempt
	attempts := map[string][]*pulsetype.Attempt{}
	var out []*pulsetype.Delivery
	for i := 0; i < len(queued); {
		j := i
		for j < len(queued) && queued[j].DeliveryID == queued[i].DeliveryID {
			j++
		}
		docs := queued[i:j] // one delivery's, by attempt number
		i = j
		d := byDelivery[docs[0].DeliveryID]
		switch {
		case d == nil:
			for _, q := range docs {
				if q.CreatedAt.Before(old) {
					unqueue = append(unqueue, q.ID)
				}
			}
			continue
		case d.Status != pulsetype.StatusPending:
			for _, q := range docs {
				// An attempt not inserted yet may belong to a retry that reopens the delivery next.
				if a := byAttempt[q.ID]; a != nil && a.Status != pulsetype.StatusPending || a == nil && q.CreatedAt.Before(old) {
					unqueue = append(unqueue, q.ID)
				}
			}
			continue
		}
		latest := -1 // the latest queue document whose attempt exists
		for k, q := range docs {
			if byAttempt[q.ID] != nil {
				latest = k
			}
		}
		if latest >= 0 {
			if a := byAttempt[docs[latest].ID]; a.EndedAt != nil && a.EndedAt.After(settling) {
				continue // ended a moment ago: its worker is recording the next step
			}
		}
		abandoned := false
		for k, q := range docs {
			a := byAttempt[q.ID]
			switch {
			case a != nil && k < latest && a.Status != pulsetype.StatusPending:
				unqueue = append(unqueue, q.ID) // a later attempt exists: this one's follow-up is done
			case a != nil:
				attempts[d.ID] = append(attempts[d.ID], a.attempt())
				if a.Status == pulsetype.StatusPending && leaseCopyStale(&q, a) {
					stale = append(stale, a.attempt())
				}
			case q.CreatedAt.Before(old):
				unqueue = append(unqueue, q.ID) // its creator died before inserting it: the repair creates it
				abandoned = true
			}
		}
		if latest >= 0 || abandoned { // else its first attempt is being created
			out = append(out, d.delivery())
		}
	}
	for _, as := range attempts {
		slices.SortFunc(as, func(a, b *pulsetype.Attempt) int { return a.Number - b.Number })
	}
	page.Deliveries, page.Attempts, page.Repairs = out, attempts, pulsetype.QueueRepairs{Unqueue: unqueue, Attempts: stale}
	return page, nil
}

// RepairQueue makes the corrections a QueuedDeliveries read found due, with at most two commands: one delete
// of the queue documents that hold nothing, one bulk update of the lease copies that differ from their
// attempts' leases (a claimer died between its claim and the copy, or the copy lost a race; see hintQueue),
// so that claims skip leased attempts and the reaper finds expired ones. Both are idempotent. Errors are the
// database's, wrapped.
func (s *Store) RepairQueue(ctx context.Context, r pulsetype.QueueRepairs) error {
	if len(r.Unqueue) > 0 {
		if _, err := s.deleteMany(ctx, s.queue, bson.M{"_id": bson.M{"$in": r.Unqueue}}); err != nil {
			return wrap("remove stale queue documents", err)
		}
	}
	stale := make([]*attemptDoc, len(r.Attempts))
	for i, a := range r.Attempts {
		stale[i] = &attemptDoc{ID: a.ID, Status: a.Status, LeasedUntil: a.LeasedUntil, FencingToken: a.FencingToken}
	}
	return s.hintQueue(ctx, stale)
}

// queuedAfter returns the queue documents of the first limit deliveries after afterID, by delivery id and
// attempt number, and whether the queue holds more after them: one query of at most 4 × limit documents (a
// delivery rarely has more than two queued), the last delivery's cut off when the bound is reached (the next
// call reads it).
func (s *Store) queuedAfter(ctx context.Context, afterID string, limit int) ([]queueDoc, bool, error) {
	bound := 4 * limit
	queued, err := findAll[queueDoc](ctx, s, s.queue, "scan the queue", bson.M{"deliveryId": bson.M{"$gt": afterID}},
		options.Find().SetSort(bson.D{{Key: "deliveryId", Value: 1}, {Key: "attempt", Value: 1}}).SetLimit(int64(bound)))
	if err != nil {
		return nil, false, err
	}
	var ids []string
	for i, q := range queued {
		if len(ids) == 0 || ids[len(ids)-1] != q.DeliveryID {
			if len(ids) == limit {
				return queued[:i], true, nil
			}
			ids = append(ids, q.DeliveryID)
		}
	}
	if len(queued) < bound {
		return queued, false, nil
	}
	if len(ids) > 1 { // the last delivery may go on beyond the bound
		last := ids[len(ids)-1]
		queued = slices.DeleteFunc(queued, func(q queueDoc) bool { return q.DeliveryID == last })
	}
	return queued, true, nil
}

// queueMigration is the _id of the document in <prefix>.readiness that says the queue and the outbox hold
// the pending work and unfinished fan-outs that the database held when they were introduced (field at, set
// once done), and, until then, how far the migration got (migrationProgress).
const queueMigration = "queue-migration"

// migrationProgress is the queue migration's document in <prefix>.readiness: At once it is done; before,
// the last pending delivery queued (by _id) and the last marked event put in the outbox (by createdAt, then
// _id), written after each page, so a start that stops (its bound, a crash, a signal) is resumed by the
// next from there rather than from the beginning.
type migrationProgress struct {
	At              *time.Time `bson:"at,omitempty"`
	DeliveriesAfter string     `bson:"deliveriesAfter,omitempty"`
	DeliveriesDone  bool       `bson:"deliveriesDone,omitempty"`
	EventsAfter     string     `bson:"eventsAfter,omitempty"`
	EventsAfterAt   *time.Time `bson:"eventsAfterAt,omitempty"`
	Queued          int64      `bson:"queued,omitempty"`
	Outboxed        int64      `bson:"outboxed,omitempty"`
}

// migrateQueue fills the queue and the outbox from what a database written by an earlier version holds, once
// per database (until queueMigration records it done): the pending attempts (queued with their deliveries'
// lines), the latest attempt of each pending delivery that has none pending (queued, so that the repair scan
// moves it on; a delivery without any attempt gets a queue document from which the repair scan inserts
// attempt reopenedAttempt, or 1), and the events still marked for fan-out. It walks pending deliveries by _id
// (index pulse_deliveries_status_id) and marked events by createdAt (pulse_events_fanout) in pages of
// Options.PageSize, each page one read, one read of its attempts and one insert naming at most a page of
// documents, and records how far it got after each page (migrationProgress), logging one progress line per
// page: a start that stops part-way is resumed by the next start where it stopped. Concurrent runs converge
// (the documents keep their _id; a repeated queue document for a missing attempt loses to the first when the
// attempt is inserted).
func (s *Store) migrateQueue(ctx context.Context) error {
	readiness := s.db.Collection(s.opts.CollectionPrefix + ".readiness")
	var prog migrationProgress
	switch err := readiness.FindOne(ctx, bson.M{"_id": queueMigration}).Decode(&prog); {
	case err == nil && prog.At != nil:
		return nil
	case err != nil && !errors.Is(err, mongo.ErrNoDocuments):
		return wrap("read the queue migration", err)
	}
	record := func(set bson.M) error {
		_, err := readiness.UpdateOne(ctx, bson.M{"_id": queueMigration}, bson.M{"$set": set}, options.UpdateOne().SetUpsert(true))
		return wrap("record the queue migration's progress", err)
	}
	for !prog.DeliveriesDone {
		pending, err := findAll[deliveryDoc](ctx, s, s.deliveries, "find pending deliveries to queue",
			bson.M{"status": pulsetype.StatusPending, "_id": bson.M{"$gt": prog.DeliveriesAfter}},
			options.Find().SetSort(bson.D{{Key: "status", Value: 1}, {Key: "_id", Value: 1}}).SetLimit(int64(s.pageSize())))
		if err != nil {
			return err
		}
		n, err := s.queuePending(ctx, pending)
		if err != nil {
			return err
		}
		prog.Queued += n
		prog.DeliveriesDone = len(pending) < s.pageSize()
		if len(pending) > 0 {
			prog.DeliveriesAfter = pending[len(pending)-1].ID
		}
		if err := record(bson.M{"deliveriesAfter": prog.DeliveriesAfter, "deliveriesDone": prog.DeliveriesDone, "queued": prog.Queued}); err != nil {
			return err
		}
		level := zerolog.InfoLevel
		if prog.Queued == 0 {
			level = zerolog.DebugLevel // a new database: nothing to migrate, nothing to tell an operator
		}
		s.log.WithLevel(level).Str("after", prog.DeliveriesAfter).Int64("queued", prog.Queued).Bool("done", prog.DeliveriesDone).
			Msg("queue migration: pending deliveries queued")
	}
	for {
		filter := bson.M{"fanout": true}
		if prog.EventsAfterAt != nil {
			filter["$or"] = bson.A{bson.M{"createdAt": bson.M{"$gt": *prog.EventsAfterAt}},
				bson.M{"createdAt": *prog.EventsAfterAt, "_id": bson.M{"$gt": prog.EventsAfter}}}
		}
		marked, err := findAll[eventDoc](ctx, s, s.events, "find events to fan out", filter,
			options.Find().SetProjection(bson.M{"topic": 1, "orderingKey": 1, "createdAt": 1}).
				SetSort(bson.D{{Key: "fanout", Value: 1}, {Key: "createdAt", Value: 1}, {Key: "_id", Value: 1}}).SetLimit(int64(s.pageSize())))
		if err != nil {
			return err
		}
		if len(marked) > 0 {
			outbox := make([]any, len(marked))
			for i, e := range marked {
				outbox[i] = &outboxDoc{ID: e.ID, Topic: e.Topic, OrderingKey: e.OrderingKey, CreatedAt: e.CreatedAt}
			}
			if _, err := s.outbox.InsertMany(ctx, outbox, options.InsertMany().SetOrdered(false)); err != nil && !onlyDuplicates(err) {
				return wrap("fill the outbox", err)
			}
			last := marked[len(marked)-1]
			prog.EventsAfter, prog.EventsAfterAt, prog.Outboxed = last.ID, &last.CreatedAt, prog.Outboxed+int64(len(marked))
			if err := record(bson.M{"eventsAfter": prog.EventsAfter, "eventsAfterAt": prog.EventsAfterAt, "outboxed": prog.Outboxed}); err != nil {
				return err
			}
			s.log.Info().Str("after", prog.EventsAfter).Int64("outboxed", prog.Outboxed).Msg("queue migration: unfinished fan-outs put in the outbox")
		}
		if len(marked) < s.pageSize() {
			break
		}
	}
	return wrap("write the queue migration", record(bson.M{"at": s.now()}))
}

// queuePending is one page of migrateQueue: it queues the attempts of the pending deliveries given (read
// with one query naming their ids) and returns how many queue documents it wrote or found written.
func (s *Store) queuePending(ctx context.Context, pending []deliveryDoc) (int64, error) {
	if len(pending) == 0 {
		return 0, nil
	}
	byDelivery, err := s.AttemptsOf(ctx, idsOf(pending, func(d deliveryDoc) string { return d.ID }))
	if err != nil {
		return 0, err
	}
	now := s.now()
	var queue []any
	for i := range pending {
		d := &pending[i]
		attempts := byDelivery[d.ID]
		for _, a := range attempts {
			if a.Status == pulsetype.StatusPending {
				queue = append(queue, queuedAttempt(a, d))
			}
		}
		switch {
		case len(attempts) == 0:
			a := newAttemptDoc(d.delivery().Ref(), max(1, d.ReopenedAttempt), now, now)
			a.CreatedAt = now.Add(-s.opts.LeaseTimeout) // the repair scan inserts it at once
			queue = append(queue, queued(a, d.OrderingKey, d.EventCreatedAt))
		case attempts[len(attempts)-1].Status != pulsetype.StatusPending:
			queue = append(queue, queuedAttempt(attempts[len(attempts)-1], d))
		}
	}
	if len(queue) == 0 {
		return 0, nil
	}
	if _, err := s.queue.InsertMany(ctx, queue, options.InsertMany().SetOrdered(false)); err != nil && !onlyDuplicates(err) {
		return 0, wrap("queue pending attempts", err)
	}
	return int64(len(queue)), nil
}

// queuedAttempt returns the queue document of an existing attempt a of delivery d, its lease copied.
func queuedAttempt(a *pulsetype.Attempt, d *deliveryDoc) *queueDoc {
	q := &queueDoc{ID: a.ID, DeliveryID: d.ID, EventID: d.EventID, ConsumerGroup: d.ConsumerGroup, Topic: d.Topic,
		OrderingKey: d.OrderingKey, EventCreatedAt: d.EventCreatedAt, Attempt: a.Number, Uncounted: a.Uncounted, Incarnation: a.Incarnation,
		FirstAttemptAt: zeroOrNil(a.FirstAttemptAt), CreatedAt: a.CreatedAt, NextAttemptAt: a.NextAttemptAt, LeasedUntil: a.LeasedUntil, FencingToken: a.FencingToken,
		Ended: a.Status != pulsetype.StatusPending}
	return q
}
