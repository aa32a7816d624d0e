package storetest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// operateCases are the cases of operate.
var operateCases = []Case{
	{Name: "ReplayVisitsEachDeliveryOnce", Run: testReplayVisitsEachDeliveryOnce},
	{Name: "RetryOfExpiringDeliveryIsNotSweptAway", Run: testRetryOfExpiringDeliveryIsNotSweptAway},
	{Name: "RetryAfterTheHistoryExpiredIsNotFound", Run: testRetryAfterTheHistoryExpiredIsNotFound},
	{Name: "ReplayAppliesTheCurrentFilter", Run: testReplayAppliesTheCurrentFilter},
}

// Replay and retry apply the group's whole current rule: after a PUT narrows the filter, a replay re-opens
// only the deliveries whose event the new filter takes, and a retry of one it refuses answers
// ErrNotSubscribed, as for a topic the group dropped.
func testReplayAppliesTheCurrentFilter(t *testing.T, e *Env) {
	b := e.setup(t)
	s := b.store(nil, nil)
	ctx := b.ctx
	put := func(filter string) {
		t.Helper()
		ep := b.endpoint("fc", "t")
		ep.Filter = filter
		if _, _, err := s.PutEndpoint(ctx, ep); err != nil {
			t.Fatalf("PutEndpoint filter %q: %v", filter, err)
		}
	}
	put("event.data.n > 0")
	evs := []*pulsetype.Event{Event("n1", "t", `{"n":1}`), Event("n2", "t", `{"n":2}`)}
	if _, err := s.Publish(ctx, evs); err != nil {
		t.Fatal(err)
	}
	first, err := s.FanOut(ctx, evs)
	if err != nil || len(first) != 2 {
		t.Fatalf("FanOut = %d attempts, %v; want 2", len(first), err)
	}
	for range first {
		a := b.claim(s, "w")
		if err := s.FinishAttempt(ctx, a, pulsetype.AttemptResult{Status: pulsetype.StatusSuccess, HTTPStatus: 200, Duration: time.Millisecond}); err != nil {
			t.Fatal(err)
		}
		b.endDelivery(s, pulsetype.EndDeliveryParams{DeliveryID: a.DeliveryID, Status: pulsetype.StatusSuccess, FinalAttempt: a.Number})
	}
	put("event.data.n > 1")
	now := b.clock.Now()
	n, err := s.ReplayDeliveries(ctx, pulsetype.ReplayParams{ConsumerGroup: "fc", Status: pulsetype.StatusSuccess, From: now.Add(-time.Hour), To: now.Add(time.Hour)})
	if err != nil || n != 1 {
		t.Fatalf("replayed %d (%v), want 1: only n:2 passes the current filter", n, err)
	}
	if d, _, err := s.GetDelivery(ctx, b.deliveryID("fc", "n2")); err != nil || d.Status != pulsetype.StatusPending {
		t.Fatalf("n:2 after the replay = %+v, %v; want pending", d, err)
	}
	if d, _, err := s.GetDelivery(ctx, b.deliveryID("fc", "n1")); err != nil || d.Status != pulsetype.StatusSuccess {
		t.Fatalf("n:1 after the replay = %+v, %v; want success still", d, err)
	}
	if _, err := s.RetryDelivery(ctx, b.deliveryID("fc", "n1")); !errors.Is(err, pulsetype.ErrNotSubscribed) {
		t.Fatalf("RetryDelivery of n:1, which the filter refuses now = %v, want ErrNotSubscribed", err)
	}
}

// Replay walks the window once: more than one batch of successful deliveries is reopened exactly once each,
// even though reopened deliveries could match the filter again.
func testReplayVisitsEachDeliveryOnce(t *testing.T, e *Env) {
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
	if _, err := b.coll("deliveries").InsertMany(ctx, docs); err != nil {
		t.Fatal(err)
	}
	n, err := s.ReplayDeliveries(ctx, pulsetype.ReplayParams{ConsumerGroup: "g", Status: pulsetype.StatusSuccess, From: now.Add(-time.Hour), To: now.Add(time.Hour)})
	if err != nil || n != 130 {
		t.Fatalf("replayed %d (%v), want 130", n, err)
	}
	if c, _ := b.coll("history").CountDocuments(ctx, bson.M{}); c != 130 {
		t.Fatalf("%d attempts created, want one per delivery", c)
	}
}

