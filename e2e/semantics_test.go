package e2e

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/pulse-sidecar/pulse/e2e/internal/harness"
	"github.com/pulse-sidecar/pulse/internal/testwait"
	"github.com/pulse-sidecar/pulse/mongo"
)

// Ordered consumer: POSTs for one (consumer group, topic) happen one at a time in publish order; the first
// POST of event 1 fails, and the receiver sees 1, 1, 2, 3, 4, 5: never 2 before 1's success.
func TestOrderedConsumerBlocksBehindAFailingHead(t *testing.T) {
	b := harness.Setup(t)
	s1 := b.Start(b.FastEnv())
	// A second replica must not break the order either, even right after registration; it does not re-list
	// endpoints before the publishes below.
	s2 := b.Start(b.FastEnv(map[string]string{"PULSE_POLL_INTERVAL": "1m"}))
	rcv := harness.NewReceiver(t, 500, 200)
	s1.RegisterEndpoint(t, "ledger", map[string]any{"url": rcv.URL, "topics": []string{"t"}, "ordered": true, "retryDelay": "200ms"})
	var ids []string
	for i := 1; i <= 5; i++ {
		via := s1
		if i%2 == 0 {
			via = s2
		}
		ids = append(ids, via.Publish(t, "t", i))
	}
	s1.WantSuccess(t, "ledger", 30*time.Second, ids...)
	var order []string
	for _, r := range rcv.Received() {
		for i, id := range ids {
			if r.Header.Get("Idempotency-Key") == id {
				order = append(order, string(rune('1'+i)))
			}
		}
	}
	if got := strings.Join(order, ","); got != "1,1,2,3,4,5" {
		t.Fatalf("receiver saw events %s, want 1,1,2,3,4,5", got)
	}
	got := rcv.Received()
	for i := 1; i < len(got); i++ {
		if got[i].At.Before(got[i-1].At) {
			t.Fatal("POSTs overlapped")
		}
	}
}

// At-most-once: a failed POST ends the delivery (one POST), and so does a lost worker (no second POST).
func TestAtMostOnceNeverRetries(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv(harness.ShortLease))
	rcv := harness.NewReceiver(t, 500)
	var e struct {
		Error struct{ Code, Message string }
	}
	if code := harness.Do(t, "PUT", s.URL+"/v1/endpoints/once", map[string]any{"url": rcv.URL, "topics": []string{"t"}, "delivery": "at-most-once", "maxRetries": 3}, &e); code != 400 || !strings.Contains(e.Error.Message, "maxRetries") {
		t.Fatalf("at-most-once with maxRetries 3 = %d %+v, want 400 naming maxRetries", code, e)
	}
	s.RegisterEndpoint(t, "once", map[string]any{"url": rcv.URL, "topics": []string{"t"}, "delivery": "at-most-once"})
	d := s.WaitDelivery(t, s.Publish(t, "t", 1), "once", 20*time.Second)
	if d.Status != "error" || len(d.Attempts) != 1 || d.Attempts[0].StartedAt == nil {
		t.Fatalf("delivery = %+v, want error after one started attempt", d)
	}

	// A worker lost mid-POST: the expired attempt is reaped and the delivery ends without another POST.
	past := time.Now().Add(-time.Minute).UTC()
	id := tornState(b, "once", bson.M{}, bson.M{"status": "pending", "lockOwner": "dead", "lockToken": "dead", "lockedAt": past, "lockedUntil": past, "startedAt": past})
	d = s.WaitDelivery(t, id, "once", 20*time.Second)
	if d.Status != "error" || len(d.Attempts) != 1 || d.Attempts[0].Error == nil || d.Attempts[0].Error.Code != "worker_lost" {
		t.Fatalf("delivery = %+v, want error with one worker_lost attempt", d)
	}
	rcv.WantPOSTs(t, 1, "(the first delivery's)")
}

