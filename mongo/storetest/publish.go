package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// publishCases are the cases of publish.
var publishCases = []Case{
	{Name: "PublishArrayIsIdempotentAndConflictsStoreNothing", Run: testPublishArrayIsIdempotentAndConflictsStoreNothing},
	{Name: "ConcurrentIdenticalArrayPublishes", Run: testConcurrentIdenticalArrayPublishes, Race: true},
	{Name: "GetEventsSkipsMissingAndExpired", Run: testGetEventsSkipsMissingAndExpired},
	{Name: "ExpiredDocumentsAreInvisibleAndSwept", Run: testExpiredDocumentsAreInvisibleAndSwept},
}

func testPublishArrayIsIdempotentAndConflictsStoreNothing(t *testing.T, e *Env) {
	b := e.setup(t)
	s := b.store(nil, nil)
	batch := func() []*pulsetype.Event {
		e1 := Event("evt-1", "payment.captured", `{"a":1.50,"b":"<&>"}`)
		e1.Headers = map[string]string{"trace": "t1"}
		return []*pulsetype.Event{e1, Event("evt-2", "payment.captured", `[1,2,3]`), Event("evt-3", "order.created", `"x"`)}
	}
	first, err := s.Publish(b.ctx, batch())
	if err != nil {
		t.Fatalf("Publish: %v", err)
	}
	// createdAt is stamped by the database when the array commits: the answer carries it.
	created := map[string]time.Time{}
	for i, p := range first {
		if p.Existing {
			t.Errorf("first publish: event %d reported Existing", i)
		}
		created[p.Event.ID] = p.Event.CreatedAt
	}
	for _, want := range batch() {
		got, err := s.GetEvent(b.ctx, want.ID)
		if err != nil {
			t.Errorf("GetEvent(%s) = %v", want.ID, err)
			continue
		}
		if got.Topic != want.Topic || string(got.Data) != string(want.Data) || len(got.Headers) != len(want.Headers) ||
			got.Headers["trace"] != want.Headers["trace"] || got.CreatedAt.IsZero() || !got.CreatedAt.Equal(created[want.ID]) {
			t.Errorf("GetEvent(%s) = %+v (data %s), want %+v (data %s)", want.ID, got, got.Data, want, want.Data)
		}
	}
	if got := b.count("events", bson.M{"staged": true}); got != 0 {
		t.Errorf("%d events left staged after Publish, want 0", got)
	}
	if got := b.count("events", bson.M{"fanout": true}); got != 3 {
		t.Errorf("%d events marked for fan-out, want 3", got)
	}

	b.clock.Advance(time.Second)
	again, err := s.Publish(b.ctx, batch())
	if err != nil {
		t.Fatalf("re-publish of the same batch: %v", err)
	}
	for i, p := range again {
		if !p.Existing {
			t.Errorf("re-publish: event %d not reported Existing", i)
		}
		if !p.Event.CreatedAt.Equal(created[p.Event.ID]) {
			t.Errorf("re-publish: event %d createdAt %v, want the stored %v", i, p.Event.CreatedAt, created[p.Event.ID])
		}
	}
	if got := b.count("events", bson.M{}); got != 3 {
		t.Errorf("%d events after re-publish, want 3", got)
	}
	// The same JSON value spelled otherwise is the same content (pulsetype.SameJSON).
	if again, err := s.Publish(b.ctx, []*pulsetype.Event{Event("evt-2", "payment.captured", `[1, 2, 3.0]`)}); err != nil || !again[0].Existing {
		t.Errorf("re-publish with data spelled otherwise = %+v, %v; want the stored event", again, err)
	}

	conflicts := []struct {
		name  string
		batch func() []*pulsetype.Event
	}{
		{"array, other data", func() []*pulsetype.Event {
			e := batch()
			e[1].Data = json.RawMessage(`[1,2,4]`)
			return append(e, Event("evt-new-1", "t", `1`))
		}},
		{"array, other topic", func() []*pulsetype.Event {
			return []*pulsetype.Event{Event("evt-new-2", "t", `1`), Event("evt-2", "other.topic", `[1,2,3]`)}
		}},
		{"array, other headers", func() []*pulsetype.Event {
			e := batch()
			e[0].Headers = map[string]string{"trace": "t2"}
			return append(e, Event("evt-new-3", "t", `1`))
		}},
		{"array, data in another order", func() []*pulsetype.Event {
			return []*pulsetype.Event{Event("evt-new-4", "t", `1`), Event("evt-2", "payment.captured", `[1,3,2]`)}
		}},
		{"single event, other data", func() []*pulsetype.Event {
			return []*pulsetype.Event{Event("evt-3", "order.created", `"y"`)}
		}},
	}
	for _, c := range conflicts {
		t.Run(c.name, func(t *testing.T) {
			events := c.batch()
			if _, err := s.Publish(b.ctx, events); !errors.Is(err, pulsetype.ErrIDConflict) {
				t.Fatalf("Publish = %v, want ErrIDConflict", err)
			}
			if got := b.count("events", bson.M{}); got != 3 {
				t.Errorf("%d events after a conflicting publish, want the 3 stored before", got)
			}
			for _, e := range events {
				if _, err := s.GetEvent(b.ctx, e.ID); !slices.Contains([]string{"evt-1", "evt-2", "evt-3"}, e.ID) && !errors.Is(err, pulsetype.ErrNotFound) {
					t.Errorf("GetEvent(%s) after a conflicting publish = %v, want ErrNotFound", e.ID, err)
				}
			}
		})
	}
	got, err := s.GetEvent(b.ctx, "evt-2")
	if err != nil || string(got.Data) != `[1,2,3]` || got.Topic != "payment.captured" {
		t.Errorf("evt-2 after conflicts = %+v, %v; want its original content", got, err)
	}

	single, err := s.Publish(b.ctx, []*pulsetype.Event{Event("evt-3", "order.created", `"x"`)})
	if err != nil || len(single) != 1 || !single[0].Existing {
		t.Errorf("single re-publish with the same content = %+v, %v; want Existing", single, err)
	}
}