// A manual retry (RetryDelivery, POST /v1/deliveries/{id}/retry) of a terminal delivery whose history is about
// to expire is not swept away under it: the retry removes the delivery's expiresAt, its new attempt carries
// none, and a Sweep after the old expiresAt leaves both alone (only the old, ended attempts go). The retry is
// then claimable, and retention starts again from its new end. Rows vary when the retry comes: before
// anything expired, or after the final attempt expired (and was swept) but not yet the delivery, which ended
// a second after it. The store's fake clock drives expiry; Sweep deletes only where the server has no TTL
// indexes (FerretDB), and on MongoDB the checks on expiresAt carry the case (the TTL monitor deletes by the
// same field, on the real clock).
func testRetryOfExpiringDeliveryIsNotSweptAway(t *testing.T, e *Env) {
	const retention = time.Minute
	tests := []struct {
		name       string
		endedAfter time.Duration // between the attempt's end and the delivery's
		retryAt    time.Duration // after the attempt's end
		wantNumber int           // the retry's attempt number
	}{
		{name: "one second before the history expires", retryAt: retention - time.Second, wantNumber: 2},
		{name: "after the final attempt expired and was swept", endedAfter: time.Second, retryAt: retention + 500*time.Millisecond, wantNumber: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := e.setup(t)
			s := b.store(nil, func(o *Options) { o.HistoryRetention = retention })
			id, a, fail := b.failedAttempt(s)
			t0 := b.clock.Now()
			b.clock.Advance(tt.endedAfter)
			b.endDelivery(s, pulsetype.EndDeliveryParams{DeliveryID: id, Status: pulsetype.StatusError, FinalAttempt: 1, Error: fail})
			oldExpiry := b.clock.Now().Add(retention)

			b.clock.Advance(t0.Add(tt.retryAt).Sub(b.clock.Now()))
			if _, err := s.Sweep(b.ctx); err != nil {
				t.Fatalf("Sweep before the retry: %v", err)
			}
			n, err := s.RetryDelivery(b.ctx, id)
			if err != nil {
				t.Fatalf("RetryDelivery %s before its expiresAt = %v", b.clock.Now().Sub(oldExpiry), err)
			}
			if n != tt.wantNumber {
				t.Errorf("RetryDelivery = attempt %d, want %d (numbers continue after the final attempt, swept or not)", n, tt.wantNumber)
			}
			var d storedDelivery
			if err := b.coll("deliveries").FindOne(b.ctx, bson.M{"_id": id}).Decode(&d); err != nil {
				t.Fatalf("read the reopened delivery: %v", err)
			}
			if d.Status != pulsetype.StatusPending || d.ExpiresAt != nil || d.EndedAt != nil {
				t.Fatalf("reopened delivery = status %s expiresAt %v endedAt %v, want pending without either", d.Status, d.ExpiresAt, d.EndedAt)
			}
			var next storedAttempt
			if err := b.coll("history").FindOne(b.ctx, bson.M{"deliveryId": id, "attempt": n}).Decode(&next); err != nil {
				t.Fatalf("read attempt %d: %v", n, err)
			}
			if next.Status != pulsetype.StatusPending || next.ExpiresAt != nil {
				t.Fatalf("attempt %d = status %s expiresAt %v, want pending without expiresAt", n, next.Status, next.ExpiresAt)
			}

			b.clock.Advance(oldExpiry.Sub(b.clock.Now()) + retention) // well past the old expiresAt
			if _, err := s.Sweep(b.ctx); err != nil {
				t.Fatalf("Sweep: %v", err)
			}
			if got := b.count("deliveries", bson.M{"_id": id}); got != 1 {
				t.Fatalf("the sweep removed the reopened delivery")
			}
			if got := b.count("history", bson.M{"_id": next.ID}); got != 1 {
				t.Fatalf("the sweep removed the retry's attempt %d", n)
			}
			if !s.TTLIndexes() {
				if got := b.count("history", bson.M{"_id": a.ID}); got != 0 {
					t.Errorf("the expired attempt 1 survived the sweep: the sweep did not run as the test assumes")
				}
			}
			got, attempts, err := s.GetDelivery(b.ctx, id)
			if err != nil || got.Status != pulsetype.StatusPending || len(attempts) == 0 || attempts[len(attempts)-1].Number != n {
				t.Fatalf("GetDelivery after the sweep = %+v, %v attempts, %v; want pending ending with attempt %d", got, len(attempts), err, n)
			}
			retry := b.claim(s, "worker-b")
			if retry.ID != next.ID {
				t.Fatalf("claimed %s (attempt %d), want the retry's attempt %s", retry.ID, retry.Number, next.ID)
			}
			if err := s.FinishAttempt(b.ctx, retry, pulsetype.AttemptResult{Status: pulsetype.StatusSuccess, HTTPStatus: 204}); err != nil {
				t.Fatalf("FinishAttempt of the retry: %v", err)
			}
			b.endDelivery(s, pulsetype.EndDeliveryParams{DeliveryID: id, Status: pulsetype.StatusSuccess, FinalAttempt: n})
			b.clock.Advance(retention - time.Millisecond)
			if _, _, err := s.GetDelivery(b.ctx, id); err != nil {
				t.Fatalf("GetDelivery 1 ms before the new expiresAt = %v", err)
			}
			b.clock.Advance(time.Millisecond)
			if _, _, err := s.GetDelivery(b.ctx, id); !errors.Is(err, pulsetype.ErrNotFound) {
				t.Fatalf("GetDelivery at the new expiresAt = %v, want ErrNotFound", err)
			}
		})
	}
}

