package mongo

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/pulse-sidecar/pulse/mongo/storetest"
	"github.com/pulse-sidecar/pulse/pulsetype"
)

// stageArray writes an array publish of n events on topic t as publishRound does up to its commit (the
// events staged with one batch id, then their outbox documents) and returns the events' ids.
func (b *bundle) stageArray(s *Store, name string, n int) []string {
	b.t.Helper()
	events := make([]*pulsetype.Event, n)
	for i := range events {
		events[i] = storetest.Event(fmt.Sprintf("%s-%d", name, i), "t", fmt.Sprintf(`{"i":%d}`, i))
	}
	s.stamp(events)
	batch := newBatchID()
	docs, marks := make([]any, n), make([]any, n)
	ids := make([]string, n)
	for i, e := range events {
		d := s.newEventDoc(e, true)
		d.Batch = batch
		docs[i], ids[i] = d, e.ID
		marks[i] = &outboxDoc{ID: e.ID, Topic: e.Topic, CreatedAt: e.CreatedAt}
	}
	if _, err := s.events.InsertMany(b.ctx, docs); err != nil {
		b.t.Fatalf("insert staged events: %v", err)
	}
	if _, err := s.outbox.InsertMany(b.ctx, marks, options.InsertMany().SetOrdered(false)); err != nil {
		b.t.Fatalf("insert outbox documents: %v", err)
	}
	return ids
}

// visible returns how many of ids GetEvent finds (committed, unexpired).
func (b *bundle) visible(s *Store, ids []string) int {
	b.t.Helper()
	n := 0
	for _, id := range ids {
		_, err := s.GetEvent(b.ctx, id)
		switch {
		case err == nil:
			n++
		case !errors.Is(err, pulsetype.ErrNotFound):
			b.t.Fatalf("GetEvent(%s): %v", id, err)
		}
	}
	return n
}

// An array publish whose commit stopped part-way (here: the commit of its first event only, as an
// updateMany interrupted by a stepdown leaves it) is rolled forward by the fan-out repair: every event of
// it is committed and fanned out. An array of which no event is committed is left staged (its publish may
// still commit it) and removed by the sweep after StagedTimeout; a partly committed array that the
// fan-out repair has not reached by then is committed by the sweep instead of removed, and fanned out by
// the next repair.
func testPartlyCommittedArrayRollsForward(t *testing.T, e *env) {
	b := e.setup(t)
	s := b.store(nil, nil)
	b.putEndpoint(s, "g", "t")

	partial := b.stageArray(s, "partial", 3)
	if _, err := s.commitEvents(b.ctx, partial[:1]); err != nil {
		t.Fatalf("commit the first event: %v", err)
	}
	uncommitted := b.stageArray(s, "uncommitted", 2)
	if got := b.visible(s, partial); got != 1 {
		t.Fatalf("%d of the partly committed array visible before the repair, want 1 (test premise)", got)
	}

	b.clock.Advance(2 * s.opts.LeaseTimeout)
	n, err := s.FanOutStale(b.ctx, s.opts.LeaseTimeout, 100)
	if err != nil {
		t.Fatalf("FanOutStale: %v", err)
	}
	if n != 3 {
		t.Errorf("FanOutStale inserted %d first attempts, want 3 (every event of the partly committed array)", n)
	}
	if got := b.visible(s, partial); got != 3 {
		t.Errorf("%d of 3 events of the partly committed array visible after the repair, want 3", got)
	}
	if got := b.count("deliveries", bson.M{"eventId": bson.M{"$in": partial}}); got != 3 {
		t.Errorf("%d deliveries of the partly committed array, want 3", got)
	}
	if got := b.count("events", bson.M{"_id": bson.M{"$in": uncommitted}, "staged": true}); got != 2 {
		t.Errorf("%d of 2 events of the uncommitted array still staged after the repair, want 2", got)
	}

	late := b.stageArray(s, "late", 2)
	if _, err := s.commitEvents(b.ctx, late[1:]); err != nil {
		t.Fatalf("commit the last event: %v", err)
	}
	b.clock.Advance(StagedTimeout + s.opts.LeaseTimeout)
	if _, err := s.Sweep(b.ctx); err != nil {
		t.Fatalf("Sweep: %v", err)
	}
	if got := b.count("events", bson.M{"_id": bson.M{"$in": uncommitted}}); got != 0 {
		t.Errorf("%d events of the uncommitted array left after the sweep, want 0", got)
	}
	if got := b.visible(s, late); got != 2 {
		t.Errorf("%d of 2 events of the partly committed array visible after the sweep, want 2 (committed, not removed)", got)
	}
	if got := b.visible(s, partial); got != 3 {
		t.Errorf("%d of 3 events of the array rolled forward visible after the sweep, want 3", got)
	}
	if _, err := s.FanOutStale(b.ctx, s.opts.LeaseTimeout, 100); err != nil {
		t.Fatalf("FanOutStale: %v", err)
	}
	if got := b.count("deliveries", bson.M{"eventId": bson.M{"$in": late}}); got != 2 {
		t.Errorf("%d deliveries of the array the sweep committed, want 2", got)
	}
	if got := b.count("outbox", bson.M{}); got != 0 {
		t.Errorf("%d outbox documents left, want 0", got)
	}
}

