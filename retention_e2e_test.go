package main

import (
	"testing"
	"time"

	"github.com/pulse-sidecar/pulse/mongo"
)

// Retention end to end, with a real in-process sidecar: PULSE_EVENT_RETENTION=5s and a receiver that always
// answers 500 with retryDelay 3s (multiplier 1). Attempts 1 (at ~0 s) and 2 (at ~3 s) are POSTed and fail;
// attempt 3 falls due at ~6 s, after the event's expiresAt, so it ends event_expired without a POST and the
// delivery ends error. The delivery and its history outlive the event (history retention is the default).
func TestRetentionEndsALaterAttemptEventExpired(t *testing.T) {
	b := setup(t)
	s := b.start(b.fastEnv(map[string]string{"PULSE_EVENT_RETENTION": "5s"}))
	rcv := newReceiver(t, 500)
	s.registerEndpoint(t, "g", map[string]any{"url": rcv.URL, "topics": []string{"t"}, "retryDelay": "3s", "retryBackoffMultiplier": 1})
	var ev struct {
		ID        string    `json:"id"`
		CreatedAt time.Time `json:"createdAt"`
	}
	if code := do(t, "POST", s.URL+"/v1/events", map[string]any{"topic": "t", "data": 1}, &ev); code != 202 {
		t.Fatalf("publish answered %d", code)
	}
	expiresAt := ev.CreatedAt.Add(5 * time.Second)
	id := mongo.DeliveryID("g", ev.ID)
	var d deliveryView
	waitFor(t, 30*time.Second, "the delivery to end", func() bool {
		return do(t, "GET", s.URL+"/v1/deliveries/"+id, nil, &d) == 200 && d.Status != "pending"
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
	got := rcv.received()
	if len(got) != len(d.Attempts)-1 {
		t.Errorf("receiver got %d POSTs, want one per failed attempt (%d)", len(got), len(d.Attempts)-1)
	}
	for _, g := range got {
		if g.At.After(expiresAt.Add(100 * time.Millisecond)) { // 100 ms for the POST to travel
			t.Errorf("a POST arrived %s after the event expired", g.At.Sub(expiresAt))
		}
	}
	if code := do(t, "GET", s.URL+"/v1/events/"+ev.ID, nil, nil); code != 404 {
		t.Errorf("GET of the expired event answered %d, want 404", code)
	}
	t.Logf("%d attempts, the last due %s after the event expired", len(d.Attempts), last.NextAttemptAt.Sub(expiresAt).Round(time.Millisecond))
}
