package mongo

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.mongodb.org/mongo-driver/v2/bson"
	drvevent "go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/pulse-sidecar/pulse/internal/testwait"
	"github.com/pulse-sidecar/pulse/mongo/storetest"
	"github.com/pulse-sidecar/pulse/pulsetype"
	"github.com/pulse-sidecar/pulse/reconciler"
)

// Concurrent publishes of one event each are written together: while the first one's write of its event
// (an upsert, for a round of one) is held back, the other 23 queue, and the second round writes all of them
// with one insert. Each call gets its own
// event back, durable and stamped; a call whose id is taken with other content (in the same round as the
// others) fails alone.
func testGroupCommitWritesConcurrentPublishesTogether(t *testing.T, e *env) {
	b := e.setup(t)
	var s *Store
	var mu sync.Mutex
	inserts, holding := 0, false                              // holding: the next insert of events waits for release
	release, held := make(chan struct{}), make(chan struct{}) // held: the first round's insert is waiting
	letGo := sync.OnceFunc(func() { close(release) })
	t.Cleanup(letGo) // a failed test never leaves the insert held (the client's disconnect would wait for it)
	monitor := &drvevent.CommandMonitor{Started: func(_ context.Context, ev *drvevent.CommandStartedEvent) {
		coll, _ := ev.Command.Lookup("insert").StringValueOK()
		if upsert, _ := ev.Command.Lookup("findAndModify").StringValueOK(); upsert != "" && ev.Command.Lookup("upsert").Type == bson.TypeBoolean && ev.Command.Lookup("upsert").Boolean() {
			coll = upsert
		}
		if coll != testPrefix+".events" {
			return
		}
		mu.Lock()
		inserts++
		hold := holding
		holding = false
		mu.Unlock()
		if hold {
			close(held)
			<-release // the first round's insert waits until every other publish is queued
		}
	}}
	s = b.store(b.srv.Connect(options.Client().SetMonitor(monitor)), nil)
	if _, err := s.Publish(b.ctx, []*pulsetype.Event{storetest.Event("taken", "t", `{"n":0}`)}); err != nil {
		t.Fatalf("Publish(taken): %v", err)
	}
	mu.Lock()
	inserts, holding = 0, true
	mu.Unlock()

	const n = 24
	type result struct {
		p   pulsetype.Published
		err error
	}
	results := make([]result, n)
	var wg sync.WaitGroup
	publish := func(i int) {
		wg.Go(func() {
			ev := storetest.Event(fmt.Sprintf("gc-%d", i), "t", fmt.Sprintf(`{"n":%d}`, i))
			if i == n-1 {
				ev = storetest.Event("taken", "t", `{"n":"other"}`)
			}
			out, err := s.Publish(b.ctx, []*pulsetype.Event{ev})
			if err == nil {
				results[i].p = out[0]
			}
			results[i].err = err
		})
	}
	// The first publish's round runs in a goroutine of its own: the others start once it has taken its one
	// event and its insert is held, so that they queue behind it rather than join it.
	publish(0)
	select {
	case <-held:
	case <-time.After(storetest.WaitBound(t)):
		t.Fatal("the first publish's insert of its event was never sent")
	}
	for i := 1; i < n; i++ {
		publish(i)
	}
	testwait.Eventually(t, storetest.WaitBound(t), fmt.Sprintf("%d publishes queue behind the first round", n-1), func() bool {
		s.publishes.mu.Lock()
		defer s.publishes.mu.Unlock()
		return len(s.publishes.queued) == n-1
	})
	letGo()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if inserts != 2 {
		t.Errorf("%d writes inserting events for %d publishes, want 2 (one round, then one for the %d queued)", inserts, n, n-1)
	}
	for i, r := range results {
		if i == n-1 {
			if !errors.Is(r.err, pulsetype.ErrIDConflict) {
				t.Errorf("publish of a taken id with other content = %v, want ErrIDConflict", r.err)
			}
			continue
		}
		id := fmt.Sprintf("gc-%d", i)
		if r.err != nil || r.p.Event.ID != id || r.p.Existing || r.p.Event.CreatedAt.IsZero() {
			t.Errorf("publish %d = %+v, %v; want event %s, new, stamped", i, r.p, r.err, id)
			continue
		}
		got, err := s.GetEvent(b.ctx, id)
		if err != nil || string(got.Data) != fmt.Sprintf(`{"n":%d}`, i) || !got.CreatedAt.Equal(r.p.Event.CreatedAt) {
			t.Errorf("GetEvent(%s) = %+v, %v; want the published event with its createdAt", id, got, err)
		}
	}
	if got, err := s.GetEvent(b.ctx, "taken"); err != nil || string(got.Data) != `{"n":0}` {
		t.Errorf("GetEvent(taken) = %+v, %v; want the first publish's data", got, err)
	}
	if got := b.count("outbox", bson.M{}); got != n {
		t.Errorf("%d outbox documents, want %d: one per published event", got, n)
	}
}