// A publish of one event alone is two commands: the insert of its outbox document and the upsert that
// inserts the event visible with its createdAt stamped by the database. A re-publish of it after its
// fan-out, and a publish of its id with other content, answer from the stored event and leave no outbox
// document behind; the stored event is untouched.
func testSinglePublishIsTwoCommands(t *testing.T, e *env) {
	b := e.setup(t)
	s, log := b.monitoredStore()
	log.reset()
	before := time.Now().Add(-time.Minute) // the database's clock stamps createdAt, not the fake clock
	out, err := s.Publish(b.ctx, []*pulsetype.Event{storetest.Event("one", "t", `{"n":1}`)})
	if err != nil || len(out) != 1 || out[0].Existing {
		t.Fatalf("Publish = %+v, %v; want one new event", out, err)
	}
	if got, want := log.sent(), []string{"insert", "findAndModify"}; !slices.Equal(got, want) {
		t.Errorf("a publish of one event sent %q, want %q", got, want)
	}
	stamped := out[0].Event.CreatedAt
	if stamped.Before(before) || stamped.Equal(b.clock.Now()) {
		t.Errorf("createdAt = %s, want the database's time of the write (fake clock at %s)", stamped, b.clock.Now())
	}
	got, err := s.GetEvent(b.ctx, "one")
	if err != nil || !got.CreatedAt.Equal(stamped) || string(got.Data) != `{"n":1}` {
		t.Fatalf("GetEvent = %+v, %v; want the event with createdAt %s", got, err, stamped)
	}
	if n := b.count("outbox", bson.M{"_id": "one"}); n != 1 {
		t.Fatalf("%d outbox documents for the event, want 1 until its fan-out", n)
	}
	if _, err := s.FanOut(b.ctx, []*pulsetype.Event{got}); err != nil {
		t.Fatal(err)
	}
	if err := s.ClearFanOut(b.ctx, []string{"one"}); err != nil {
		t.Fatal(err)
	}

	again, err := s.Publish(b.ctx, []*pulsetype.Event{storetest.Event("one", "t", `{"n":1}`)})
	if err != nil || !again[0].Existing || !again[0].Event.CreatedAt.Equal(stamped) {
		t.Errorf("re-publish = %+v, %v; want the stored event, Existing", again, err)
	}
	if _, err := s.Publish(b.ctx, []*pulsetype.Event{storetest.Event("one", "u", `{"n":2}`)}); !errors.Is(err, pulsetype.ErrIDConflict) {
		t.Errorf("publish of the id with other content = %v, want ErrIDConflict", err)
	}
	if n := b.count("outbox", bson.M{}); n != 0 {
		t.Errorf("%d outbox documents after the re-publish and the conflict, want 0", n)
	}
	if got, err := s.GetEvent(b.ctx, "one"); err != nil || got.Topic != "t" || !got.CreatedAt.Equal(stamped) {
		t.Errorf("GetEvent after the conflict = %+v, %v; want the first event untouched", got, err)
	}
}