// Concurrent identical array publishes (a client retrying while its first try is in flight) never lose
// events and never answer a conflict: every call succeeds and all events end committed.
func testConcurrentIdenticalArrayPublishes(t *testing.T, e *Env) {
	b := e.setup(t)
	s := b.store(nil, nil)
	for round := range 10 {
		var wg sync.WaitGroup
		errs := make([]error, 3)
		for i := range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				batch := make([]*pulsetype.Event, 5)
				for j := range batch {
					batch[j] = &pulsetype.Event{ID: fmt.Sprintf("r%d-e%d", round, j), Topic: "t", Data: []byte(fmt.Sprint(j))}
				}
				_, errs[i] = s.Publish(context.Background(), batch)
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d publisher %d: %v", round, i, err)
			}
		}
		for j := range 5 {
			if _, err := s.GetEvent(context.Background(), fmt.Sprintf("r%d-e%d", round, j)); err != nil {
				t.Fatalf("round %d event %d: %v", round, j, err)
			}
		}
	}
}

// GetEvents returns the visible events among the ids, with one query.
func testGetEventsSkipsMissingAndExpired(t *testing.T, e *Env) {
	b := e.setup(t)
	s := b.store(nil, func(o *Options) { o.EventRetention = time.Minute })
	b.publishOne(s, "evt-old", "t")
	b.clock.Advance(2 * time.Minute)
	b.publishOne(s, "evt-new", "t")
	got, err := s.GetEvents(b.ctx, []string{"evt-old", "evt-new", "evt-none"})
	if err != nil {
		t.Fatalf("GetEvents: %v", err)
	}
	if len(got) != 1 || got["evt-new"] == nil || string(got["evt-new"].Data) != `{"n":1}` {
		t.Errorf("GetEvents = %v, want only evt-new with its data", got)
	}
}

