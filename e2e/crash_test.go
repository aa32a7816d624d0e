package e2e

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/pulse-sidecar/pulse/e2e/internal/harness"
	pmongo "github.com/pulse-sidecar/pulse/mongo"
)

// blockingReceiver answers its first POST only when the test says so (or the sender goes away); later POSTs
// get 200 at once. started is closed when the first POST arrives.
type blockingReceiver struct {
	*harness.Receiver
	started chan struct{}
	answer  chan int // the status of the first POST
	once    sync.Once
}

func newBlockingReceiver(t *testing.T) *blockingReceiver {
	br := &blockingReceiver{Receiver: harness.NewReceiver(t, 200), started: make(chan struct{}), answer: make(chan int, 1)}
	release := make(chan struct{})
	t.Cleanup(func() { close(release) }) // runs before the server's Close: never leave the handler blocked
	inner := br.Config.Handler
	br.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		first := false
		br.once.Do(func() { first = true })
		if !first {
			inner.ServeHTTP(w, r)
			return
		}
		body, _ := io.ReadAll(r.Body) // once the body is read, the server notices when the sender goes away
		br.Mu.Lock()
		br.Got = append(br.Got, harness.Received{Header: r.Header.Clone(), Body: body, At: time.Now()})
		br.Mu.Unlock()
		close(br.started)
		select {
		case status := <-br.answer:
			w.WriteHeader(status)
		case <-r.Context().Done():
		case <-release:
		}
	})
	return br
}

func waitClosed(t *testing.T, ch chan struct{}, timeout time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(timeout):
		t.Fatalf("timed out after %s waiting for %s", timeout, what)
	}
}

// Crash windows "during the handler" and "after a side effect but before history success" (docs/delivery.md,
// "Crash windows"): a sidecar is SIGKILLed while its webhook call is in flight (the receiver has or has not done its
// side effect yet); once the lease expires, a restarted replica records attempt 1 as worker_lost and POSTs
// attempt 2 with the same Idempotency-Key. The handler runs again.
func TestSIGKILLDuringWebhookIsRecoveredAsWorkerLost(t *testing.T) {
	for _, sideEffectDone := range []bool{false, true} {
		name := "during the handler"
		if sideEffectDone {
			name = "after the side effect"
		}
		t.Run(name, func(t *testing.T) {
			b := harness.Setup(t)
			env := b.FastEnv()
			env["PULSE_LOCK_TIMEOUT"] = "500ms"
			rcv := newBlockingReceiver(t)
			a := b.StartProcess(env)
			a.Sidecar().RegisterEndpoint(t, "billing", map[string]any{"url": rcv.URL, "topics": []string{"t"}, "retryDelay": "10ms"})
			id := a.Sidecar().Publish(t, "t", map[string]any{"n": 1})
			waitClosed(t, rcv.started, 20*time.Second, "the first POST")
			if sideEffectDone {
				rcv.answer <- 200 // the receiver commits its side effect; the sender dies before reading the answer
			}
			a.Kill()
			killedAt := time.Now()

			s := b.StartProcess(env).Sidecar()
			d := s.WaitDelivery(t, id, "billing", 30*time.Second)
			got := rcv.Received()
			recovery := got[len(got)-1].At.Sub(killedAt)
			t.Logf("recovery after SIGKILL: attempt 2 POSTed %s after the kill (lease timeout 500ms, includes the restart)", recovery.Round(time.Millisecond))
			if d.Status != "success" || len(d.Attempts) != 2 {
				t.Fatalf("delivery = %+v, want success after 2 attempts", d)
			}
			if e := d.Attempts[0].Error; d.Attempts[0].Status != "error" || e == nil || e.Code != "worker_lost" {
				t.Fatalf("attempt 1 = %+v, want error worker_lost", d.Attempts[0])
			}
			if len(got) != 2 || got[0].Header.Get("Idempotency-Key") != id || got[1].Header.Get("Idempotency-Key") != id ||
				got[1].Header.Get("Pulse-Attempt") != "2" {
				t.Fatalf("receiver got %d POSTs: %+v", len(got), got)
			}
		})
	}
}

