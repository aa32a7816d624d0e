package mongo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/pulse-sidecar/pulse/internal/testdb"
	"github.com/pulse-sidecar/pulse/pulsetype"
)

// testPrefix is the collection prefix of every test store.
const testPrefix = "pulse"

// bundle is what setup gives a test: its own database, a client on it and a clock the test advances.
type bundle struct {
	t      *testing.T
	ctx    context.Context
	srv    Server
	client *mongo.Client
	dbName string
	clock  *fakeClock
}

// setup marks t parallel and gives it a fresh database of e's server, in e's serialization (dropped in
// cleanup), and a fake clock.
func (e *env) setup(t *testing.T) *bundle {
	t.Helper()
	t.Parallel()
	srv := e.open(t, e.order)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	t.Cleanup(cancel)
	return &bundle{t: t, ctx: ctx, srv: srv, client: srv.Client, dbName: srv.Database,
		clock: &fakeClock{now: time.Now().UTC().Truncate(time.Millisecond)}}
}

// onFerretDB reports whether the suite runs on the embedded FerretDB (no PULSE_TEST_MONGODB_URI).
func onFerretDB() bool { return os.Getenv(testdb.EnvMongoDBURI) == "" }

// fakeClock is a Store's Now that only moves when the test advances it. It is safe for concurrent use.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	return c.now
}

// connect returns a second, independent client on the test's server (another replica's connection pool),
// disconnected in cleanup.
func (b *bundle) connect() *mongo.Client { return b.srv.Connect(nil) }

// options returns the Options of a test store on the bundle's database and fake clock; mod may change them.
func (b *bundle) options(mod func(o *Options)) Options {
	o := Options{Database: b.dbName, CollectionPrefix: testPrefix, LeaseTimeout: 30 * time.Second,
		Now: b.clock.Now, Logger: zerolog.Nop()}
	if mod != nil {
		mod(&o)
	}
	return o
}

// store returns a Store on client (the bundle's when nil) whose schema is ensured.
func (b *bundle) store(client *mongo.Client, mod func(o *Options)) *Store {
	b.t.Helper()
	if client == nil {
		client = b.client
	}
	s := New(client, b.options(mod))
	if _, err := s.EnsureSchema(b.ctx); err != nil {
		b.t.Fatalf("EnsureSchema: %v", err)
	}
	return s
}

// coll returns the collection <prefix>.<suffix> of the test database.
func (b *bundle) coll(suffix string) *mongo.Collection {
	return b.client.Database(b.dbName).Collection(testPrefix + "." + suffix)
}

// count returns how many documents of <prefix>.<suffix> match filter.
func (b *bundle) count(suffix string, filter any) int64 {
	b.t.Helper()
	n, err := b.coll(suffix).CountDocuments(b.ctx, filter)
	if err != nil {
		b.t.Fatalf("count %s %v: %v", suffix, filter, err)
	}
	return n
}

// endpoint is the fixture factory of endpoints: a normalized registration of group for topics.
func (b *bundle) endpoint(group string, topics ...string) *pulsetype.Endpoint {
	b.t.Helper()
	e := &pulsetype.Endpoint{ConsumerGroup: group, URL: "http://127.0.0.1:9/" + group, Topics: topics}
	if err := e.Normalize(); err != nil {
		b.t.Fatalf("Normalize fixture endpoint: %v", err)
	}
	return e
}

// event is the fixture factory of events.
func event(id, topic, data string) *pulsetype.Event {
	return &pulsetype.Event{ID: id, Topic: topic, Data: json.RawMessage(data)}
}

// putEndpoint registers group for topics through s.
func (b *bundle) putEndpoint(s *Store, group string, topics ...string) {
	b.t.Helper()
	if _, _, err := s.PutEndpoint(b.ctx, b.endpoint(group, topics...)); err != nil {
		b.t.Fatalf("PutEndpoint(%s): %v", group, err)
	}
}

