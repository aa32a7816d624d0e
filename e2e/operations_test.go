package e2e

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/pulse-sidecar/pulse/e2e/internal/harness"
	"github.com/pulse-sidecar/pulse/internal/testwait"
	"github.com/pulse-sidecar/pulse/sidecar"
)

// opsEvent is an operational event as an operations receiver gets it: the envelope and its raw body.
type opsEvent struct {
	ID      string            `json:"id"`
	Topic   string            `json:"topic"`
	Headers map[string]string `json:"headers"`
	Data    map[string]any    `json:"data"`
	Body    string            `json:"-"`
}

// opsReceiver is an operations receiver that accepts only POSTs whose signature verifies with secret
// (the README's verifier) and records them.
type opsReceiver struct {
	URL string
	mu  sync.Mutex
	got []opsEvent
}

func newOpsReceiver(t *testing.T, secret string) *opsReceiver {
	t.Helper()
	r := &opsReceiver{}
	h, err := verified(secret, func(w http.ResponseWriter, body []byte) {
		var ev opsEvent
		if err := json.Unmarshal(body, &ev); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		ev.Body = string(body)
		r.mu.Lock()
		r.got = append(r.got, ev)
		r.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	r.URL = srv.URL
	return r
}

// wait returns the first recorded event of topic about group, waiting for it.
func (r *opsReceiver) wait(t *testing.T, topic, group string) opsEvent {
	t.Helper()
	var found opsEvent
	testwait.Eventually(t, 30*time.Second, topic+" about "+group+" at the operations receiver", func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, ev := range r.got {
			if ev.Topic == topic && ev.Data["consumerGroup"] == group {
				found = ev
				return true
			}
		}
		return false
	})
	return found
}

// An operations receiver gets, through its own signed POSTs, the disable event of another group (410 Gone),
// its enable event after the resume, and the failure of a delivery of a third group; the disabled group,
// although subscribed to the disable events, gets no delivery of its own; no event carries a secret, a
// header value or a URL; and applications cannot publish to the reserved prefix.
func TestOperationsReceiverGetsAnotherGroupsDisableEvent(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv())
	const opsSecret = "whsec_b3BzLXJlY2VpdmVyLXNlY3JldC0xMjM0NTY="
	const shopSecret = "whsec_c2hvcC1zZWNyZXQtb2YtdGhlLWdyb3VwLTEyMzQ="
	ops := newOpsReceiver(t, opsSecret)
	s.RegisterEndpoint(t, "ops", map[string]any{"url": ops.URL, "secret": opsSecret,
		"topics": []string{"pulse.endpoint.disabled", "pulse.endpoint.enabled", "pulse.delivery.failed"}})
	shop := harness.NewReceiver(t, 410, 200)
	s.RegisterEndpoint(t, "shop", map[string]any{"url": shop.URL + "/hooks/shop", "secret": shopSecret, "maxRetries": 0,
		"headers": map[string]string{"X-Api-Key": "key-of-the-shop"}, "topics": []string{"orders", "pulse.endpoint.disabled"}})
	strict := harness.NewReceiver(t, 422)
	s.RegisterEndpoint(t, "strict", map[string]any{"url": strict.URL, "topics": []string{"orders"}})

	var out struct {
		Error struct{ Code, Message string }
	}
	if code := harness.Do(t, "POST", s.URL+"/v1/events", map[string]any{"topic": "pulse.endpoint.disabled", "data": 1}, &out); code != 400 ||
		out.Error.Code != "reserved_topic" || !strings.Contains(out.Error.Message, `"pulse."`) {
		t.Fatalf("publish to a reserved topic = %d %+v, want 400 reserved_topic naming the prefix", code, out)
	}

	order := s.Publish(t, "orders", map[string]any{"n": 1})
	disabled := ops.wait(t, "pulse.endpoint.disabled", "shop")
	if disabled.Data["reason"] != "gone" || disabled.Data["state"] != "disabled" || disabled.Data["at"] == nil || disabled.Data["count"] != float64(1) {
		t.Fatalf("disable event data = %v, want shop disabled for reason gone, its time and count 1", disabled.Data)
	}
	// The header naming the group it is about is not the request's Pulse-Consumer-Group (the ops group).
	if disabled.Headers["pulse-subject-group"] != "shop" || disabled.Headers["pulse-consumer-group"] != "" {
		t.Errorf("disable event headers = %v, want pulse-subject-group shop and no pulse-consumer-group", disabled.Headers)
	}
	// The event's fan-out made the ops group's delivery, and none for the group it is about.
	if n := b.Count("deliveries", bson.M{"consumerGroup": "shop", "eventId": disabled.ID}); n != 0 {
		t.Errorf("the disabled group has %d deliveries of its own disable event, want 0", n)
	}
	failed := ops.wait(t, "pulse.delivery.failed", "strict")
	if failed.Data["eventId"] != order || failed.Data["errorCode"] != "handler_error" || failed.Data["httpStatus"] != float64(422) ||
		failed.Data["topic"] != "orders" || failed.Data["deliveryId"] == nil {
		t.Fatalf("delivery failed data = %v, want the order's delivery to strict, handler_error, HTTP 422", failed.Data)
	}

	if code, ep := controlEndpoint(s, t, "shop", "resume"); code != 200 || ep.State != "active" {
		t.Fatalf("resume = %d %+v", code, ep)
	}
	enabled := ops.wait(t, "pulse.endpoint.enabled", "shop")
	if enabled.Data["previousReason"] != "gone" || enabled.Data["state"] != "active" {
		t.Fatalf("enable event data = %v, want shop active after gone", enabled.Data)
	}
	for _, ev := range []opsEvent{disabled, failed, enabled} {
		for _, secret := range []string{shopSecret, opsSecret, "key-of-the-shop", shop.URL, strict.URL, "/hooks/shop"} {
			if strings.Contains(ev.Body, secret) || strings.Contains(ev.Body, strings.TrimPrefix(secret, "whsec_")) {
				t.Errorf("operational event %s carries %q: %s", ev.Topic, secret, ev.Body)
			}
		}
	}
}