// tornState writes an event, its delivery to group and the given attempts straight into the database, as a
// crash between two writes would leave them. It returns the event id.
func tornState(b *harness.Bundle, group string, delivery bson.M, attempts ...bson.M) string {
	b.T.Helper()
	return tornStateNamed(b, "ev-"+strings.ReplaceAll(b.T.Name(), "/", "-"), group, delivery, attempts...)
}

// tornStateNamed is tornState with the event id given.
func tornStateNamed(b *harness.Bundle, eventID, group string, delivery bson.M, attempts ...bson.M) string {
	b.T.Helper()
	ctx := context.Background()
	db := b.Client.Database(b.DBName)
	now := time.Now().UTC()
	if _, err := db.Collection("pulse.events").InsertOne(ctx, bson.M{"_id": eventID, "topic": "t", "data": `{"torn":true}`, "createdAt": now}); err != nil {
		b.T.Fatal(err)
	}
	if delivery == nil {
		return eventID
	}
	deliveryID := pmongo.DeliveryID(group, eventID)
	var sub struct {
		Incarnation string `bson:"incarnation"`
	}
	_ = db.Collection("pulse.subscriptions").FindOne(ctx, bson.M{"_id": group}).Decode(&sub) // the group's registration, if any
	doc := bson.M{"_id": deliveryID, "eventId": eventID, "consumerGroup": group, "topic": "t", "eventCreatedAt": now,
		"status": "pending", "createdAt": now, "updatedAt": now, "incarnation": sub.Incarnation}
	for k, v := range delivery {
		doc[k] = v
	}
	// The queue holds a pending delivery's latest attempt from before the attempt is written until the
	// delivery moves on (the queue document of attempt 1 alone when the crash came before the attempt).
	queued := bson.M{"_id": deliveryID + "-" + string(rune('0'+max(1, len(attempts)))), "deliveryId": deliveryID, "eventId": eventID,
		"consumerGroup": group, "topic": "t", "attempt": max(1, len(attempts)), "eventCreatedAt": now, "createdAt": now.Add(-time.Hour),
		"nextAttemptAt": now, "incarnation": sub.Incarnation}
	if len(attempts) > 0 {
		last := attempts[len(attempts)-1]
		if until, ok := last["lockedUntil"]; ok && last["status"] == "pending" {
			queued["lockedUntil"], queued["lockToken"] = until, last["lockToken"]
		}
	}
	if _, err := db.Collection("pulse.deliveries").InsertOne(ctx, doc); err != nil {
		b.T.Fatal(err)
	}
	for i, a := range attempts {
		doc := bson.M{"_id": deliveryID + "-" + string(rune('1'+i)), "deliveryId": deliveryID, "eventId": eventID,
			"consumerGroup": group, "topic": "t", "attempt": i + 1, "createdAt": now, "nextAttemptAt": now, "incarnation": sub.Incarnation}
		for k, v := range a {
			doc[k] = v
		}
		if _, err := db.Collection("pulse.history").InsertOne(ctx, doc); err != nil {
			b.T.Fatal(err)
		}
	}
	// Queued last: running replicas see the torn state whole (a queue document an hour old whose delivery
	// does not exist yet would be removed as one its fan-out left behind).
	if _, err := db.Collection("pulse.queue").InsertOne(ctx, queued); err != nil {
		b.T.Fatal(err)
	}
	return eventID
}