// publishOne publishes one event through s and fans it out; it returns the stored event.
func (b *bundle) publishOne(s *Store, id, topic string) *pulsetype.Event {
	b.t.Helper()
	out, err := s.Publish(b.ctx, []*pulsetype.Event{event(id, topic, `{"n":1}`)})
	if err != nil {
		b.t.Fatalf("Publish(%s): %v", id, err)
	}
	if _, err := s.FanOut(b.ctx, []*pulsetype.Event{out[0].Event}); err != nil {
		b.t.Fatalf("FanOut(%s): %v", id, err)
	}
	return out[0].Event
}

// claim claims the next due attempt and fails the test when there is none.
func (b *bundle) claim(s *Store, owner string) *pulsetype.Attempt {
	b.t.Helper()
	a, err := s.Claim(b.ctx, owner, nil)
	if err != nil || a == nil {
		b.t.Fatalf("Claim = %v, %v; want an attempt", a, err)
	}
	return a
}

// endDelivery ends a delivery through s and fails the test unless this call ended it.
func (b *bundle) endDelivery(s *Store, p pulsetype.EndDeliveryParams) {
	b.t.Helper()
	if ended, err := s.EndDelivery(b.ctx, p); err != nil || !ended {
		b.t.Fatalf("EndDelivery(%s, %s) = %v, %v; want ended", p.DeliveryID, p.Status, ended, err)
	}
}

// historyDoc reads one attempt document by id.
func (b *bundle) historyDoc(id string) attemptDoc {
	b.t.Helper()
	var d attemptDoc
	if err := b.coll("history").FindOne(b.ctx, bson.M{"_id": id}).Decode(&d); err != nil {
		b.t.Fatalf("find attempt %s: %v", id, err)
	}
	return d
}

// concurrently runs f(i) for i in [0, n) in n goroutines released at once and waits for them.
func concurrently(n int, f func(i int)) {
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			f(i)
		})
	}
	close(start)
	wg.Wait()
}

func testPutEndpointConcurrentNewGroupLeavesOneSubscription(t *testing.T, e *env) {
	b := e.setup(t)
	stores := []*Store{b.store(nil, nil), b.store(b.connect(), nil)}
	const n = 16
	created := make([]bool, n)
	errs := make([]error, n)
	concurrently(n, func(i int) {
		_, created[i], errs[i] = stores[i%2].PutEndpoint(b.ctx, b.endpoint("billing", "payment.captured"))
	})
	for i, err := range errs {
		if err != nil {
			t.Errorf("PutEndpoint #%d: %v", i, err)
		}
	}
	if got := b.count("subscriptions", bson.M{}); got != 1 {
		t.Errorf("%d subscription documents, want 1", got)
	}
	if got := b.count("subscriptions", bson.M{"_id": "billing"}); got != 1 {
		t.Errorf("%d subscription documents for billing, want 1", got)
	}
	nCreated := 0
	for _, c := range created {
		if c {
			nCreated++
		}
	}
	if nCreated != 1 {
		t.Errorf("%d of %d PutEndpoint calls reported created=true, want exactly 1", nCreated, n)
	}
	got, err := stores[1].GetEndpoint(b.ctx, "billing")
	if err != nil || got.URL != "http://127.0.0.1:9/billing" || !slices.Equal(got.Topics, []string{"payment.captured"}) {
		t.Errorf("GetEndpoint(billing) = %+v, %v", got, err)
	}
}

