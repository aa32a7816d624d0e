package mongo

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// Publishing: an event's outbox document is written before the write that makes the event visible and
// stamps its createdAt: for an event in a round of up to three concurrent publishes an upsert of its own, for
// an array or a larger round a staged insert and a commit (docs/delivery.md, "Publishing").

// Publish stores events, all or none, durable when it returns; each must carry its id. The database stamps
// createdAt in the write that makes an event visible (docs/delivery.md, "Publishing"): an array's events are
// inserted staged (invisible, sharing a batch id), their outbox documents written, then each is committed by
// an update filtered on staged (see publishRound); a crash before the commit leaves staged events that the
// sweeper removes, and one during it an array that the repair rolls forward (rollForward). Concurrent calls
// with one event each share one round (groupCommit), each returning once its own event is durable, with its
// own outcome; a round of one event is two commands, of two three (publishEach). ExpiresAt is set here and
// the events carry fanout=true until FanOut created their deliveries. It returns pulsetype.ErrIDConflict
// when an id is already used with other content (nothing is stored then).
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
// commands; a round of up to maxEachRound events that is not an array costs one command more than it has
// events instead (publishEach: a round of one event two, of two three):
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
	if !all && len(events) <= maxEachRound {
		return s.publishEach(ctx, events)
	}
	out := make([]publishOutcome, len(events))
	docs := make([]any, len(events))
	batch := ""
	if all {
		batch = newBatchID() // the array's events roll forward together (rollForward)
	}
	for i, e := range events {
		d := s.newEventDoc(e, true)
		d.Batch = batch
		docs[i] = d
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
		adopted, _, err = s.resolveTaken(ctx, events, taken, out)
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
		if _, err := s.updateMany(ctx, s.outbox, bson.M{"_id": bson.M{"$in": adopted}}, bson.M{"$unset": bson.M{"deferredUntil": ""}}); err != nil {
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
// removed first). It returns the ids of those still staged with the same content, for the caller to commit,
// and the documents it read, by id.
func (s *Store) resolveTaken(ctx context.Context, events []*pulsetype.Event, taken map[int]bool, out []publishOutcome) (adopted []string, existing map[string]*eventDoc, err error) {
	ids := make([]string, 0, len(taken))
	for i := range taken {
		ids = append(ids, events[i].ID)
	}
	existing, err = s.findEvents(ctx, ids)
	if err != nil {
		return nil, nil, err
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
				return nil, nil, wrap("remove expired event", err)
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
	return adopted, existing, nil
}

// maxEachRound is the largest round of concurrent publishes (not an array) that publishEach writes: one
// command more than its events, against the staged path's four (insert, outbox documents, commit, read of
// the stamps), so it costs less up to three events and writes each event once rather than twice.
const maxEachRound = 3

// publishEach is publishRound for a round of up to maxEachRound events that is not an array, in one command
// more than it has events:
//
//  1. one insert of their outbox documents (a duplicate is one an earlier try, or another publish of the
//     id, wrote, and stays);
//  2. for each event, at once, one findAndModify that inserts it visible, with its fanout mark, and stamps
//     createdAt in the same write (publishVisible).
//
// Each event has an outcome of its own (a database error of its write included); the returned error is the
// outbox insert's, or, when every event's write failed, the first of those (so a round that found no server
// answers as one).
func (s *Store) publishEach(ctx context.Context, events []*pulsetype.Event) ([]publishOutcome, error) {
	marks := make([]any, len(events))
	for i, e := range events {
		marks[i] = &outboxDoc{ID: e.ID, Topic: e.Topic, OrderingKey: e.OrderingKey, CreatedAt: e.CreatedAt}
	}
	_, insertErr := s.outbox.InsertMany(ctx, marks, options.InsertMany().SetOrdered(false))
	if insertErr != nil && !onlyDuplicates(insertErr) {
		return nil, wrap("insert outbox document", insertErr)
	}
	out := make([]publishOutcome, len(events))
	errs := make([]error, len(events))
	var wg sync.WaitGroup
	for i, e := range events {
		wg.Go(func() { out[i], errs[i] = s.publishVisible(ctx, e, !failedAt(insertErr, i)) })
	}
	wg.Wait()
	failed := 0
	for i, err := range errs {
		if err != nil {
			out[i].err = err
			failed++
		}
	}
	if failed == len(events) {
		return nil, errs[0]
	}
	return out, nil
}

// publishVisible is step 2 of publishEach for event e, whose outbox document that step's insert wrote when
// markInserted is set: one findAndModify that inserts the event visible, with its fanout mark, and stamps
// createdAt in the same write: an upsert whose query, {_id, createdAt: {$exists: false}}, matches no stored
// event (each has a createdAt), so that it inserts the document its update describes ($setOnInsert, and
// $currentDate for createdAt, which an upsert applies to the document it inserts), or, when the id is
// taken, fails with a duplicate key error (code 11000) and writes nothing. The server does not retry such an
// upsert itself: it does so only for a query of equalities on the unique index's fields alone.
//
// A taken id costs more: the read of resolveTaken, then, for an event staged by another publish with the
// same content, the recall of its outbox document and its commit (commitEvents); for an event published and
// fanned out before (a re-publish, or an id used with other content), the removal of the outbox document
// this round inserted; for an id used with other content by an event still staged or being fanned out, that
// document is given the stored event's topic, ordering key and createdAt, as that event's publish would have
// written it (its own insert may have found this one). It returns the event's outcome, or the database's
// error.
func (s *Store) publishVisible(ctx context.Context, e *pulsetype.Event, markInserted bool) (publishOutcome, error) {
	out := []publishOutcome{{published: pulsetype.Published{Event: e}}}
	insert, err := onInsert(s.newEventDoc(e, false))
	if err != nil {
		return publishOutcome{}, err
	}
	var d eventDoc
	err = s.events.FindOneAndUpdate(ctx, bson.M{"_id": e.ID, "createdAt": bson.M{"$exists": false}},
		bson.M{"$setOnInsert": insert, "$currentDate": bson.M{"createdAt": true}},
		options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.After)).Decode(&d)
	if err == nil {
		e.CreatedAt = d.CreatedAt.UTC()
		return out[0], nil
	}
	if !mongo.IsDuplicateKeyError(err) {
		return publishOutcome{}, wrap("insert event", err)
	}
	adopted, existing, err := s.resolveTaken(ctx, []*pulsetype.Event{e}, map[int]bool{0: true}, out)
	if err != nil {
		return publishOutcome{}, err
	}
	ex := existing[e.ID]
	switch {
	case !markInserted:
	case ex != nil && !ex.Staged && !ex.Fanout && (out[0].err == nil || errors.Is(out[0].err, pulsetype.ErrIDConflict)):
		// Published and fanned out before (with this content or other): the document this round inserted
		// stands for nothing.
		if _, err := s.outbox.DeleteOne(ctx, bson.M{"_id": e.ID}); err != nil {
			return publishOutcome{}, wrap("remove outbox document", err)
		}
	case errors.Is(out[0].err, pulsetype.ErrIDConflict):
		set := bson.M{"topic": ex.Topic, "createdAt": ex.CreatedAt}
		update := bson.M{"$set": set}
		if ex.OrderingKey != "" {
			set["orderingKey"] = ex.OrderingKey
		} else {
			update["$unset"] = bson.M{"orderingKey": ""}
		}
		if _, err := s.outbox.UpdateOne(ctx, bson.M{"_id": e.ID}, update); err != nil {
			return publishOutcome{}, wrap("correct outbox document", err)
		}
	}
	if len(adopted) == 0 {
		return out[0], nil
	}
	// Another publish staged it: its outbox document may have been put aside by the fan-out repair
	// meanwhile (FanOutStale), and must be seen again once it is committed.
	if _, err := s.updateMany(ctx, s.outbox, bson.M{"_id": e.ID}, bson.M{"$unset": bson.M{"deferredUntil": ""}}); err != nil {
		return publishOutcome{}, wrap("recall outbox document", err)
	}
	stamps, err := s.commitEvents(ctx, adopted)
	if err != nil {
		return publishOutcome{}, err
	}
	t, ok := stamps[e.ID]
	if !ok {
		out[0].err = errPublishRace // removed by a concurrent publish before it was committed
		return out[0], nil
	}
	e.CreatedAt = t
	out[0].published = pulsetype.Published{Event: e, Existing: true}
	return out[0], nil
}

// onInsert returns the fields of d but _id and createdAt, for the $setOnInsert of publishVisible's upsert.
func onInsert(d *eventDoc) (bson.D, error) {
	raw, err := bson.Marshal(d)
	if err != nil {
		return nil, fmt.Errorf("encode event: %w", err)
	}
	var fields bson.D
	if err := bson.Unmarshal(raw, &fields); err != nil {
		return nil, fmt.Errorf("encode event: %w", err)
	}
	out := fields[:0]
	for _, f := range fields {
		if f.Key != "_id" && f.Key != "createdAt" {
			out = append(out, f)
		}
	}
	return out, nil
}

// commitEvents commits the staged events ids (step 4 of publishRound) and returns the createdAt of each one
// committed, by this call or a concurrent one; an id missing from the answer was removed before its commit.
// One event costs one findAndModify, more an update and a read. The findAndModify answers the whole event:
// FerretDB refuses its projection (fields), so it is not asked for.
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
	} else if _, err := s.updateMany(ctx, s.events, bson.M{"_id": bson.M{"$in": ids}, "staged": true}, update); err != nil {
		// One command, so that a publisher that dies after sending it leaves an array all committed, not
		// in part (the server completes it).
		return nil, wrap("commit events", err)
	}
	committed, err := findAll[eventDoc](ctx, s, s.events, "read back committed events",
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
	docs, err := findAll[*eventDoc](ctx, s, s.events, "find events", bson.M{"_id": bson.M{"$in": ids}})
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