// offsetReset latest: a new consumer group gets only events published after it registered; earliest gets
// every retained one. Retention: an attempt whose event is gone ends with event_expired.
func TestOffsetResetAndExpiredEvent(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv())
	old := s.Publish(t, "t", "before")
	rcvLatest, rcvEarliest := harness.NewReceiver(t, 200), harness.NewReceiver(t, 200)
	s.RegisterEndpoint(t, "latest", map[string]any{"url": rcvLatest.URL, "topics": []string{"t"}})
	s.RegisterEndpoint(t, "earliest", map[string]any{"url": rcvEarliest.URL, "topics": []string{"t"}, "offsetReset": "earliest"})
	fresh := s.Publish(t, "t", "after")
	s.WaitDelivery(t, fresh, "latest", 20*time.Second)
	s.WaitDelivery(t, fresh, "earliest", 20*time.Second)
	s.WaitDelivery(t, old, "earliest", 20*time.Second)
	if got := postsByKey(rcvLatest); got[old] != 0 || got[fresh] != 1 {
		t.Fatalf("latest got %v, want only the event published after registration", got)
	}
	if got := postsByKey(rcvEarliest); got[old] != 1 || got[fresh] != 1 {
		t.Fatalf("earliest got %v, want both events once", got)
	}

	// The payload of a pending delivery disappears (retention): its attempt ends with event_expired.
	id := tornState(b, "latest", bson.M{}, bson.M{"status": "pending"})
	if _, err := b.Client.Database(b.DBName).Collection("pulse.events").DeleteOne(context.Background(), bson.M{"_id": id}); err != nil {
		t.Fatal(err)
	}
	var d harness.DeliveryView
	testwait.Eventually(t, 20*time.Second, "the delivery to end", func() bool {
		var list struct{ Deliveries []harness.DeliveryView }
		harness.Do(t, "GET", s.URL+"/v1/deliveries?consumerGroup=latest&status=error", nil, &list)
		for _, x := range list.Deliveries {
			if x.EventID == id {
				harness.Do(t, "GET", s.URL+"/v1/deliveries/"+x.ID, nil, &d)
				return true
			}
		}
		return false
	})
	if len(d.Attempts) != 1 || d.Attempts[0].Error == nil || d.Attempts[0].Error.Code != "event_expired" {
		t.Fatalf("delivery = %+v, want one event_expired attempt", d)
	}
}

// Retention end to end, with a real in-process sidecar: PULSE_EVENT_RETENTION=5s and a receiver that always
// answers 500 with retryDelay 3s (multiplier 1). Attempts 1 (at ~0 s) and 2 (at ~3 s) are POSTed and fail;
// attempt 3 falls due at ~6 s, after the event's expiresAt, so it ends event_expired without a POST and the
// delivery ends error. The delivery and its history outlive the event (history retention is the default).
func TestRetentionEndsALaterAttemptEventExpired(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv(map[string]string{"PULSE_EVENT_RETENTION": "5s"}))
	rcv := harness.NewReceiver(t, 500)
	s.RegisterEndpoint(t, "g", map[string]any{"url": rcv.URL, "topics": []string{"t"}, "retryDelay": "3s", "retryBackoffMultiplier": 1})
	var ev struct {
		ID        string    `json:"id"`
		CreatedAt time.Time `json:"createdAt"`
	}
	if code := harness.Do(t, "POST", s.URL+"/v1/events", map[string]any{"topic": "t", "data": 1}, &ev); code != 202 {
		t.Fatalf("publish answered %d", code)
	}
	expiresAt := ev.CreatedAt.Add(5 * time.Second)
	id := mongo.DeliveryID("g", ev.ID)
	var d harness.DeliveryView
	testwait.Eventually(t, 30*time.Second, "the delivery to end", func() bool {
		return harness.Do(t, "GET", s.URL+"/v1/deliveries/"+id, nil, &d) == 200 && d.Status != "pending"
	})
	if d.Status != "error" || d.Error == nil || d.Error.Code != "event_expired" {
		t.Fatalf("delivery ended %s with %+v, want error event_expired: %+v", d.Status, d.Error, d)
	}
	if len(d.Attempts) < 3 {
		t.Fatalf("delivery has %d attempts, want two failed POSTs and a later event_expired attempt: %+v", len(d.Attempts), d.Attempts)
	}
	for _, a := range d.Attempts[:len(d.Attempts)-1] {
		if a.Status != "error" || a.HTTPStatus != 500 {
			t.Errorf("attempt %d = %s HTTP %d, want error HTTP 500", a.Attempt, a.Status, a.HTTPStatus)
		}
	}
	last := d.Attempts[len(d.Attempts)-1]
	if last.Status != "error" || last.Error == nil || last.Error.Code != "event_expired" || last.HTTPStatus != 0 {
		t.Errorf("last attempt = %+v, want error event_expired without an HTTP status", last)
	}
	if last.NextAttemptAt.Before(expiresAt) {
		t.Errorf("the event_expired attempt was due at %s, before the event expired at %s", last.NextAttemptAt, expiresAt)
	}
	got := rcv.Received()
	if len(got) != len(d.Attempts)-1 {
		t.Errorf("receiver got %d POSTs, want one per failed attempt (%d)", len(got), len(d.Attempts)-1)
	}
	// Each POST was of an attempt leased before the expiry (the arrival is not compared: a busy machine
	// delays a POST started in time by any amount).
	wantPostedBeforeExpiry(t, got, []harness.DeliveryView{d}, map[string]time.Time{ev.ID: expiresAt})
	if code := harness.Do(t, "GET", s.URL+"/v1/events/"+ev.ID, nil, nil); code != 404 {
		t.Errorf("GET of the expired event answered %d, want 404", code)
	}
	t.Logf("%d attempts, the last due %s after the event expired", len(d.Attempts), last.NextAttemptAt.Sub(expiresAt).Round(time.Millisecond))
}

