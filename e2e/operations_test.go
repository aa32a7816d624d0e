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
	if disabled.Headers["pulse-consumer-group"] != "shop" {
		t.Errorf("disable event headers = %v, want pulse-consumer-group shop", disabled.Headers)
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
