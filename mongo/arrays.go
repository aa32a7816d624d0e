package mongo

import (
	"context"
	"time"

	"github.com/google/uuid"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Arrays: the events of one array publish share a batch id, so that a commit that stopped part-way (the
// commit is one updateMany, atomic per document only) is rolled forward by the repair: every event of an
// array ends committed, or none does (docs/delivery.md, "Publishing").

// newBatchID returns a fresh batch id for the events of one array publish.
func newBatchID() string { return uuid.Must(uuid.NewV7()).String() }

// rollForward commits the staged events of the arrays among batches of which at least one event is
// committed (docs/delivery.md, "Publishing"): one read of the arrays' events by batch (index
// pulse_events_batch), then, per page of Options.PageSize events to commit, the three steps of commitStaged.
// An array with no committed event is left as it is: its publish may still commit it, and the sweeper
// removes it after StagedTimeout. It returns the events it committed (or found committed by a concurrent
// commit), by id, as committed: createdAt stamped, fanout mark set. It is idempotent and safe beside a
// publish of the same array: both commit under the filter staged, so one applies per event.
func (s *Store) rollForward(ctx context.Context, batches []string) (map[string]*eventDoc, error) {
	if len(batches) == 0 {
		return nil, nil
	}
	members, err := findAll[*eventDoc](ctx, s, s.events, "read events of arrays", bson.M{"batch": bson.M{"$in": batches}})
	if err != nil {
		return nil, err
	}
	committed := map[string]bool{} // batches with a committed event
	for _, d := range members {
		if !d.Staged {
			committed[d.Batch] = true
		}
	}
	var ids []string
	var marks []any
	staged := map[string]*eventDoc{}
	for _, d := range members {
		if d.Staged && committed[d.Batch] {
			ids = append(ids, d.ID)
			marks = append(marks, &outboxDoc{ID: d.ID, Topic: d.Topic, OrderingKey: d.OrderingKey, CreatedAt: d.CreatedAt})
			staged[d.ID] = d
		}
	}
	out := make(map[string]*eventDoc, len(ids))
	for lo := 0; lo < len(ids); lo += s.pageSize() { // no command names more than a page of ids
		hi := min(lo+s.pageSize(), len(ids))
		stamps, err := s.commitStaged(ctx, ids[lo:hi], marks[lo:hi])
		if err != nil {
			return nil, err
		}
		for id, t := range stamps {
			d := staged[id]
			d.Staged, d.Fanout, d.CreatedAt = false, true, t
			out[id] = d
		}
	}
	return out, nil
}

// commitStaged commits the staged events ids, whose outbox documents are marks, as a publish does: the
// outbox documents first (a duplicate is one the publish wrote before it stopped, and stays), recalled from
// the fan-out repair's deferral, then commitEvents, whose stamps it returns.
func (s *Store) commitStaged(ctx context.Context, ids []string, marks []any) (map[string]time.Time, error) {
	if _, err := s.outbox.InsertMany(ctx, marks, options.InsertMany().SetOrdered(false)); err != nil && !onlyDuplicates(err) {
		return nil, wrap("insert outbox documents of an array rolled forward", err)
	}
	if _, err := s.updateMany(ctx, s.outbox, bson.M{"_id": bson.M{"$in": ids}}, bson.M{"$unset": bson.M{"deferredUntil": ""}}); err != nil {
		return nil, wrap("recall outbox documents of an array rolled forward", err)
	}
	return s.commitEvents(ctx, ids)
}