// A round of two or three concurrent publishes (group commit) costs one command more than it has events:
// one insert of their outbox documents and one upsert per event, each stamping its own createdAt, where the
// staged path costs four. Each event has its own outcome in the same round: a new one is stored visible, a
// re-publish of a fanned-out event answers the stored one (Existing) and leaves no outbox document, an id
// used with other content answers ErrIDConflict and leaves the stored event untouched; a round of four
// takes the staged path.
func testSmallRoundIsOneCommandPerEventMore(t *testing.T, e *env) {
	b := e.setup(t)
	s, log := b.monitoredStore()
	for _, n := range []int{2, 3} {
		var events []*pulsetype.Event
		for i := range n {
			e := storetest.Event(fmt.Sprintf("round%d-%d", n, i), "t", fmt.Sprintf(`{"i":%d}`, i))
			s.stamp([]*pulsetype.Event{e})
			events = append(events, e)
		}
		log.reset()
		out, err := s.publishRound(b.ctx, events, false)
		if err != nil || len(out) != n {
			t.Fatalf("publishRound of %d = %+v, %v; want %d outcomes", n, out, err, n)
		}
		want := []string{"insert"}
		for range n {
			want = append(want, "findAndModify")
		}
		if got := log.sent(); !slices.Equal(got, want) {
			t.Errorf("a round of %d sent %q, want %q", n, got, want)
		}
		for i, o := range out {
			if o.err != nil || o.published.Existing {
				t.Errorf("round of %d, event %d: outcome %+v, want a new event", n, i, o)
				continue
			}
			got, err := s.GetEvent(b.ctx, events[i].ID)
			if err != nil || !got.CreatedAt.Equal(o.published.Event.CreatedAt) || string(got.Data) != string(events[i].Data) {
				t.Errorf("GetEvent(%s) = %+v, %v; want the event with createdAt %s", events[i].ID, got, err, o.published.Event.CreatedAt)
			}
		}
		if got := b.count("events", bson.M{"_id": bson.M{"$in": idsOf(events, func(e *pulsetype.Event) string { return e.ID })}, "fanout": true}); got != int64(n) {
			t.Errorf("%d of the round's %d events marked for fan-out, want all", got, n)
		}
	}

	// One round of a new event, a re-publish of a fanned-out one, and a conflict.
	stored, err := s.GetEvent(b.ctx, "round2-0")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.FanOut(b.ctx, []*pulsetype.Event{stored}); err != nil {
		t.Fatal(err)
	}
	if err := s.ClearFanOut(b.ctx, []string{"round2-0", "round2-1"}); err != nil {
		t.Fatal(err)
	}
	mixed := []*pulsetype.Event{storetest.Event("round-new", "t", `{"i":9}`), storetest.Event("round2-0", "t", `{"i":0}`),
		storetest.Event("round2-1", "u", `{"i":7}`)}
	s.stamp(mixed)
	out, err := s.publishRound(b.ctx, mixed, false)
	if err != nil {
		t.Fatalf("publishRound of a mixed round: %v", err)
	}
	if out[0].err != nil || out[0].published.Existing {
		t.Errorf("new event of the mixed round: %+v, want stored", out[0])
	}
	if out[1].err != nil || !out[1].published.Existing || !out[1].published.Event.CreatedAt.Equal(stored.CreatedAt) {
		t.Errorf("re-publish in the mixed round: %+v, want the stored event (createdAt %s), Existing", out[1], stored.CreatedAt)
	}
	if !errors.Is(out[2].err, pulsetype.ErrIDConflict) {
		t.Errorf("conflict in the mixed round: %+v, want ErrIDConflict", out[2])
	}
	if n := b.count("outbox", bson.M{"_id": bson.M{"$in": bson.A{"round2-0", "round2-1"}}}); n != 0 {
		t.Errorf("%d outbox documents of the re-publish and the conflict, want 0 (both fanned out before)", n)
	}
	if got, err := s.GetEvent(b.ctx, "round2-1"); err != nil || got.Topic != "t" || string(got.Data) != `{"i":1}` {
		t.Errorf("GetEvent(round2-1) after the conflict = %+v, %v; want it untouched", got, err)
	}

	var four []*pulsetype.Event
	for i := range 4 {
		four = append(four, storetest.Event(fmt.Sprintf("round4-%d", i), "t", `1`))
	}
	s.stamp(four)
	log.reset()
	if out, err := s.publishRound(b.ctx, four, false); err != nil || len(out) != 4 {
		t.Fatalf("publishRound of 4 = %+v, %v", out, err)
	}
	if got, want := log.sent(), []string{"insert", "insert", "update", "find"}; !slices.Equal(got, want) {
		t.Errorf("a round of 4 sent %q, want the staged path's %q", got, want)
	}
}
