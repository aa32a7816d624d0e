package storetest

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/pulse-sidecar/pulse/internal/testwait"
	"github.com/pulse-sidecar/pulse/pulsetype"
)

// Prefix is the collection prefix of every store the suite builds.
const Prefix = "pulse"

// contextMargin is how long before the test binary's deadline (go test -timeout) a case's context ends,
// so that a case that waits on the database fails with its own message rather than the binary's panic.
const contextMargin = 30 * time.Second

// Context returns t's context, ended contextMargin before the test binary's deadline when it has one. A
// case's database calls are bounded by it, not by a shorter time of their own: on a busy machine a call may
// wait long for the server, and the bound that holds is the one the caller of go test chose.
func Context(t *testing.T) (context.Context, context.CancelFunc) {
	if deadline, ok := t.Deadline(); ok {
		return context.WithDeadline(t.Context(), deadline.Add(-contextMargin))
	}
	return context.WithCancel(t.Context())
}

// bundle is what setup gives a case: its own database, a client on it and a clock the case advances.
type bundle struct {
	t      *testing.T
	e      *Env
	ctx    context.Context
	srv    Server
	client *mongo.Client
	dbName string
	clock  *FakeClock
}

// setup marks t parallel and gives it a fresh database of e's server, in e's serialization (dropped in
// cleanup), and a fake clock.
func (e *Env) setup(t *testing.T) *bundle {
	t.Helper()
	t.Parallel()
	srv := e.Open(t, e.Order)
	ctx, cancel := Context(t)
	t.Cleanup(cancel)
	return &bundle{t: t, e: e, ctx: ctx, srv: srv, client: srv.Client, dbName: srv.Database,
		clock: &FakeClock{now: time.Now().UTC().Truncate(time.Millisecond)}}
}

// FakeClock is a store's Now that only moves when the test advances it. It is safe for concurrent use.
type FakeClock struct {
	mu  sync.Mutex
	now time.Time
}

// NewFakeClock returns a clock standing at now.
func NewFakeClock(now time.Time) *FakeClock { return &FakeClock{now: now} }

// Now returns the clock's time.
func (c *FakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock on by d and returns its new time.
func (c *FakeClock) Advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	return c.now
}

// connect returns a second, independent client on the case's server (another replica's connection pool),
// disconnected in cleanup.
func (b *bundle) connect() *mongo.Client { return b.srv.Connect(nil) }

// store returns a store on client (the bundle's when nil) on the bundle's database and fake clock, with a
// 30-second lease; mod may change its options.
func (b *bundle) store(client *mongo.Client, mod func(o *Options)) Store {
	b.t.Helper()
	if client == nil {
		client = b.client
	}
	o := Options{Database: b.dbName, CollectionPrefix: Prefix, LeaseTimeout: 30 * time.Second, Now: b.clock.Now}
	if mod != nil {
		mod(&o)
	}
	return b.e.NewStore(b.t, client, o)
}

// deliveryID is the store's id of the delivery of eventID to group.
func (b *bundle) deliveryID(group, eventID string) string { return b.e.DeliveryID(group, eventID) }

// coll returns the collection <prefix>.<suffix> of the case's database.
func (b *bundle) coll(suffix string) *mongo.Collection {
	return b.client.Database(b.dbName).Collection(Prefix + "." + suffix)
}

// countWhere returns how many documents of <prefix>.<suffix>, decoded as T, keep reports true for: a count
// by a stored field the suite reads through T's struct tags rather than spells in a filter.
func countWhere[T any](b *bundle, suffix string, keep func(T) bool) int64 {
	b.t.Helper()
	cur, err := b.coll(suffix).Find(b.ctx, bson.M{})
	if err != nil {
		b.t.Fatalf("read %s: %v", suffix, err)
	}
	var docs []T
	if err := cur.All(b.ctx, &docs); err != nil {
		b.t.Fatalf("read %s: %v", suffix, err)
	}
	var n int64
	for _, d := range docs {
		if keep(d) {
			n++
		}
	}
	return n
}

// count returns how many documents of <prefix>.<suffix> match filter.
func (b *bundle) count(suffix string, filter any) int64 {
	b.t.Helper()
	return Count(b.t, b.ctx, b.coll(suffix), filter)
}

func (b *bundle) endpoint(group string, topics ...string) *pulsetype.Endpoint {
	b.t.Helper()
	return Endpoint(b.t, group, topics...)
}

func (b *bundle) putEndpoint(s Store, group string, topics ...string) {
	b.t.Helper()
	PutEndpoint(b.t, b.ctx, s, group, topics...)
}