func testPutEndpointReplaceKeepsCreatedAt(t *testing.T, e *env) {
	b := e.setup(t)
	s := b.store(nil, nil)
	first, created, err := s.PutEndpoint(b.ctx, b.endpoint("billing", "a"))
	if err != nil || !created {
		t.Fatalf("first PutEndpoint = created %v, %v; want true, nil", created, err)
	}
	b.clock.Advance(time.Minute)
	second, created, err := s.PutEndpoint(b.ctx, b.endpoint("billing", "b", "c"))
	if err != nil || created {
		t.Fatalf("second PutEndpoint = created %v, %v; want false, nil", created, err)
	}
	if !second.CreatedAt.Equal(first.CreatedAt) || !second.UpdatedAt.Equal(b.clock.Now()) {
		t.Errorf("replaced endpoint createdAt %v updatedAt %v; want createdAt %v, updatedAt %v",
			second.CreatedAt, second.UpdatedAt, first.CreatedAt, b.clock.Now())
	}
	if !slices.Equal(second.Topics, []string{"b", "c"}) {
		t.Errorf("replaced topics = %v, want [b c]", second.Topics)
	}
	if err := s.DeleteEndpoint(b.ctx, "billing"); err != nil {
		t.Fatalf("DeleteEndpoint: %v", err)
	}
	if err := s.DeleteEndpoint(b.ctx, "billing"); !errors.Is(err, pulsetype.ErrNotFound) {
		t.Errorf("second DeleteEndpoint = %v, want ErrNotFound", err)
	}
	if _, err := s.GetEndpoint(b.ctx, "billing"); !errors.Is(err, pulsetype.ErrNotFound) {
		t.Errorf("GetEndpoint after delete = %v, want ErrNotFound", err)
	}
}

func testFanOutConcurrentCreatesOneDeliveryPerGroup(t *testing.T, e *env) {
	b := e.setup(t)
	s := b.store(nil, nil)
	b.putEndpoint(s, "billing", "payment.captured")
	b.putEndpoint(s, "audit", "payment.captured", "payment.refunded")
	b.putEndpoint(s, "shipping", "order.shipped") // not subscribed to the event's topic
	out, err := s.Publish(b.ctx, []*pulsetype.Event{event("evt-1", "payment.captured", `{"paymentId":"p1"}`)})
	if err != nil {
		t.Fatalf("Publish: %v", err)
	}
	ev := out[0].Event

	const n = 6
	stores := make([]*Store, n)
	for i := range stores {
		stores[i] = b.store(b.connect(), nil)
	}
	inserted := make([]int, n)
	errs := make([]error, n)
	concurrently(n, func(i int) {
		var created []*pulsetype.Attempt
		created, errs[i] = stores[i].FanOut(b.ctx, []*pulsetype.Event{ev})
		inserted[i] = len(created)
	})
	total := 0
	for i := range n {
		if errs[i] != nil {
			t.Errorf("FanOut #%d: %v", i, errs[i])
		}
		total += inserted[i]
	}

	wantDeliveries := []string{DeliveryID("audit", ev.ID), DeliveryID("billing", ev.ID)}
	slices.Sort(wantDeliveries)
	if got := b.count("deliveries", bson.M{"eventId": ev.ID}); got != 2 {
		t.Errorf("%d deliveries of the event, want 2", got)
	}
	for _, id := range wantDeliveries {
		if got := b.count("deliveries", bson.M{"_id": id, "status": pulsetype.StatusPending}); got != 1 {
			t.Errorf("%d pending deliveries with id %s, want 1", got, id)
		}
	}
	if got := b.count("history", bson.M{"eventId": ev.ID}); got != 2 {
		t.Errorf("%d attempt documents of the event, want 2", got)
	}
	byDelivery, err := s.AttemptsOf(b.ctx, wantDeliveries)
	if err != nil {
		t.Fatalf("AttemptsOf: %v", err)
	}
	for _, id := range wantDeliveries {
		as := byDelivery[id]
		if len(as) != 1 || as[0].Number != 1 || as[0].Status != pulsetype.StatusPending {
			t.Errorf("attempts of delivery %s = %+v, want one pending attempt 1", id, as)
		}
	}
	if err := s.ClearFanOut(b.ctx, []string{ev.ID}); err != nil {
		t.Fatalf("ClearFanOut: %v", err)
	}
	if got := b.count("events", bson.M{"_id": ev.ID, "fanout": bson.M{"$exists": true}}); got != 0 {
		t.Errorf("event still carries its fanout mark after ClearFanOut")
	}
	if total != 2 {
		t.Errorf("FanOut calls reported %d inserted first attempts in total (%v), want 2: only 2 were inserted", total, inserted)
	}
	ds, err := s.DeliveriesOfEvent(b.ctx, ev.ID)
	if err != nil || len(ds) != 2 || ds[0].ConsumerGroup != "audit" || ds[1].ConsumerGroup != "billing" {
		t.Errorf("DeliveriesOfEvent = %v, %v; want audit and billing", ds, err)
	}
}