func testExpiredDocumentsAreInvisibleAndSwept(t *testing.T, e *Env) {
	b := e.setup(t)
	s := b.store(nil, func(o *Options) { o.EventRetention, o.HistoryRetention = time.Minute, time.Minute })
	t0 := b.clock.Now()
	b.putEndpoint(s, "billing", "t")
	ev := b.publishOne(s, "evt-old", "t")
	deliveryID := b.deliveryID("billing", ev.ID)
	a := b.claim(s, "worker-a")
	if err := s.FinishAttempt(b.ctx, a, pulsetype.AttemptResult{Status: pulsetype.StatusSuccess, HTTPStatus: 204}); err != nil {
		t.Fatalf("FinishAttempt: %v", err)
	}
	b.endDelivery(s, pulsetype.EndDeliveryParams{DeliveryID: deliveryID, Status: pulsetype.StatusSuccess, FinalAttempt: 1})
	b.clock.Advance(30 * time.Second)
	if _, err := s.Publish(b.ctx, []*pulsetype.Event{Event("evt-young", "other", `2`)}); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	// Staged leftovers of a publisher that crashed before its commit: one older than StagedTimeout, one fresh.
	staged := []any{
		bson.M{"_id": "evt-staged-old", "topic": "t", "data": `3`, "createdAt": t0.Add(-2 * b.e.StagedTimeout), "staged": true},
		bson.M{"_id": "evt-staged-new", "topic": "t", "data": `4`, "createdAt": b.clock.Now(), "staged": true},
	}
	if _, err := b.coll("events").InsertMany(b.ctx, staged); err != nil {
		t.Fatalf("insert staged events: %v", err)
	}
	if _, err := s.GetEvent(b.ctx, "evt-staged-new"); !errors.Is(err, pulsetype.ErrNotFound) {
		t.Errorf("GetEvent(staged) = %v, want ErrNotFound", err)
	}

	b.clock.Advance(29 * time.Second) // t0+59s: nothing expired yet
	if _, err := s.GetEvent(b.ctx, ev.ID); err != nil {
		t.Fatalf("GetEvent before expiresAt = %v, want the event", err)
	}
	if _, _, err := s.GetDelivery(b.ctx, deliveryID); err != nil {
		t.Fatalf("GetDelivery before expiresAt = %v, want the delivery", err)
	}

	b.clock.Advance(time.Second) // t0+60s: expiresAt of the first event, its delivery and attempt
	if _, err := s.GetEvent(b.ctx, ev.ID); !errors.Is(err, pulsetype.ErrNotFound) {
		t.Errorf("GetEvent at expiresAt = %v, want ErrNotFound", err)
	}
	if _, _, err := s.GetDelivery(b.ctx, deliveryID); !errors.Is(err, pulsetype.ErrNotFound) {
		t.Errorf("GetDelivery at expiresAt = %v, want ErrNotFound", err)
	}
	if ds, err := s.DeliveriesOfEvent(b.ctx, ev.ID); err != nil || len(ds) != 0 {
		t.Errorf("DeliveriesOfEvent at expiresAt = %v, %v; want none", ds, err)
	}
	if _, err := s.GetEvent(b.ctx, "evt-young"); err != nil {
		t.Errorf("GetEvent of an unexpired event = %v", err)
	}

	n, err := s.Sweep(b.ctx)
	if err != nil {
		t.Fatalf("Sweep: %v", err)
	}
	if s.TTLIndexes() != e.Features.TTLIndexes {
		t.Errorf("the store's TTLIndexes = %v, the server's (probed) %v", s.TTLIndexes(), e.Features.TTLIndexes)
	}
	want := int64(1) // the old staged event
	if !s.TTLIndexes() {
		want += 3 // the expired event, delivery and attempt
		for _, c := range []struct{ suffix, id string }{{"events", ev.ID}, {"deliveries", deliveryID}, {"history", a.ID}} {
			if got := b.count(c.suffix, bson.M{"_id": c.id}); got != 0 {
				t.Errorf("expired %s document %s still stored after Sweep", c.suffix, c.id)
			}
		}
	}
	if n != want {
		t.Errorf("Sweep deleted %d documents, want %d", n, want)
	}
	for _, id := range []string{"evt-young", "evt-staged-new"} {
		if got := b.count("events", bson.M{"_id": id}); got != 1 {
			t.Errorf("Sweep deleted %s, which has not expired", id)
		}
	}
	if got := b.count("events", bson.M{"_id": "evt-staged-old"}); got != 0 {
		t.Errorf("Sweep kept a staged event older than StagedTimeout")
	}
}
