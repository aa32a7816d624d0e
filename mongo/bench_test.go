package mongo

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	driverevent "go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/pulse-sidecar/pulse/internal/testdb"
	"github.com/pulse-sidecar/pulse/mongo/storetest"
	"github.com/pulse-sidecar/pulse/pulsetype"
)

// benchStore returns a store on a fresh database of the test server whose client counts the commands it
// sends, with consumer groups "ledger" and "mailer" subscribed to topic "t".
func benchStore(b *testing.B) (*Store, *atomic.Int64) {
	b.Helper()
	var commands atomic.Int64
	client, err := mongo.Connect(options.Client().ApplyURI(testdb.URI(b)).SetMonitor(&driverevent.CommandMonitor{
		Started: func(context.Context, *driverevent.CommandStartedEvent) { commands.Add(1) },
	}))
	if err != nil {
		b.Fatal(err)
	}
	dbName := fmt.Sprintf("bench_%d", time.Now().UnixNano())
	b.Cleanup(func() {
		_ = client.Database(dbName).Drop(context.Background())
		_ = client.Disconnect(context.Background())
	})
	s := New(client, Options{Database: dbName, CollectionPrefix: testPrefix, LeaseTimeout: 30 * time.Second, Logger: zerolog.Nop()})
	ctx := context.Background()
	if _, err := s.EnsureSchema(ctx); err != nil {
		b.Fatal(err)
	}
	for _, g := range []string{"ledger", "mailer"} {
		ep := &pulsetype.Endpoint{ConsumerGroup: g, URL: "http://127.0.0.1:9/" + g, Topics: []string{"t"}}
		if err := ep.Normalize(); err != nil {
			b.Fatal(err)
		}
		if _, _, err := s.PutEndpoint(ctx, ep); err != nil {
			b.Fatal(err)
		}
	}
	return s, &commands
}

// BenchmarkDeliveryPath measures the store's side of delivering events to two consumer groups, from the
// event's insert to the delivery's end, and reports database commands and wall time per delivery. Every
// iteration publishes 32 events (64 deliveries), so each sub-benchmark grows the collections alike:
//   - batched/N: the dispatcher's path for events published to this process, N events at a time: FanOut,
//     ClaimAttempts with the created attempts, FinishAttempts and FollowUps of all results, ClearFanOut;
//   - one-by-one: the same deliveries made one attempt at a time: per attempt one claim
//     query and one fenced claim, one event read, one result write and one delivery end.
//
// Run: go test -run '^$' -bench DeliveryPath -benchtime 10x ./mongo/
func BenchmarkDeliveryPath(b *testing.B) {
	for _, batch := range []int{1, 8, 32} {
		b.Run(fmt.Sprintf("batched/%d", batch), func(b *testing.B) { benchDeliveries(b, batch, true) })
	}
	b.Run("one-by-one", func(b *testing.B) { benchDeliveries(b, 1, false) })
}

// eventsPerIteration is how many events each iteration of BenchmarkDeliveryPath publishes.
const eventsPerIteration = 32

func benchDeliveries(b *testing.B, batch int, batched bool) {
	s, commands := benchStore(b)
	next, deliveries := 0, 0
	commands.Store(0)
	for b.Loop() {
		for range eventsPerIteration / batch {
			deliveries += deliverBatch(b, s, batch, batched, &next)
		}
	}
	b.ReportMetric(float64(commands.Load())/float64(deliveries), "cmds/delivery")
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(deliveries), "µs/delivery")
}

// deliverBatch publishes batch events and delivers them to both groups; it returns the deliveries made.
func deliverBatch(b *testing.B, s *Store, batch int, batched bool, next *int) int {
	ctx := context.Background()
	events := make([]*pulsetype.Event, batch)
	ids := make([]string, batch)
	for i := range events {
		out, err := s.Publish(ctx, []*pulsetype.Event{storetest.Event(fmt.Sprintf("evt-%d", *next), "t", `{"amount":1}`)})
		if err != nil {
			b.Fatal(err)
		}
		*next++
		events[i], ids[i] = out[0].Event, out[0].Event.ID
	}
	created, err := s.FanOut(ctx, events)
	if err != nil {
		b.Fatal(err)
	}
	n := len(created)
	if batched {
		leased, err := s.ClaimAttempts(ctx, "bench", created)
		if err != nil || len(leased) != len(created) {
			b.Fatalf("ClaimAttempts = %d of %d, %v", len(leased), len(created), err)
		}
		cs := make([]pulsetype.Completion, len(leased))
		for i, a := range leased {
			cs[i] = pulsetype.Completion{Attempt: a, Result: pulsetype.AttemptResult{Status: pulsetype.StatusSuccess, HTTPStatus: 200, Duration: time.Millisecond},
				Next: pulsetype.NextStep{EndStatus: pulsetype.StatusSuccess}}
		}
		if _, err := s.FinishAttempts(ctx, cs); err != nil {
			b.Fatal(err)
		}
		if err := s.FollowUps(ctx, cs); err != nil {
			b.Fatal(err)
		}
	} else {
		deliverOneByOne(b, s, n)
	}
	if err := s.ClearFanOut(ctx, ids); err != nil {
		b.Fatal(err)
	}
	return n
}

// deliverOneByOne claims, reads, records and ends n due attempts one at a time.
func deliverOneByOne(b *testing.B, s *Store, n int) {
	ctx := context.Background()
	for range n {
		a, err := s.Claim(ctx, "bench", nil)
		if err != nil || a == nil {
			b.Fatalf("Claim = %v, %v", a, err)
		}
		if _, err := s.GetEvent(ctx, a.EventID); err != nil {
			b.Fatal(err)
		}
		if err := s.FinishAttempt(ctx, a, pulsetype.AttemptResult{Status: pulsetype.StatusSuccess, HTTPStatus: 200, Duration: time.Millisecond}); err != nil {
			b.Fatal(err)
		}
		if _, err := s.EndDelivery(ctx, pulsetype.EndDeliveryParams{DeliveryID: a.DeliveryID, Status: pulsetype.StatusSuccess, FinalAttempt: a.Number}); err != nil {
			b.Fatal(err)
		}
	}
}