func testFanOutStaleRepairsInterruptedFanOut(t *testing.T, e *env) {
	b := e.setup(t)
	s := b.store(nil, nil)
	b.putEndpoint(s, "billing", "t")
	if _, err := s.Publish(b.ctx, []*pulsetype.Event{event("evt-1", "t", `1`)}); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	if n, err := s.FanOutStale(b.ctx, time.Minute, 10); err != nil || n != 0 {
		t.Fatalf("FanOutStale of a fresh event = %d, %v; want 0, nil", n, err)
	}
	b.clock.Advance(2 * time.Minute)
	if n, err := s.FanOutStale(b.ctx, time.Minute, 10); err != nil || n != 1 {
		t.Fatalf("FanOutStale of an interrupted fan-out = %d, %v; want 1, nil", n, err)
	}
	if got := b.count("deliveries", bson.M{"_id": DeliveryID("billing", "evt-1")}); got != 1 {
		t.Errorf("%d deliveries after FanOutStale, want 1", got)
	}
	if got := b.count("events", bson.M{"fanout": true}); got != 0 {
		t.Errorf("%d events still marked for fan-out, want 0", got)
	}
}

func testPublishArrayIsIdempotentAndConflictsStoreNothing(t *testing.T, e *env) {
	b := e.setup(t)
	s := b.store(nil, nil)
	batch := func() []*pulsetype.Event {
		e1 := event("evt-1", "payment.captured", `{"a":1.50,"b":"<&>"}`)
		e1.Headers = map[string]string{"trace": "t1"}
		return []*pulsetype.Event{e1, event("evt-2", "payment.captured", `[1,2,3]`), event("evt-3", "order.created", `"x"`)}
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
	if again, err := s.Publish(b.ctx, []*pulsetype.Event{event("evt-2", "payment.captured", `[1, 2, 3.0]`)}); err != nil || !again[0].Existing {
		t.Errorf("re-publish with data spelled otherwise = %+v, %v; want the stored event", again, err)
	}

	conflicts := []struct {
		name  string
		batch func() []*pulsetype.Event
	}{
		{"array, other data", func() []*pulsetype.Event {
			e := batch()
			e[1].Data = json.RawMessage(`[1,2,4]`)
			return append(e, event("evt-new-1", "t", `1`))
		}},
		{"array, other topic", func() []*pulsetype.Event {
			return []*pulsetype.Event{event("evt-new-2", "t", `1`), event("evt-2", "other.topic", `[1,2,3]`)}
		}},
		{"array, other headers", func() []*pulsetype.Event {
			e := batch()
			e[0].Headers = map[string]string{"trace": "t2"}
			return append(e, event("evt-new-3", "t", `1`))
		}},
		{"array, data in another order", func() []*pulsetype.Event {
			return []*pulsetype.Event{event("evt-new-4", "t", `1`), event("evt-2", "payment.captured", `[1,3,2]`)}
		}},
		{"single event, other data", func() []*pulsetype.Event {
			return []*pulsetype.Event{event("evt-3", "order.created", `"y"`)}
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

	single, err := s.Publish(b.ctx, []*pulsetype.Event{event("evt-3", "order.created", `"x"`)})
	if err != nil || len(single) != 1 || !single[0].Existing {
		t.Errorf("single re-publish with the same content = %+v, %v; want Existing", single, err)
	}
}

func testClaimIsFencedByFencingToken(t *testing.T, e *env) {
	b := e.setup(t)
	s := b.store(nil, nil)
	b.putEndpoint(s, "billing", "t")
	ev := b.publishOne(s, "evt-1", "t")

	if a, err := s.Claim(b.ctx, "worker-a", []string{"billing"}); err != nil || a != nil {
		t.Fatalf("Claim excluding the only group = %+v, %v; want nil, nil", a, err)
	}
	a := b.claim(s, "worker-a")
	if a.FencingToken == "" || a.LeaseOwner != "worker-a" || a.Number != 1 || a.EventID != ev.ID ||
		a.DeliveryID != DeliveryID("billing", ev.ID) || a.Status != pulsetype.StatusPending {
		t.Fatalf("claimed attempt = %+v", a)
	}
	if want := b.clock.Now().Add(30 * time.Second); a.LeasedUntil == nil || !a.LeasedUntil.Equal(want) {
		t.Errorf("lockedUntil = %v, want now + lease timeout = %v", a.LeasedUntil, want)
	}
	if other, err := s.Claim(b.ctx, "worker-b", nil); err != nil || other != nil {
		t.Fatalf("second Claim of a leased attempt = %+v, %v; want nil, nil", other, err)
	}

	unknown := pulsetype.LeaseKey{AttemptID: a.ID, Token: "not-a-token"}
	lost, err := s.Renew(b.ctx, []pulsetype.LeaseKey{a.Key(), unknown})
	if err != nil || !slices.Equal(lost, []pulsetype.LeaseKey{unknown}) {
		t.Errorf("Renew(held, unknown) = %v, %v; want [unknown], nil", lost, err)
	}

	wrong := *a
	wrong.FencingToken = "0190d1f4-0000-7000-8000-000000000000"
	result := pulsetype.AttemptResult{Status: pulsetype.StatusSuccess, HTTPStatus: 200, Duration: 15 * time.Millisecond}
	if err := s.FinishAttempt(b.ctx, &wrong, result); !errors.Is(err, pulsetype.ErrLeaseLost) {
		t.Fatalf("FinishAttempt with a wrong token = %v, want ErrLeaseLost", err)
	}
	if d := b.historyDoc(a.ID); d.Status != pulsetype.StatusPending || d.HTTPStatus != 0 {
		t.Fatalf("a fenced-out FinishAttempt wrote: status %s httpStatus %d", d.Status, d.HTTPStatus)
	}
	if err := s.FinishAttempt(b.ctx, a, result); err != nil {
		t.Fatalf("FinishAttempt with the right token = %v, want nil", err)
	}
	if d := b.historyDoc(a.ID); d.Status != pulsetype.StatusSuccess || d.HTTPStatus != 200 || d.DurationMs == nil || *d.DurationMs != 15 || d.EndedAt == nil {
		t.Errorf("finished attempt = %+v", d)
	}
	if err := s.FinishAttempt(b.ctx, a, result); !errors.Is(err, pulsetype.ErrLeaseLost) {
		t.Errorf("FinishAttempt twice = %v, want ErrLeaseLost", err)
	}
	if next, err := s.Claim(b.ctx, "worker-a", nil); err != nil || next != nil {
		t.Errorf("Claim after the only attempt finished = %+v, %v; want nil, nil", next, err)
	}
	lost, err = s.Renew(b.ctx, []pulsetype.LeaseKey{a.Key()})
	if err != nil || !slices.Equal(lost, []pulsetype.LeaseKey{a.Key()}) {
		t.Errorf("Renew of a finished attempt's token = %v, %v; want it lost", lost, err)
	}
}

func testReapOneReapsExpiredLease(t *testing.T, e *env) {
	b := e.setup(t)
	s := b.store(nil, func(o *Options) { o.LeaseTimeout = 100 * time.Millisecond; o.Now = nil })
	b.putEndpoint(s, "billing", "t")
	b.publishOne(s, "evt-1", "t")
	a := b.claim(s, "worker-a")

	var reaped *pulsetype.Attempt
	deadline := time.Now().Add(20 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for reaped == nil {
		r, err := s.ReapOne(b.ctx)
		returnedAt := time.Now()
		if err != nil {
			t.Fatalf("ReapOne: %v", err)
		}
		if r != nil && returnedAt.Before(*a.LeasedUntil) {
			t.Fatalf("ReapOne returned at %v having reaped a lease valid until %v", returnedAt, a.LeasedUntil)
		}
		reaped = r
		if reaped == nil {
			if time.Now().After(deadline) {
				t.Fatalf("ReapOne did not reap a 100ms lease within 20s")
			}
			<-tick.C
		}
	}
	if reaped.ID != a.ID || reaped.Status != pulsetype.StatusError || reaped.Error == nil ||
		reaped.Error.Code != pulsetype.CodeWorkerLost || reaped.LeaseOwner != "worker-a" {
		t.Errorf("reaped attempt = %+v (error %+v)", reaped, reaped.Error)
	}
	if d := b.historyDoc(a.ID); d.Status != pulsetype.StatusError || d.Error == nil || d.Error.Code != pulsetype.CodeWorkerLost {
		t.Errorf("stored reaped attempt = %+v", d)
	}
	if err := s.FinishAttempt(b.ctx, a, pulsetype.AttemptResult{Status: pulsetype.StatusSuccess}); !errors.Is(err, pulsetype.ErrLeaseLost) {
		t.Errorf("FinishAttempt after the reap = %v, want ErrLeaseLost", err)
	}
	if lost, err := s.Renew(b.ctx, []pulsetype.LeaseKey{a.Key()}); err != nil || len(lost) != 1 {
		t.Errorf("Renew after the reap = %v, %v; want the token lost", lost, err)
	}
	if r, err := s.ReapOne(b.ctx); err != nil || r != nil {
		t.Errorf("second ReapOne = %+v, %v; want nil, nil", r, err)
	}
}

func testReapOneSparesRenewedLease(t *testing.T, e *env) {
	b := e.setup(t)
	s := b.store(nil, func(o *Options) { o.LeaseTimeout = 100 * time.Millisecond })
	b.putEndpoint(s, "billing", "t")
	b.publishOne(s, "evt-1", "t")
	a := b.claim(s, "worker-a")

	b.clock.Advance(80 * time.Millisecond)
	if lost, err := s.Renew(b.ctx, []pulsetype.LeaseKey{a.Key()}); err != nil || len(lost) != 0 {
		t.Fatalf("Renew of a held lease = %v, %v; want none lost", lost, err)
	}
	b.clock.Advance(70 * time.Millisecond) // 150ms after the claim: the first lease would have expired
	if r, err := s.ReapOne(b.ctx); err != nil || r != nil {
		t.Fatalf("ReapOne of a renewed lease = %+v, %v; want nil, nil", r, err)
	}
	if d := b.historyDoc(a.ID); d.Status != pulsetype.StatusPending || d.FencingToken != a.FencingToken {
		t.Fatalf("renewed attempt changed: %+v", d)
	}
	expiredAt := b.clock.Advance(40 * time.Millisecond) // 190ms: the renewed lease (until 180ms) has expired too

	// Each replica's clock reads a little differently, so that each would write different values.
	const n = 6
	stores := make([]*Store, n)
	for i := range stores {
		now := expiredAt.Add(time.Duration(i) * time.Millisecond)
		stores[i] = b.store(b.connect(), func(o *Options) {
			o.LeaseTimeout, o.Now = 100*time.Millisecond, func() time.Time { return now }
		})
	}
	reaped := make([]*pulsetype.Attempt, n)
	errs := make([]error, n)
	concurrently(n, func(i int) { reaped[i], errs[i] = stores[i].ReapOne(b.ctx) })
	winners := 0
	for i := range n {
		if errs[i] != nil {
			t.Errorf("ReapOne #%d: %v", i, errs[i])
		}
		if reaped[i] != nil {
			winners++
			if reaped[i].ID != a.ID {
				t.Errorf("ReapOne #%d reaped %s, want %s", i, reaped[i].ID, a.ID)
			}
		}
	}
	if winners != 1 {
		t.Errorf("%d concurrent ReapOne calls reaped the attempt, want exactly 1", winners)
	}
}

func testCreateAttemptAndEndDeliveryAreExactlyOnce(t *testing.T, e *env) {
	b := e.setup(t)
	s := b.store(nil, nil)
	b.putEndpoint(s, "billing", "t")
	ev := b.publishOne(s, "evt-1", "t")
	deliveryID := DeliveryID("billing", ev.ID)
	first := b.claim(s, "worker-a")
	if err := s.FinishAttempt(b.ctx, first, pulsetype.AttemptResult{Status: pulsetype.StatusError, HTTPStatus: 500,
		Error: &pulsetype.ErrorInfo{Code: pulsetype.CodeHandlerError, Message: "500"}}); err != nil {
		t.Fatalf("FinishAttempt: %v", err)
	}

	for i, want := range []bool{true, false} {
		created, err := s.CreateAttempt(b.ctx, pulsetype.DeliveryRef{DeliveryID: deliveryID, EventID: ev.ID, ConsumerGroup: "billing", Topic: "t"}, 2, time.Second)
		if err != nil || created != want {
			t.Fatalf("CreateAttempt #%d of attempt 2 = %v, %v; want %v, nil", i+1, created, err, want)
		}
	}
	if got := b.count("history", bson.M{"deliveryId": deliveryID, "attempt": 2}); got != 1 {
		t.Errorf("%d documents for attempt 2, want 1", got)
	}
	if a, err := s.Claim(b.ctx, "worker-a", nil); err != nil || a != nil {
		t.Fatalf("Claim before attempt 2 is due = %+v, %v; want nil, nil", a, err)
	}
	b.clock.Advance(time.Second)
	second := b.claim(s, "worker-a")
	if second.Number != 2 || second.DeliveryID != deliveryID {
		t.Fatalf("claimed %+v, want attempt 2 of %s", second, deliveryID)
	}

	const n = 8
	created := make([]bool, n)
	errs := make([]error, n)
	concurrently(n, func(i int) {
		created[i], errs[i] = s.CreateAttempt(b.ctx, pulsetype.DeliveryRef{DeliveryID: deliveryID, EventID: ev.ID, ConsumerGroup: "billing", Topic: "t"}, 3, 0)
	})
	winners := 0
	for i := range n {
		if errs[i] != nil {
			t.Errorf("concurrent CreateAttempt #%d: %v", i, errs[i])
		}
		if created[i] {
			winners++
		}
	}
	if winners != 1 || b.count("history", bson.M{"deliveryId": deliveryID, "attempt": 3}) != 1 {
		t.Errorf("%d concurrent CreateAttempt calls created attempt 3, want exactly 1 (and one document)", winners)
	}

	for i, want := range []bool{true, false} {
		status := []pulsetype.Status{pulsetype.StatusSuccess, pulsetype.StatusError}[i]
		var e *pulsetype.ErrorInfo
		if status == pulsetype.StatusError {
			e = &pulsetype.ErrorInfo{Code: pulsetype.CodeHandlerError, Message: "late"}
		}
		ended, err := s.EndDelivery(b.ctx, pulsetype.EndDeliveryParams{DeliveryID: deliveryID, Status: status, FinalAttempt: 2, Error: e})
		if err != nil || ended != want {
			t.Fatalf("EndDelivery #%d = %v, %v; want %v, nil", i+1, ended, err, want)
		}
	}
	d, attempts, err := s.GetDelivery(b.ctx, deliveryID)
	if err != nil {
		t.Fatalf("GetDelivery: %v", err)
	}
	if d.Status != pulsetype.StatusSuccess || d.FinalAttempt != 2 || d.EndedAt == nil || d.Error != nil {
		t.Errorf("delivery after EndDelivery twice = %+v; want success, final attempt 2, no error", d)
	}
	if len(attempts) != 3 || attempts[0].Number != 1 || attempts[1].Number != 2 || attempts[2].Number != 3 {
		t.Fatalf("attempts = %+v, want 1, 2, 3 in order", attempts)
	}
	wantStates := []pulsetype.LeaseState{"", pulsetype.LeaseActive, pulsetype.LeaseQueued}
	for i, a := range attempts {
		if a.LeaseState != wantStates[i] {
			t.Errorf("attempt %d lockState = %q, want %q", a.Number, a.LeaseState, wantStates[i])
		}
	}
	if _, _, err := s.GetDelivery(b.ctx, "no-such-delivery"); !errors.Is(err, pulsetype.ErrNotFound) {
		t.Errorf("GetDelivery(unknown) = %v, want ErrNotFound", err)
	}
}

func testExpiredDocumentsAreInvisibleAndSwept(t *testing.T, e *env) {
	b := e.setup(t)
	s := b.store(nil, func(o *Options) { o.EventRetention, o.HistoryRetention = time.Minute, time.Minute })
	t0 := b.clock.Now()
	b.putEndpoint(s, "billing", "t")
	ev := b.publishOne(s, "evt-old", "t")
	deliveryID := DeliveryID("billing", ev.ID)
	a := b.claim(s, "worker-a")
	if err := s.FinishAttempt(b.ctx, a, pulsetype.AttemptResult{Status: pulsetype.StatusSuccess, HTTPStatus: 204}); err != nil {
		t.Fatalf("FinishAttempt: %v", err)
	}
	b.endDelivery(s, pulsetype.EndDeliveryParams{DeliveryID: deliveryID, Status: pulsetype.StatusSuccess, FinalAttempt: 1})
	b.clock.Advance(30 * time.Second)
	if _, err := s.Publish(b.ctx, []*pulsetype.Event{event("evt-young", "other", `2`)}); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	// Staged leftovers of a publisher that crashed before its commit: one older than StagedTimeout, one fresh.
	staged := []any{
		&eventDoc{ID: "evt-staged-old", Topic: "t", Data: `3`, CreatedAt: t0.Add(-2 * StagedTimeout), Staged: true},
		&eventDoc{ID: "evt-staged-new", Topic: "t", Data: `4`, CreatedAt: b.clock.Now(), Staged: true},
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
	if onFerretDB() && s.Capabilities().TTLIndexes {
		t.Errorf("Capabilities().TTLIndexes = true on FerretDB")
	}
	want := int64(1) // the old staged event
	if !s.Capabilities().TTLIndexes {
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

func TestDeliveryIDIsDeterministic(t *testing.T) {
	t.Parallel()
	a, b := DeliveryID("billing", "evt-1"), DeliveryID("billing", "evt-1")
	if a != b {
		t.Fatalf("DeliveryID differs between calls: %s, %s", a, b)
	}
	others := []string{DeliveryID("audit", "evt-1"), DeliveryID("billing", "evt-2"), DeliveryID("billin", "gevt-1")}
	for _, o := range others {
		if o == a {
			t.Errorf("DeliveryID collision: %s", fmt.Sprint(others))
		}
	}
}

// Concurrent identical array publishes (a client retrying while its first try is in flight) never lose
// events and never answer a conflict: every call succeeds and all events end committed.
func testConcurrentIdenticalArrayPublishes(t *testing.T, e *env) {
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

// Replay walks the window once: more than one batch of successful deliveries is reopened exactly once each,
// even though reopened deliveries could match the filter again.
func testReplayVisitsEachDeliveryOnce(t *testing.T, e *env) {
	b := e.setup(t)
	s := b.store(nil, nil)
	ctx := b.ctx
	if _, _, err := s.PutEndpoint(ctx, b.endpoint("g", "t")); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	docs := make([]any, 130)
	for i := range docs {
		docs[i] = bson.M{"_id": fmt.Sprintf("d%03d", i), "eventId": fmt.Sprintf("e%03d", i), "consumerGroup": "g", "topic": "t",
			"status": "success", "createdAt": now, "updatedAt": now, "eventCreatedAt": now}
	}
	if _, err := s.deliveries.InsertMany(ctx, docs); err != nil {
		t.Fatal(err)
	}
	n, err := s.ReplayDeliveries(ctx, pulsetype.ReplayParams{ConsumerGroup: "g", Status: pulsetype.StatusSuccess, From: now.Add(-time.Hour), To: now.Add(time.Hour)})
	if err != nil || n != 130 {
		t.Fatalf("replayed %d (%v), want 130", n, err)
	}
	if c, _ := s.history.CountDocuments(ctx, bson.M{}); c != 130 {
		t.Fatalf("%d attempts created, want one per delivery", c)
	}
}