// markForFanOut leaves event id of topic t as a publisher that died before fanning it out leaves it: marked
// for fan-out, with its document in the outbox (written before the mark).
func markForFanOut(b *harness.Bundle, id string) {
	b.T.Helper()
	db := b.Client.Database(b.DBName)
	if _, err := db.Collection("pulse.outbox").InsertOne(context.Background(), bson.M{"_id": id, "topic": "t", "createdAt": time.Now().UTC()}); err != nil {
		b.T.Fatal(err)
	}
	if _, err := db.Collection("pulse.events").UpdateOne(context.Background(), bson.M{"_id": id}, bson.M{"$set": bson.M{"fanout": true}}); err != nil {
		b.T.Fatal(err)
	}
}

// Every other row of the crash-window table (docs/delivery.md), and the reconciler's partial states, written straight
// into the database: a running sidecar repairs each, and the receiver sees exactly the POSTs the table
// allows.
func TestCrashWindowsAreRepaired(t *testing.T) {
	past := time.Now().Add(-time.Minute).UTC()
	ended := bson.M{"endedAt": past, "startedAt": past, "lockToken": "dead", "lockOwner": "dead", "lockedUntil": past}
	with := func(m bson.M, kv ...any) bson.M {
		out := bson.M{}
		for k, v := range m {
			out[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			out[kv[i].(string)] = kv[i+1]
		}
		return out
	}
	for _, tc := range []struct {
		name       string
		delivery   bson.M // nil: only the event exists, still marked for fan-out
		attempts   []bson.M
		wantPOSTs  []string // Pulse-Attempt of each POST the receiver gets
		wantCodes  []string // error code (or "success") of each attempt at the end
		wantFanout bool
	}{
		{name: "before the handler starts (expired lease, no POST made)", delivery: bson.M{},
			attempts:  []bson.M{{"status": "pending", "lockOwner": "dead", "lockToken": "dead", "lockedAt": past, "lockedUntil": past, "startedAt": past}},
			wantPOSTs: []string{"2"}, wantCodes: []string{"worker_lost", "success"}},
		{name: "after history success, before delivery success", delivery: bson.M{},
			attempts:  []bson.M{with(ended, "status", "success", "httpStatus", 200)},
			wantPOSTs: nil, wantCodes: []string{"success"}},
		{name: "after history error, before retry creation", delivery: bson.M{},
			attempts:  []bson.M{with(ended, "status", "error", "httpStatus", 500, "error", bson.M{"code": "handler_error", "message": "HTTP 500"})},
			wantPOSTs: []string{"2"}, wantCodes: []string{"handler_error", "success"}},
		{name: "delivery without its first attempt", delivery: bson.M{},
			wantPOSTs: []string{"1"}, wantCodes: []string{"success"}},
		{name: "discovery interrupted before the mark was cleared", delivery: nil, wantFanout: true,
			wantPOSTs: []string{"1"}, wantCodes: []string{"success"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := harness.Setup(t)
			s := b.Start(b.FastEnv(harness.ShortLease))
			rcv := harness.NewReceiver(t, 200)
			s.RegisterEndpoint(t, "g", map[string]any{"url": rcv.URL, "topics": []string{"t"}, "retryDelay": "10ms"})
			id := tornState(b, "g", tc.delivery, tc.attempts...)
			if tc.wantFanout {
				// Published after the group registered (createdAt now); older than a lease timeout once repaired.
				markForFanOut(b, id)
			}
			d := s.WaitDelivery(t, id, "g", 30*time.Second)
			if d.Status != "success" || len(d.Attempts) != len(tc.wantCodes) {
				t.Fatalf("delivery = %+v, want success with %d attempts", d, len(tc.wantCodes))
			}
			for i, want := range tc.wantCodes {
				a := d.Attempts[i]
				got := a.Status
				if a.Error != nil {
					got = a.Error.Code
				}
				if got != want {
					t.Errorf("attempt %d = %s, want %s", i+1, got, want)
				}
			}
			var posts []string
			for _, r := range rcv.Received() {
				posts = append(posts, r.Header.Get("Pulse-Attempt"))
			}
			if strings.Join(posts, ",") != strings.Join(tc.wantPOSTs, ",") {
				t.Fatalf("receiver got POSTs for attempts %v, want %v", posts, tc.wantPOSTs)
			}
		})
	}
}

// Fencing: a worker whose attempt was taken over while its POST was in flight cannot write its result; it
// logs the lost lease and goes on working.
func TestStolenLeaseResultIsNotWritten(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv(harness.ShortLease)) // the stolen attempt is reaped once its lease expires
	rcv := newBlockingReceiver(t)
	s.RegisterEndpoint(t, "g", map[string]any{"url": rcv.URL, "topics": []string{"t"}, "retryDelay": "10ms"})
	id := s.Publish(t, "t", 1)
	waitClosed(t, rcv.started, 20*time.Second, "the first POST")
	res, err := b.Client.Database(b.DBName).Collection("pulse.history").UpdateOne(context.Background(),
		bson.M{"eventId": id, "attempt": 1, "status": "pending"}, bson.M{"$set": bson.M{"lockToken": "stolen-by-another-worker"}})
	if err != nil || res.ModifiedCount != 1 {
		t.Fatalf("steal token: %v %+v", err, res)
	}
	rcv.answer <- 200 // the stale worker's POST succeeds, but its lease is gone

	d := s.WaitDelivery(t, id, "g", 30*time.Second)
	if d.Attempts[0].Status == "success" {
		t.Fatalf("the stale worker wrote its result: attempt 1 = %+v", d.Attempts[0])
	}
	if d.Status != "success" || len(d.Attempts) != 2 || d.Attempts[0].Error == nil || d.Attempts[0].Error.Code != "worker_lost" {
		t.Fatalf("delivery = %+v, want attempt 1 worker_lost then success", d)
	}
	if !strings.Contains(s.Logs.String(), "lease lost") {
		t.Fatalf("the lost lease was not logged:\n%s", s.Logs.String())
	}
	// The worker goes on working.
	if d := s.WaitDelivery(t, s.Publish(t, "t", 2), "g", 20*time.Second); d.Status != "success" {
		t.Fatalf("next delivery = %+v", d)
	}
}