func (b *bundle) publishOne(s Store, id, topic string) *pulsetype.Event {
	b.t.Helper()
	return PublishOne(b.t, b.ctx, s, id, topic)
}

func (b *bundle) claim(s Store, owner string) *pulsetype.Attempt {
	b.t.Helper()
	return Claim(b.t, b.ctx, s, owner)
}

func (b *bundle) endDelivery(s Store, p pulsetype.EndDeliveryParams) {
	b.t.Helper()
	EndDelivery(b.t, b.ctx, s, p)
}

func (b *bundle) fanOutN(s Store, n int, topic string) []*pulsetype.Attempt {
	b.t.Helper()
	return FanOutN(b.t, b.ctx, s, n, topic)
}

// IDs returns the ids of attempts, sorted.
func IDs(as []*pulsetype.Attempt) []string {
	out := make([]string, len(as))
	for i, a := range as {
		out[i] = a.ID
	}
	slices.Sort(out)
	return out
}

// Concurrently runs f(i) for i in [0, n) in n goroutines released at once and waits for them: the
// race cases' way of starting replicas together.
func Concurrently(n int, f func(i int)) {
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

// eventually waits for cond with testwait.Eventually, bounded by the case's deadline (WaitBound): a case's
// wait for something another party or the clock does.
func (b *bundle) eventually(what string, cond func() bool) {
	b.t.Helper()
	testwait.Eventually(b.t, WaitBound(b.t), what, cond)
}

// WaitBound is how long a case may wait for an outcome (testwait.Eventually's timeout): until its context
// ends (see Context), or 5 minutes without a test deadline. It bounds a stuck case and is never the
// assertion.
func WaitBound(t *testing.T) time.Duration {
	if deadline, ok := t.Deadline(); ok {
		return max(time.Until(deadline.Add(-contextMargin)), time.Second)
	}
	return 5 * time.Minute
}

// storedAttempt is an attempt document of <prefix>.history as the suite reads it: the fields its cases
// check, by their stored names.
type storedAttempt struct {
	ID           string               `bson:"_id"`
	DeliveryID   string               `bson:"deliveryId"`
	Attempt      int                  `bson:"attempt"`
	Status       pulsetype.Status     `bson:"status"`
	Error        *pulsetype.ErrorInfo `bson:"error,omitempty"`
	HTTPStatus   int                  `bson:"httpStatus,omitempty"`
	DurationMs   *int64               `bson:"durationMs,omitempty"`
	ResponseBody string               `bson:"responseBody,omitempty"`
	LeaseOwner   string               `bson:"lockOwner,omitempty"`
	FencingToken string               `bson:"lockToken,omitempty"`
	LeasedUntil  *time.Time           `bson:"lockedUntil,omitempty"`
	StartedAt    *time.Time           `bson:"startedAt,omitempty"`
	EndedAt      *time.Time           `bson:"endedAt,omitempty"`
	ExpiresAt    *time.Time           `bson:"expiresAt,omitempty"`
}

// storedDelivery is a delivery document of <prefix>.deliveries as the suite reads it.
type storedDelivery struct {
	ID           string               `bson:"_id"`
	Status       pulsetype.Status     `bson:"status"`
	FinalAttempt int                  `bson:"finalAttempt,omitempty"`
	Error        *pulsetype.ErrorInfo `bson:"error,omitempty"`
	EndedAt      *time.Time           `bson:"endedAt,omitempty"`
	ExpiresAt    *time.Time           `bson:"expiresAt,omitempty"`
}

// storedLease is the lease of an attempt document as a $set writes it, for cases that lease an attempt as
// a claimer would have before it died (every field set, as a claim sets them).
type storedLease struct {
	LeaseOwner   string    `bson:"lockOwner,omitempty"`
	FencingToken string    `bson:"lockToken,omitempty"`
	LeasedAt     time.Time `bson:"lockedAt,omitempty"`
	LeasedUntil  time.Time `bson:"lockedUntil,omitempty"`
	StartedAt    time.Time `bson:"startedAt,omitempty"`
}

// storedQueueEntry is a queue document of <prefix>.queue as the suite reads it: its copy of a lease.
type storedQueueEntry struct {
	ID           string     `bson:"_id"`
	Attempt      int        `bson:"attempt"`
	FencingToken string     `bson:"lockToken,omitempty"`
	LeasedUntil  *time.Time `bson:"lockedUntil,omitempty"`
}

// historyDoc reads one attempt document by id.
func (b *bundle) historyDoc(id string) storedAttempt {
	b.t.Helper()
	var d storedAttempt
	if err := b.coll("history").FindOne(b.ctx, bson.M{"_id": id}).Decode(&d); err != nil {
		b.t.Fatalf("find attempt %s: %v", id, err)
	}
	return d
}
