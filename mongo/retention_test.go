package mongo

import (
	"context"
	"slices"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	mongodrv "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// EnsureSchema first probes for TTL indexes on a scratch collection (a createIndexes with expireAfterSeconds
// 0 named pulse_probe_ttl, checked in the commands sent). Where the server has them, it asks for TTL indexes
// with expireAfterSeconds 0 on expiresAt and they exist afterwards (a real MongoDB via
// PULSE_TEST_MONGODB_URI); where it refuses them (FerretDB: 238), it asks for none, creates plain indexes
// and reports TTL=false for the sweeper.
func testTTLIndexesAreRequested(t *testing.T, e *env) {
	b := e.setup(t)
	s, log := b.monitoredStore()
	caps := s.Capabilities()
	var ttl []string
	for _, c := range log.named("createIndexes") {
		idx, _ := c.Lookup("indexes").Array().Values()
		for _, v := range idx {
			d := v.Document()
			if exp, ok := d.Lookup("expireAfterSeconds").AsInt64OK(); ok && exp == 0 {
				ttl = append(ttl, d.Lookup("name").StringValue())
			}
		}
	}
	want := []string{"pulse_probe_ttl"}
	if caps.TTLIndexes {
		want = append(want, "pulse_events_expires_at_ttl", "pulse_deliveries_expires_at_ttl", "pulse_history_expires_at_ttl")
	}
	if !slices.Equal(ttl, want) {
		t.Fatalf("createIndexes with expireAfterSeconds 0 sent for %v, want %v (server TTL %v)", ttl, want, caps.TTLIndexes)
	}
	if caps.TTLIndexes {
		found, err := listIndexes(context.Background(), s.history)
		if err != nil {
			t.Fatal(err)
		}
		if ix := found["pulse_history_expires_at_ttl"]; ix.ExpireAfterSeconds == nil || *ix.ExpireAfterSeconds != 0 {
			t.Fatalf("TTL index = %+v", ix)
		}
	}
}

// expiresAt is written only when a document becomes terminal (events at publication): pending deliveries
// and attempts carry none, terminal ones carry endedAt + history retention, and retention 0 writes none.
func testExpiresAtOnlyOnTerminalDocuments(t *testing.T, e *env) {
	b := e.setup(t)
	client, dbName := b.client, b.dbName
	for _, retention := range []time.Duration{time.Hour, 0} {
		prefix := "keep"
		if retention > 0 {
			prefix = "ret"
		}
		s := New(client, Options{Database: dbName, CollectionPrefix: prefix, LeaseTimeout: time.Second, EventRetention: retention, HistoryRetention: retention})
		ctx := context.Background()
		if _, err := s.EnsureSchema(ctx); err != nil {
			t.Fatal(err)
		}
		ep := &pulsetype.Endpoint{ConsumerGroup: "g", URL: "http://127.0.0.1:1/", Topics: []string{"t"}}
		if err := ep.Normalize(); err != nil {
			t.Fatal(err)
		}
		if _, _, err := s.PutEndpoint(ctx, ep); err != nil {
			t.Fatal(err)
		}
		ev := &pulsetype.Event{ID: "e1", Topic: "t", Data: []byte("1")}
		if _, err := s.Publish(ctx, []*pulsetype.Event{ev}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.FanOut(ctx, []*pulsetype.Event{ev}); err != nil {
			t.Fatal(err)
		}
		expiresAt := func(coll *mongodrv.Collection) *time.Time {
			var d struct {
				ExpiresAt *time.Time `bson:"expiresAt"`
			}
			if err := coll.FindOne(ctx, bson.M{}).Decode(&d); err != nil {
				t.Fatal(err)
			}
			return d.ExpiresAt
		}
		if got := expiresAt(s.events); (got != nil) != (retention > 0) {
			t.Fatalf("retention %s: event expiresAt = %v", retention, got)
		}
		if expiresAt(s.deliveries) != nil || expiresAt(s.history) != nil {
			t.Fatalf("retention %s: a pending delivery or attempt carries expiresAt", retention)
		}
		a, err := s.Claim(ctx, "me", nil)
		if err != nil || a == nil {
			t.Fatalf("claim: %v %v", a, err)
		}
		if err := s.FinishAttempt(ctx, a, pulsetype.AttemptResult{Status: pulsetype.StatusSuccess}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.EndDelivery(ctx, pulsetype.EndDeliveryParams{DeliveryID: a.DeliveryID, Status: pulsetype.StatusSuccess, FinalAttempt: 1}); err != nil {
			t.Fatal(err)
		}
		for _, coll := range []*mongodrv.Collection{s.deliveries, s.history} {
			got := expiresAt(coll)
			if retention == 0 && got != nil {
				t.Fatalf("retention 0: %s carries expiresAt %v", coll.Name(), got)
			}
			if retention > 0 && (got == nil || got.Sub(time.Now()) < retention-time.Minute) {
				t.Fatalf("retention %s: %s expiresAt = %v", retention, coll.Name(), got)
			}
		}
	}
}
