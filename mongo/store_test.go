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

func (b *bundle) count(suffix string, filter any) int64 {
	b.t.Helper()
	return storetest.Count(b.t, b.ctx, b.coll(suffix), filter)
}

func (b *bundle) endpoint(group string, topics ...string) *pulsetype.Endpoint {
	b.t.Helper()
	return storetest.Endpoint(b.t, group, topics...)
}

func (b *bundle) putEndpoint(s *Store, group string, topics ...string) {
	b.t.Helper()
	storetest.PutEndpoint(b.t, b.ctx, s, group, topics...)
}

// putOrdered registers an ordered consumer group listing topic through s.
func (b *bundle) putOrdered(s *Store, group, topic string) {
	b.t.Helper()
	ep := b.endpoint(group, topic)
	ep.Ordered = true
	if _, _, err := s.PutEndpoint(b.ctx, ep); err != nil {
		b.t.Fatalf("PutEndpoint %s: %v", group, err)
	}
}

func (b *bundle) publishOne(s *Store, id, topic string) *pulsetype.Event {
	b.t.Helper()
	return storetest.PublishOne(b.t, b.ctx, s, id, topic)
}

func (b *bundle) claim(s *Store, owner string) *pulsetype.Attempt {
	b.t.Helper()
	return storetest.Claim(b.t, b.ctx, s, owner)
}

func (b *bundle) endDelivery(s *Store, p pulsetype.EndDeliveryParams) {
	b.t.Helper()
	storetest.EndDelivery(b.t, b.ctx, s, p)
}

func (b *bundle) fanOutN(s *Store, n int, topic string) []*pulsetype.Attempt {
	b.t.Helper()
	return storetest.FanOutN(b.t, b.ctx, s, n, topic)
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