// Changing an endpoint's retry policy applies to attempts scheduled after the change; when retries are used
// up the delivery is terminal with the last error.
func TestPolicyChangeAppliesToLaterAttempts(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv())
	rcv := harness.NewReceiver(t, 503)
	s.RegisterEndpoint(t, "g", map[string]any{"url": rcv.URL, "topics": []string{"t"}, "maxRetries": 10, "retryDelay": "1s"})
	id := s.Publish(t, "t", 1)
	testwait.Eventually(t, 20*time.Second, "the first POST", func() bool { return len(rcv.Received()) >= 1 })
	s.RegisterEndpoint(t, "g", map[string]any{"url": rcv.URL, "topics": []string{"t"}, "maxRetries": 1, "retryDelay": "1s"})
	harness.WantErrorAfter(t, s.WaitDelivery(t, id, "g", 30*time.Second), 2, 2, "503") // maxRetries lowered to 1
}

// One slow endpoint never starves another: with 4 workers in the process and the slow group limited to 2
// POSTs at once, the fast group's deliveries keep arriving while the slow ones hang.
func TestSlowEndpointDoesNotStarveAnother(t *testing.T) {
	b := harness.Setup(t)
	// FastEnv's long lease: with 600 ms, a heavily loaded machine could miss heartbeats, and a reaped
	// attempt's retry reached the receiver before it noticed the abandoned connection (not what this test is about).
	s := b.Start(b.FastEnv(map[string]string{"PULSE_WORKERS": "4"}))
	slow := harness.NewHoldingReceiver(t, 200)
	fast := harness.NewReceiver(t, 200)
	s.RegisterEndpoint(t, "slow", map[string]any{"url": slow.URL, "topics": []string{"s"}, "maxConcurrency": 2, "timeout": "20s"})
	s.RegisterEndpoint(t, "fast", map[string]any{"url": fast.URL, "topics": []string{"f"}})
	for range 8 {
		s.Publish(t, "s", "slow")
	}
	var ids []string
	for range 10 {
		ids = append(ids, s.Publish(t, "f", "fast"))
	}
	s.WantSuccess(t, "fast", 20*time.Second, ids...)
	if _, most := slow.Held(); most > 2 {
		t.Fatalf("slow endpoint had %d POSTs in flight, its maxConcurrency is 2", most)
	}
}

// PULSE_CHANGE_STREAMS=required refuses to start on a server without change streams, saying so.
func TestChangeStreamsRequiredRefusesStandalone(t *testing.T) {
	b := harness.Setup(t)
	if os.Getenv("PULSE_TEST_MONGODB_URI") != "" {
		t.Skip("the test server may be a replica set")
	}
	env := b.FastEnv()
	env["PULSE_CHANGE_STREAMS"] = "required"
	err := harness.StartError(t.Context(), env)
	if err == nil || !strings.Contains(err.Error(), "PULSE_CHANGE_STREAMS=required") || !strings.Contains(err.Error(), "change streams") {
		t.Fatalf("start = %v, want a refusal naming PULSE_CHANGE_STREAMS", err)
	}
}