// Heartbeats keep a long webhook call alive: it takes 3 × the lease timeout, two replicas run, and the event
// is POSTed once. The replicas' clocks are 5 minutes ahead and behind: leases follow the database's clock.
// The lease is 3 s, not 1 s: a renewal on a busy 2-core machine can take longer than a second's lease allows.
func TestHeartbeatKeepsLongCallAliveAcrossSkewedReplicas(t *testing.T) {
	b := harness.Setup(t)
	const leaseTimeout = 3 * time.Second
	lease := map[string]string{"PULSE_LOCK_TIMEOUT": leaseTimeout.String()}
	s1 := b.Start(b.FastEnv(lease, map[string]string{"PULSE_TEST_CLOCK_SKEW": "-5m"}))
	b.Start(b.FastEnv(lease, map[string]string{"PULSE_TEST_CLOCK_SKEW": "5m"}))
	rcv := newBlockingReceiver(t)
	s1.RegisterEndpoint(t, "g", map[string]any{"url": rcv.URL, "topics": []string{"t"}})
	id := s1.Publish(t, "t", 1) // published by the replica whose clock is behind: still discovered at once
	waitClosed(t, rcv.started, 20*time.Second, "the first POST")
	time.Sleep(3 * leaseTimeout) // the receiver's work: 3 × the lease timeout (not a wait for an outcome)
	rcv.answer <- 200
	d := s1.WaitDelivery(t, id, "g", 20*time.Second)
	if d.Status != "success" || len(d.Attempts) != 1 {
		for _, a := range d.Attempts {
			t.Logf("attempt %d: %+v (error %+v)", a.Attempt, a, a.Error)
		}
		t.Fatalf("delivery = %+v, want success on attempt 1 (the lease was renewed, not reaped)", d)
	}
	rcv.WantPOSTs(t, 1, "")
}