// The repair scan works from the queue alone: a delivery whose attempt succeeded but whose follow-up never
// ran (its queue document left behind) is ended; a retry queued but never inserted (its creator died) is
// inserted as exactly the next attempt; a stale queue document of an ended delivery is removed.
func testRepairScanWorksFromTheQueue(t *testing.T, e *env) {
	b := e.setup(t)
	s := b.store(nil, func(o *Options) { o.LeaseTimeout = time.Second })
	b.putEndpoint(s, "g", "t")
	created := b.fanOutN(s, 3, "t")
	leased, err := s.ClaimAttempts(b.ctx, "w", created)
	if err != nil || len(leased) != 3 {
		t.Fatalf("ClaimAttempts = %d, %v", len(leased), err)
	}
	ok := pulsetype.AttemptResult{Status: pulsetype.StatusSuccess, HTTPStatus: 200}
	failed := pulsetype.AttemptResult{Status: pulsetype.StatusError, HTTPStatus: 500, Error: &pulsetype.ErrorInfo{Code: pulsetype.CodeHandlerError, Message: "HTTP 500"}}
	cs := []pulsetype.Completion{
		{Attempt: leased[0], Result: ok, Next: pulsetype.NextStep{EndStatus: pulsetype.StatusSuccess}},
		{Attempt: leased[1], Result: failed, Next: pulsetype.NextStep{Retry: true}},
		{Attempt: leased[2], Result: ok, Next: pulsetype.NextStep{EndStatus: pulsetype.StatusSuccess}},
	}
	if _, err := s.FinishAttempts(b.ctx, cs); err != nil {
		t.Fatal(err)
	}
	// The third one's follow-up ran but its queue document stayed (a crash before the delete).
	if _, err := s.EndDelivery(b.ctx, pulsetype.EndDeliveryParams{DeliveryID: leased[2].DeliveryID, Status: pulsetype.StatusSuccess, FinalAttempt: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.coll("queue").InsertOne(b.ctx, bson.M{"_id": leased[2].ID, "deliveryId": leased[2].DeliveryID, "eventId": leased[2].EventID,
		"consumerGroup": "g", "topic": "t", "attempt": 1, "createdAt": b.clock.Now(), "nextAttemptAt": b.clock.Now()}); err != nil {
		t.Fatal(err)
	}
	// The second one's retry was queued, then its creator died.
	if _, err := b.coll("queue").InsertOne(b.ctx, bson.M{"_id": "orphan", "deliveryId": leased[1].DeliveryID, "eventId": leased[1].EventID,
		"consumerGroup": "g", "topic": "t", "attempt": 2, "createdAt": b.clock.Now(), "nextAttemptAt": b.clock.Now()}); err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(2 * time.Second) // past one lock timeout: the orphan's creator is gone
	r := reconciler.New(s, "repairer", time.Second, nil, zerolog.Nop())
	for range 2 {
		if _, err := r.Repair(b.ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := b.count("deliveries", bson.M{"_id": leased[0].DeliveryID, "status": "success", "finalAttempt": 1}); n != 1 {
		t.Error("the delivery whose success was recorded was not ended")
	}
	if n := b.count("history", bson.M{"deliveryId": leased[1].DeliveryID}); n != 2 {
		t.Errorf("the failed delivery has %d attempts, want exactly 2", n)
	}
	var queued []queueDoc
	cur, err := b.coll("queue").Find(b.ctx, bson.M{})
	if err != nil || cur.All(b.ctx, &queued) != nil {
		t.Fatal(err)
	}
	if len(queued) != 1 || queued[0].DeliveryID != leased[1].DeliveryID || queued[0].Attempt != 2 || queued[0].ID == "orphan" {
		t.Errorf("the queue holds %+v, want the second attempt of the failed delivery alone", queued)
	}
	if a := b.historyDoc(queued[0].ID); a.Status != pulsetype.StatusPending || a.Attempt != 2 {
		t.Errorf("the queued attempt is %+v in the history, want attempt 2 pending", a)
	}
}

// A database written before the queue existed: EnsureSchema queues its pending attempts (with their
// leases), the latest attempt of a pending delivery that has none pending, a delivery without attempts,
// and puts its events marked for fan-out in the outbox, once; the reaper, the repair scan and the fan-out
// repair then find them.
func testEnsureSchemaQueuesEarlierWork(t *testing.T, e *env) {
	b := e.setup(t)
	s := b.store(nil, func(o *Options) { o.LeaseTimeout = time.Second })
	b.putEndpoint(s, "g", "t")
	now := b.clock.Now()
	past := now.Add(-time.Minute)
	delivery := func(id string) bson.M {
		return bson.M{"_id": id, "eventId": "e-" + id, "consumerGroup": "g", "topic": "t", "status": "pending", "eventCreatedAt": past,
			"createdAt": past, "updatedAt": past}
	}
	attempt := func(id, delivery, status string, extra bson.M) bson.M {
		doc := bson.M{"_id": id, "deliveryId": delivery, "eventId": "e-" + delivery, "consumerGroup": "g", "topic": "t", "attempt": 1,
			"status": status, "createdAt": past, "nextAttemptAt": past}
		for k, v := range extra {
			doc[k] = v
		}
		return doc
	}
	for _, d := range []string{"d-leased", "d-succeeded", "d-bare"} {
		if _, err := b.coll("deliveries").InsertOne(b.ctx, delivery(d)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.coll("history").InsertMany(b.ctx, []any{
		attempt("a-leased", "d-leased", "pending", bson.M{fieldLeaseOwner: "dead", fieldFencingToken: "dead", fieldLeasedUntil: past}),
		attempt("a-succeeded", "d-succeeded", "success", bson.M{"endedAt": past, "httpStatus": 200}),
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.coll("events").InsertOne(b.ctx, bson.M{"_id": "e-marked", "topic": "t", "data": "1", "createdAt": now, "fanout": true}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.client.Database(b.dbName).Collection(testPrefix+".readiness").DeleteOne(b.ctx, bson.M{"_id": queueMigration}); err != nil {
		t.Fatal(err)
	}
	s = b.store(nil, func(o *Options) { o.LeaseTimeout = time.Second })
	if q, o := b.count("queue", bson.M{}), b.count("outbox", bson.M{}); q != 3 || o != 1 {
		t.Fatalf("after EnsureSchema: %d queued, %d in the outbox; want 3 and 1", q, o)
	}
	b.store(nil, nil) // a second start migrates nothing again
	if q := b.count("queue", bson.M{}); q != 3 {
		t.Fatalf("a second EnsureSchema left %d queued, want 3", q)
	}
	// An older replica that ran beside this version wrote work the queue does not hold; the recovery
	// docs/mongodb-production.md gives (delete the record, restart one replica) queues it, keeping the rest.
	if _, err := b.coll("deliveries").InsertOne(b.ctx, delivery("d-late")); err != nil {
		t.Fatal(err)
	}
	if _, err := b.coll("history").InsertOne(b.ctx, attempt("a-late", "d-late", "pending", nil)); err != nil {
		t.Fatal(err)
	}
	b.store(nil, nil)
	if n := b.count("queue", bson.M{"_id": "a-late"}); n != 0 {
		t.Fatalf("a start with the migration recorded queued the older replica's attempt (%d): want it left to the recovery", n)
	}
	if _, err := b.client.Database(b.dbName).Collection(testPrefix+".readiness").DeleteOne(b.ctx, bson.M{"_id": queueMigration}); err != nil {
		t.Fatal(err)
	}
	b.store(nil, nil)
	// a-late is queued; the attempts queued before stay once each (d-bare, which has no attempt, gets a second
	// queue document for its attempt 1: the repair below still inserts exactly one).
	late, kept := b.count("queue", bson.M{"_id": "a-late"}), b.count("queue", bson.M{"_id": bson.M{"$in": []string{"a-leased", "a-succeeded"}}})
	if late != 1 || kept != 2 {
		t.Fatalf("after the recovery: a-late queued %d times, a-leased and a-succeeded %d in all; want 1 and 2", late, kept)
	}
	if _, err := b.coll("history").DeleteOne(b.ctx, bson.M{"_id": "a-late"}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.coll("queue").DeleteOne(b.ctx, bson.M{"_id": "a-late"}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.coll("deliveries").DeleteOne(b.ctx, bson.M{"_id": "d-late"}); err != nil {
		t.Fatal(err)
	}
	reaped, err := s.ReapOne(b.ctx)
	if err != nil || reaped == nil || reaped.ID != "a-leased" {
		t.Fatalf("ReapOne = %+v, %v; want the migrated expired lease", reaped, err)
	}
	b.clock.Advance(2 * time.Second)
	if _, err := reconciler.New(s, "r", time.Second, nil, zerolog.Nop()).Repair(b.ctx); err != nil {
		t.Fatal(err)
	}
	if n := b.count("deliveries", bson.M{"_id": "d-succeeded", "status": "success"}); n != 1 {
		t.Error("the delivery with a successful attempt was not ended")
	}
	if n := b.count("history", bson.M{"deliveryId": "d-bare", "attempt": 1, "status": "pending"}); n != 1 {
		t.Error("the delivery without attempts did not get its first one")
	}
	if n := b.count("deliveries", bson.M{"eventId": "e-marked"}); n != 1 {
		t.Error("the marked event was not fanned out")
	}
}
