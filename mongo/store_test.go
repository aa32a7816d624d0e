package mongo

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/pulse-sidecar/pulse/mongo/storetest"
	"github.com/pulse-sidecar/pulse/pulsetype"
)

// testPrefix is the collection prefix of every test store.
const testPrefix = "pulse"

// bundle is what setup gives a test: its own database, a client on it and a clock the test advances.
type bundle struct {
	t      *testing.T
	ctx    context.Context
	srv    storetest.Server
	client *mongo.Client
	dbName string
	clock  *storetest.FakeClock
}

// setup marks t parallel and gives it a fresh database of e's server, in e's serialization (dropped in
// cleanup), and a fake clock.
func (e *env) setup(t *testing.T) *bundle {
	t.Helper()
	t.Parallel()
	srv := e.open(t, e.order)
	ctx, cancel := storetest.Context(t)
	t.Cleanup(cancel)
	return &bundle{t: t, ctx: ctx, srv: srv, client: srv.Client, dbName: srv.Database,
		clock: storetest.NewFakeClock(time.Now().UTC().Truncate(time.Millisecond))}
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
	out, err := s.Publish(b.ctx, []*pulsetype.Event{storetest.Event(id, topic, `{"n":1}`)})
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