// A webhook URL that resolves to a cloud metadata address is refused at dial time, and the attempt says so.
func TestBlockedDestinationIsRecorded(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv())
	s.RegisterEndpoint(t, "g", map[string]any{"url": "http://169.254.169.254/latest/meta-data", "topics": []string{"t"}})
	d := s.WaitDelivery(t, s.Publish(t, "t", 1), "g", 20*time.Second)
	if d.Status != "error" || len(d.Attempts) != 1 || d.Attempts[0].Error == nil || !strings.Contains(d.Attempts[0].Error.Message, "blocked") {
		t.Fatalf("delivery = %+v, want one attempt refused as blocked", d)
	}
}

// With PULSE_OUTBOUND_PROXY=env, webhooks go through HTTP_PROXY (a forward proxy on loopback here: the
// TEST-NET destination is not reachable directly), the proxy's own loopback address is not refused by a deny
// list that covers it, and a destination the guard refuses never reaches the proxy.
func TestOutboundProxy(t *testing.T) {
	b := harness.Setup(t)
	var mu sync.Mutex
	var seen []string
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Method+" "+r.URL.String()+" "+r.Header.Get("Pulse-Consumer-Group"))
		mu.Unlock()
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(proxy.Close)
	s := b.Start(b.FastEnv(map[string]string{
		"PULSE_OUTBOUND_PROXY": "env",
		"HTTP_PROXY":           proxy.URL,
		"PULSE_DENY_CIDRS":     "127.0.0.0/8",
	}))
	s.RegisterEndpoint(t, "far", map[string]any{"url": "http://192.0.2.10/hook", "topics": []string{"t"}, "timeout": "5s"})
	s.RegisterEndpoint(t, "metadata", map[string]any{"url": "http://169.254.169.254/latest/meta-data", "topics": []string{"t"}})
	id := s.Publish(t, "t", 1)
	if d := s.WaitDelivery(t, id, "far", 30*time.Second); d.Status != "success" {
		t.Fatalf("delivery through the proxy = %+v, want success", d)
	}
	d := s.WaitDelivery(t, id, "metadata", 30*time.Second)
	if d.Status != "error" || d.Attempts[0].Error == nil || !strings.Contains(d.Attempts[0].Error.Message, "169.254.169.254") {
		t.Fatalf("delivery to the metadata address = %+v, want error blocked", d)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 1 || seen[0] != "POST http://192.0.2.10/hook far" {
		t.Fatalf("the proxy saw %q, want one POST for http://192.0.2.10/hook of group far", seen)
	}
	if n := b.Count("deliveries", bson.M{"status": "success"}); n != 1 {
		t.Fatalf("%d successful deliveries, want 1", n)
	}
}

// A consumer group switched to ordered through another replica, while this replica keeps claiming its due
// retries, must not stall this replica: it gives those attempts back once and goes on with other work (an
// event published here is still fanned out and delivered at once, long before another replica's repair).
func TestSwitchToOrderedDoesNotStallAReplica(t *testing.T) {
	b := harness.Setup(t)
	env := b.FastEnv()
	// FastEnv's lease (LongLease, 30 s): no other replica repairs this one's fan-out within the test.
	s1 := b.Start(env)
	s2 := b.Start(env)
	failing := harness.NewReceiver(t, 500)
	fine := harness.NewReceiver(t)
	s1.RegisterEndpoint(t, "g", map[string]any{"url": failing.URL, "topics": []string{"tg"}, "retryDelay": "50ms",
		"retryBackoffMultiplier": 1, "maxRetries": 100})
	s1.RegisterEndpoint(t, "h", map[string]any{"url": fine.URL, "topics": []string{"th"}})
	for i := range 20 {
		s1.Publish(t, "tg", i)
	}
	testwait.Eventually(t, 20*time.Second, "retries of g", func() bool { return len(failing.Received()) >= 100 })
	s2.RegisterEndpoint(t, "g", map[string]any{"url": failing.URL, "topics": []string{"tg"}, "retryDelay": "50ms",
		"retryBackoffMultiplier": 1, "maxRetries": 100, "ordered": true})
	// Keep publishing to s1 until an event published well after s1's cache of g expired (1 s) arrives.
	switched := time.Now()
	sent := map[string]time.Time{}
	testwait.Eventually(t, 30*time.Second, "an event published to s1 after the switch", func() bool {
		sent[s1.Publish(t, "th", len(sent))] = time.Now()
		for _, r := range fine.Received() {
			if at, ok := sent[r.Header.Get("Idempotency-Key")]; ok && at.Sub(switched) > 2*time.Second {
				return true
			}
		}
		return false
	})
}
