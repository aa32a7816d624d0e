package reconciler_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.mongodb.org/mongo-driver/v2/bson"
	mongodrv "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/pulse-sidecar/pulse/internal/testdb"
	pmongo "github.com/pulse-sidecar/pulse/mongo"
	"github.com/pulse-sidecar/pulse/pulsetype"
	"github.com/pulse-sidecar/pulse/reconciler"
)

// counter is a FailureObserver that counts repairs by kind and records the failures it is told of.
type counter struct {
	mu     sync.Mutex
	kinds  map[string]int
	failed []*pulsetype.ErrorInfo
	reaped atomic.Int64
}

func (c *counter) DeliveryFailed(_ *pulsetype.Attempt, _ pulsetype.AttemptResult, end *pulsetype.ErrorInfo) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.failed = append(c.failed, end)
}

func (c *counter) WorkerLost(string) { c.reaped.Add(1) }
func (c *counter) Reconciled(kind string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.kinds[kind]++
}

type bundle struct {
	client *mongodrv.Client
	db     *mongodrv.Database
	stores []*pmongo.Store
}

// setup gives n stores on n separate clients (as n replicas would have) over one fresh database, with the
// consumer group "g" registered for topic "t".
func setup(t *testing.T, n int) *bundle {
	t.Parallel()
	client, dbName := testdb.Database(t)
	b := &bundle{client: client, db: client.Database(dbName)}
	for range n {
		c, err := mongodrv.Connect(options.Client().ApplyURI(testdb.URI(t)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Disconnect(context.Background()) })
		b.stores = append(b.stores, pmongo.New(c, pmongo.Options{Database: dbName, CollectionPrefix: "pulse", LeaseTimeout: time.Second}))
	}
	if _, err := b.stores[0].EnsureSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	ep := &pulsetype.Endpoint{ConsumerGroup: "g", URL: "http://127.0.0.1:1/", Topics: []string{"t"}}
	if err := ep.Normalize(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.stores[0].PutEndpoint(context.Background(), ep); err != nil {
		t.Fatal(err)
	}
	return b
}

func (b *bundle) insert(t *testing.T, coll string, doc bson.M) {
	t.Helper()
	if _, err := b.db.Collection("pulse."+coll).InsertOne(context.Background(), doc); err != nil {
		t.Fatal(err)
	}
}

func (b *bundle) count(t *testing.T, coll string, filter bson.M) int64 {
	t.Helper()
	n, err := b.db.Collection("pulse."+coll).CountDocuments(context.Background(), filter)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// Each partial state of docs/delivery.md, repaired by 6 replicas at once: exactly one repair wins, the others are
// no-ops, and the database ends in the one state that page prescribes.
func TestRacingReplicasRepairEachPartialStateOnce(t *testing.T) {
	now := time.Now().UTC()
	old := now.Add(-time.Hour)
	deliveryID := pmongo.DeliveryID("g", "e1")
	delivery := bson.M{"_id": deliveryID, "eventId": "e1", "consumerGroup": "g", "topic": "t", "status": "pending",
		"eventCreatedAt": now, "createdAt": now, "updatedAt": now}
	// queued is the queue document a crash leaves for attempt 1 (queued before the attempt is inserted, and
	// removed only once the delivery moved on).
	queued := bson.M{"_id": "a1", "deliveryId": deliveryID, "eventId": "e1", "consumerGroup": "g", "topic": "t", "attempt": 1,
		"eventCreatedAt": now, "createdAt": old, "nextAttemptAt": now}
	attempt := func(status string, extra bson.M) bson.M {
		doc := bson.M{"_id": "a1", "deliveryId": deliveryID, "eventId": "e1", "consumerGroup": "g", "topic": "t",
			"attempt": 1, "status": status, "createdAt": old, "nextAttemptAt": old, "endedAt": old}
		for k, v := range extra {
			doc[k] = v
		}
		return doc
	}
	for _, tc := range []struct {
		name   string
		state  func(t *testing.T, b *bundle)
		kind   string
		verify func(t *testing.T, b *bundle)
	}{
		{"delivery without its first attempt", func(t *testing.T, b *bundle) {
			b.insert(t, "queue", queued)
			b.insert(t, "deliveries", delivery)
		},
			reconciler.KindMissingFirstAttempt, func(t *testing.T, b *bundle) {
				if n := b.count(t, "history", bson.M{"deliveryId": deliveryID, "attempt": 1, "status": "pending"}); n != 1 {
					t.Fatalf("%d first attempts, want 1", n)
				}
			}},
		{"successful attempt, pending delivery", func(t *testing.T, b *bundle) {
			b.insert(t, "queue", queued)
			b.insert(t, "deliveries", delivery)
			b.insert(t, "history", attempt("success", nil))
		}, reconciler.KindUnfinishedSuccess, func(t *testing.T, b *bundle) {
			if n := b.count(t, "deliveries", bson.M{"_id": deliveryID, "status": "success", "finalAttempt": 1}); n != 1 {
				t.Fatal("delivery not finished as success")
			}
		}},
		{"errored attempt without its retry", func(t *testing.T, b *bundle) {
			b.insert(t, "queue", queued)
			b.insert(t, "deliveries", delivery)
			b.insert(t, "history", attempt("error", bson.M{"error": bson.M{"code": "handler_error", "message": "HTTP 500"}}))
		}, reconciler.KindMissingRetry, func(t *testing.T, b *bundle) {
			if n := b.count(t, "history", bson.M{"deliveryId": deliveryID}); n != 2 {
				t.Fatalf("%d attempts, want exactly 2", n)
			}
			if n := b.count(t, "history", bson.M{"deliveryId": deliveryID, "attempt": 2, "status": "pending"}); n != 1 {
				t.Fatal("attempt 2 missing")
			}
		}},
		{"terminal error, pending delivery", func(t *testing.T, b *bundle) {
			b.insert(t, "queue", queued)
			b.insert(t, "deliveries", delivery)
			b.insert(t, "history", attempt("error", bson.M{"terminal": true, "httpStatus": 422, "error": bson.M{"code": "handler_error", "message": "HTTP 422"}}))
		}, reconciler.KindUnfinishedError, func(t *testing.T, b *bundle) {
			if n := b.count(t, "deliveries", bson.M{"_id": deliveryID, "status": "error", "error.code": "handler_error"}); n != 1 {
				t.Fatal("delivery not ended as error")
			}
			if n := b.count(t, "history", bson.M{}); n != 1 {
				t.Fatalf("%d attempts, want 1 (no retry after a terminal answer)", n)
			}
		}},
		{"fan-out interrupted before its mark was cleared", func(t *testing.T, b *bundle) {
			b.insert(t, "events", bson.M{"_id": "e1", "topic": "t", "data": "1", "createdAt": old, "fanout": true})
			b.insert(t, "outbox", bson.M{"_id": "e1", "topic": "t", "createdAt": old})
			// The group registered before the event was published (offsetReset latest delivers it).
			if _, err := b.db.Collection("pulse.subscriptions").UpdateOne(context.Background(), bson.M{"_id": "g"},
				bson.M{"$set": bson.M{"createdAt": old.Add(-time.Hour)}}); err != nil {
				t.Fatal(err)
			}
		}, reconciler.KindInterruptedFanOut, func(t *testing.T, b *bundle) {
			if n := b.count(t, "deliveries", bson.M{"eventId": "e1"}); n != 1 {
				t.Fatalf("%d deliveries, want 1", n)
			}
			if n := b.count(t, "history", bson.M{"eventId": "e1"}); n != 1 {
				t.Fatalf("%d attempts, want 1", n)
			}
			if n := b.count(t, "events", bson.M{"fanout": true}); n != 0 {
				t.Fatal("fan-out mark not cleared")
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := setup(t, 6)
			tc.state(t, b)
			obs := &counter{kinds: map[string]int{}}
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i, s := range b.stores {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := reconciler.New(s, "replica-"+string(rune('a'+i)), time.Second, obs, zerolog.Nop())
					<-start
					if _, err := r.Repair(context.Background()); err != nil {
						t.Errorf("replica %d: %v", i, err)
					}
				}()
			}
			close(start)
			wg.Wait()
			tc.verify(t, b)
			obs.mu.Lock()
			defer obs.mu.Unlock()
			total := 0
			for _, n := range obs.kinds {
				total += n
			}
			// One attempt insert (or one delivery update) wins. An interrupted fan-out can also be finished
			// by a replica that sees the delivery before its first attempt: then that replica's repair wins.
			ok := obs.kinds[tc.kind] == 1 || (tc.kind == reconciler.KindInterruptedFanOut && obs.kinds[reconciler.KindMissingFirstAttempt] == 1)
			if total != 1 || !ok {
				t.Fatalf("repairs reported %v, want exactly one %s", obs.kinds, tc.kind)
			}
			// The delivery a repair ended in error is reported failed once (pulse.delivery.failed), by the
			// replica that ended it; no other repair reports a failure.
			wantFailed := 0
			if tc.kind == reconciler.KindUnfinishedError {
				wantFailed = 1
			}
			if len(obs.failed) != wantFailed || wantFailed == 1 && obs.failed[0].Code != pulsetype.CodeHandlerError {
				t.Fatalf("failures reported %v, want %d (handler_error)", obs.failed, wantFailed)
			}
		})
	}
}

// The reaper: 6 replicas race on one expired lease; one records worker_lost and creates exactly attempt 2.
func TestRacingReapersReapOnce(t *testing.T) {
	b := setup(t, 6)
	b.insertExpiredLease(t)
	obs := &counter{kinds: map[string]int{}}
	var reaped atomic.Int64
	var wg sync.WaitGroup
	for _, s := range b.stores {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok, err := reconciler.New(s, "r", time.Second, obs, zerolog.Nop()).Reap(context.Background())
			if err != nil {
				t.Error(err)
			}
			if ok {
				reaped.Add(1)
			}
		}()
	}
	wg.Wait()
	if reaped.Load() != 1 || obs.reaped.Load() != 1 {
		t.Fatalf("%d replicas reaped, want 1", reaped.Load())
	}
	if n := b.count(t, "history", bson.M{"attempt": 1, "status": "error", "error.code": pulsetype.CodeWorkerLost}); n != 1 {
		t.Fatal("attempt 1 not worker_lost")
	}
	if n := b.count(t, "history", bson.M{"attempt": 2}); n != 1 {
		t.Fatalf("%d second attempts, want 1", n)
	}
	if len(obs.failed) != 0 {
		t.Fatalf("failures reported %v, want none (attempt 2 follows)", obs.failed)
	}
}

// A reaped attempt with no retry left ends its delivery in error (worker_lost): of 6 replicas racing on it,
// the one whose write ended it reports the failure, once.
func TestReapedLastAttemptReportsTheFailureOnce(t *testing.T) {
	b := setup(t, 6)
	ep := &pulsetype.Endpoint{ConsumerGroup: "g", URL: "http://127.0.0.1:1/", Topics: []string{"t"}, MaxRetries: new(int)}
	if err := ep.Normalize(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.stores[0].PutEndpoint(context.Background(), ep); err != nil {
		t.Fatal(err)
	}
	deliveryID := b.insertExpiredLease(t)
	obs := &counter{kinds: map[string]int{}}
	var wg sync.WaitGroup
	for _, s := range b.stores {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := reconciler.New(s, "r", time.Second, obs, zerolog.Nop()).Reap(context.Background()); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if n := b.count(t, "deliveries", bson.M{"_id": deliveryID, "status": "error", "error.code": pulsetype.CodeWorkerLost}); n != 1 {
		t.Fatal("the delivery did not end error/worker_lost")
	}
	if len(obs.failed) != 1 || obs.failed[0].Code != pulsetype.CodeWorkerLost {
		t.Fatalf("failures reported %v, want one worker_lost", obs.failed)
	}
}

// insertExpiredLease stores delivery g/e1 pending with its attempt a1 leased by a dead owner until a second
// ago (its history and queue documents), and returns the delivery's id.
func (b *bundle) insertExpiredLease(t *testing.T) string {
	t.Helper()
	now := time.Now().UTC()
	deliveryID := pmongo.DeliveryID("g", "e1")
	b.insert(t, "deliveries", bson.M{"_id": deliveryID, "eventId": "e1", "consumerGroup": "g", "topic": "t", "status": "pending", "createdAt": now, "updatedAt": now})
	b.insert(t, "queue", bson.M{"_id": "a1", "deliveryId": deliveryID, "eventId": "e1", "consumerGroup": "g", "topic": "t", "attempt": 1,
		"eventCreatedAt": now, "createdAt": now, "nextAttemptAt": now, "lockToken": "old", "lockedUntil": now.Add(-time.Second)})
	b.insert(t, "history", bson.M{"_id": "a1", "deliveryId": deliveryID, "eventId": "e1", "consumerGroup": "g", "topic": "t", "attempt": 1,
		"status": "pending", "createdAt": now, "nextAttemptAt": now, "lockToken": "old", "lockOwner": "dead", "lockedUntil": now.Add(-time.Second)})
	return deliveryID
}