// events returns the recorded events of topic about group, in arrival order.
func (r *opsReceiver) events(topic, group string) []opsEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []opsEvent
	for _, ev := range r.got {
		if ev.Topic == topic && ev.Data["consumerGroup"] == group {
			out = append(out, ev)
		}
	}
	return out
}

// pulse.backlog.high: a paused group with backlogAlertAfter 1s whose delivery waits past it raises the alert
// at an operations receiver subscribed to it ({high: true} with the oldest pending delivery's time and age);
// once resumed and drained, the alert clears ({high: false}); each change is published once. The backlog
// check runs every 100 ms here (PULSE_TEST_BACKLOG_INTERVAL) instead of every 15 s.
func TestOperationsReceiverGetsBacklogHighAndItsClear(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv(map[string]string{sidecar.EnvTestBacklogInterval: "100ms"}))
	const opsSecret = "whsec_b3BzLWJhY2tsb2ctcmVjZWl2ZXItMTIzNDU2Nzg="
	ops := newOpsReceiver(t, opsSecret)
	s.RegisterEndpoint(t, "ops", map[string]any{"url": ops.URL, "secret": opsSecret, "topics": []string{"pulse.backlog.high"}})
	slow := harness.NewReceiver(t, 200)
	s.RegisterEndpoint(t, "slow", map[string]any{"url": slow.URL, "topics": []string{"orders"}, "backlogAlertAfter": "1s"})
	if code, ep := controlEndpoint(s, t, "slow", "pause"); code != 200 || ep.State != "paused" {
		t.Fatalf("pause = %d %+v", code, ep)
	}
	order := s.Publish(t, "orders", map[string]any{"n": 1})

	raised := ops.wait(t, "pulse.backlog.high", "slow")
	age, _ := raised.Data["ageSeconds"].(float64)
	if raised.Data["high"] != true || raised.Data["threshold"] != "1s" || raised.Data["oldestPendingAt"] == nil || age <= 1 {
		t.Fatalf("backlog event = %v, want high true, threshold 1s, the oldest pending delivery's time and an age over 1 s", raised.Data)
	}
	if len(slow.Received()) != 0 {
		t.Fatalf("the paused group was POSTed to")
	}

	if code, ep := controlEndpoint(s, t, "slow", "resume"); code != 200 || ep.State != "active" {
		t.Fatalf("resume = %d %+v", code, ep)
	}
	if d := s.WaitDelivery(t, order, "slow", 30*time.Second); d.Status != "success" {
		t.Fatalf("after the resume the delivery is %s, want success", d.Status)
	}
	var cleared opsEvent
	testwait.Eventually(t, 30*time.Second, "the backlog alert's clear at the operations receiver", func() bool {
		evs := ops.events("pulse.backlog.high", "slow")
		if len(evs) < 2 {
			return false
		}
		cleared = evs[1]
		return true
	})
	if cleared.Data["high"] != false || cleared.Data["oldestPendingAt"] != nil {
		t.Fatalf("the second backlog event = %v, want high false without a pending delivery", cleared.Data)
	}
	// Each change published once: two events stored (raised, cleared), and the alert's state is clear.
	if n := b.Count("events", bson.M{"topic": "pulse.backlog.high"}); n != 2 {
		t.Errorf("%d pulse.backlog.high events stored, want 2 (raised, cleared)", n)
	}
	if n := b.Count("subscriptions", bson.M{"_id": "slow", "backlogHigh": true}); n != 0 {
		t.Errorf("the alert of slow is still recorded raised")
	}
}