// A retry that comes after the delivery's history expired finds nothing (ErrNotFound), whether the sweep ran
// or not, and does not revive it: the expired delivery keeps its expiresAt and the sweep removes it.
func testRetryAfterTheHistoryExpiredIsNotFound(t *testing.T, e *Env) {
	b := e.setup(t)
	s := b.store(nil, func(o *Options) { o.HistoryRetention = time.Minute })
	id, _, fail := b.failedAttempt(s)
	b.endDelivery(s, pulsetype.EndDeliveryParams{DeliveryID: id, Status: pulsetype.StatusError, FinalAttempt: 1, Error: fail})
	b.clock.Advance(time.Minute)
	if _, err := s.RetryDelivery(b.ctx, id); !errors.Is(err, pulsetype.ErrNotFound) {
		t.Fatalf("RetryDelivery at the delivery's expiresAt = %v, want ErrNotFound", err)
	}
	if got := b.count("history", bson.M{"deliveryId": id, "attempt": bson.M{"$gt": 1}}); got != 0 {
		t.Fatalf("the refused retry created %d attempts", got)
	}
	if got := b.count("deliveries", bson.M{"_id": id, "expiresAt": bson.M{"$ne": nil}}); got != 1 {
		t.Fatalf("the refused retry changed the expired delivery's expiresAt")
	}
	if _, err := s.Sweep(b.ctx); err != nil {
		t.Fatalf("Sweep: %v", err)
	}
	if !s.TTLIndexes() && b.count("deliveries", bson.M{"_id": id}) != 0 {
		t.Fatalf("the sweep kept the expired delivery")
	}
}

// failedAttempt registers billing for topic t, publishes evt-1 and ends its first attempt terminally with HTTP
// 500, leaving the delivery pending; it returns the delivery's id, the attempt and the error it ended with.
func (b *bundle) failedAttempt(s Store) (string, *pulsetype.Attempt, *pulsetype.ErrorInfo) {
	b.t.Helper()
	b.putEndpoint(s, "billing", "t")
	ev := b.publishOne(s, "evt-1", "t")
	a := b.claim(s, "worker-a")
	fail := &pulsetype.ErrorInfo{Code: pulsetype.CodeHandlerError, Message: "HTTP 500"}
	if err := s.FinishAttempt(b.ctx, a, pulsetype.AttemptResult{Status: pulsetype.StatusError, HTTPStatus: 500, Error: fail, Terminal: true}); err != nil {
		b.t.Fatalf("FinishAttempt: %v", err)
	}
	return b.deliveryID("billing", ev.ID), a, fail
}