// A delivery the reaper ends (its only attempt's sidecar was SIGKILLed mid-POST, and maxRetries is 0)
// publishes pulse.delivery.failed with worker_lost, as a delivery the dispatcher ends does: the replica
// that reaped it publishes it to an operations receiver subscribed to it.
func TestReapedDeliveryPublishesDeliveryFailed(t *testing.T) {
	b := harness.Setup(t)
	env := b.FastEnv(harness.ShortLease)
	const opsSecret = "whsec_b3BzLXJlYXBlZC1yZWNlaXZlci0xMjM0NTY3OA=="
	ops := newOpsReceiver(t, opsSecret)
	rcv := newBlockingReceiver(t)
	a := b.StartProcess(env)
	a.Sidecar().RegisterEndpoint(t, "ops", map[string]any{"url": ops.URL, "secret": opsSecret, "topics": []string{"pulse.delivery.failed"}})
	a.Sidecar().RegisterEndpoint(t, "fragile", map[string]any{"url": rcv.URL, "topics": []string{"t"}, "maxRetries": 0})
	id := a.Sidecar().Publish(t, "t", map[string]any{"n": 1})
	waitClosed(t, rcv.started, 20*time.Second, "the first POST")
	a.Kill()

	s := b.Start(env)
	d := s.WaitDelivery(t, id, "fragile", 30*time.Second)
	if d.Status != "error" || len(d.Attempts) != 1 || d.Attempts[0].Error == nil || d.Attempts[0].Error.Code != "worker_lost" {
		t.Fatalf("delivery = %+v, want error after one worker_lost attempt", d)
	}
	failed := ops.wait(t, "pulse.delivery.failed", "fragile")
	if failed.Data["eventId"] != id || failed.Data["errorCode"] != "worker_lost" || failed.Data["attempt"] != float64(1) || failed.Data["deliveryId"] == nil {
		t.Fatalf("delivery failed data = %v, want the event's delivery to fragile, attempt 1, worker_lost", failed.Data)
	}
}
