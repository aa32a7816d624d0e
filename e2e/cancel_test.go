package e2e

import (
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/pulse-sidecar/pulse/e2e/internal/harness"
	"github.com/pulse-sidecar/pulse/internal/testwait"
)

// cancelAnswer is the answer of POST /v1/deliveries/{id}/cancel: the fields of a 200, or the error.
type cancelAnswer struct {
	ID              string `json:"id"`
	Status          string `json:"status"`
	FinalAttempt    int    `json:"finalAttempt"`
	AttemptInFlight bool   `json:"attemptInFlight"`
	errorAnswer
}

// errorAnswer is the body of every 4xx/5xx answer.
type errorAnswer struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// cancelDelivery POSTs the cancel of a delivery and returns the status and the answer.
func cancelDelivery(s *harness.Sidecar, t *testing.T, id string) (int, cancelAnswer) {
	t.Helper()
	var out cancelAnswer
	code := harness.Do(t, "POST", s.URL+"/v1/deliveries/"+id+"/cancel", nil, &out)
	return code, out
}

// wantCancelAttempt fails the test unless a is an attempt that records a cancel and was never sent.
func wantCancelAttempt(t *testing.T, a harness.AttemptView, number int) {
	t.Helper()
	if a.Attempt != number || a.Status != "error" || a.Error == nil || a.Error.Code != "cancelled" || a.StartedAt != nil || a.HTTPStatus != 0 {
		t.Fatalf("attempt = %+v, want attempt %d ended error/cancelled, never started", a, number)
	}
}

// A delivery waiting for its retry is cancelled: its waiting attempt ends as cancelled without a POST, a
// second cancel answers 409, an unknown id 404, the list filters on status cancelled, and a replay of the
// cancelled deliveries re-opens it and delivers it.
func TestCancelAWaitingDeliveryAndReplayIt(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv())
	rcv := harness.NewReceiver(t, 500, 200)
	s.RegisterEndpoint(t, "billing", map[string]any{"url": rcv.URL, "topics": []string{"t"}, "retryDelay": "1h"})
	did := deliveryOf(s, t, s.Publish(t, "t", 1), "billing")
	var d harness.DeliveryView
	testwait.Eventually(t, 20*time.Second, "attempt 2 to wait for its retry", func() bool { d = getDelivery(s, t, did); return len(d.Attempts) == 2 })

	code, ok := cancelDelivery(s, t, did)
	if code != 200 || ok.Status != "cancelled" || ok.FinalAttempt != 2 || ok.AttemptInFlight {
		t.Fatalf("cancel answered %d %+v, want 200 cancelled at attempt 2, nothing in flight", code, ok)
	}
	d = getDelivery(s, t, did)
	if d.Status != "cancelled" || d.Error == nil || d.Error.Code != "cancelled" || len(d.Attempts) != 2 || d.Attempts[0].HTTPStatus != 500 {
		t.Fatalf("delivery = %+v, want cancelled after attempt 1 (HTTP 500)", d)
	}
	wantCancelAttempt(t, d.Attempts[1], 2)

	if code, bad := cancelDelivery(s, t, did); code != 409 || bad.Error.Code != "delivery_terminal" || !strings.Contains(bad.Error.Message, "cancelled") {
		t.Fatalf("second cancel answered %d %+v, want 409 delivery_terminal naming the status", code, bad)
	}
	if code, bad := cancelDelivery(s, t, "no-such-delivery"); code != 404 || bad.Error.Code != "delivery_not_found" {
		t.Fatalf("cancel of an unknown delivery answered %d %+v, want 404 delivery_not_found", code, bad)
	}
	var list struct{ Deliveries []harness.DeliveryView }
	if code := harness.Do(t, "GET", s.URL+"/v1/deliveries?status=cancelled&consumerGroup=billing", nil, &list); code != 200 || len(list.Deliveries) != 1 || list.Deliveries[0].ID != did {
		t.Fatalf("list of cancelled deliveries answered %d %+v, want the one", code, list)
	}
	if code := harness.Do(t, "GET", s.URL+"/v1/deliveries?status=paused", nil, nil); code != 400 {
		t.Fatalf("list with an unknown status answered %d, want 400", code)
	}

	var replayed struct{ Replayed int }
	if code := harness.Do(t, "POST", s.URL+"/v1/endpoints/billing/replay", map[string]any{"status": "cancelled"}, &replayed); code != 200 || replayed.Replayed != 1 {
		t.Fatalf("replay of cancelled deliveries answered %d %+v, want 1 replayed", code, replayed)
	}
	d = s.WaitDelivery(t, d.EventID, "billing", 20*time.Second)
	if d.Status != "success" || lastAttempt(t, d).Attempt != 3 || len(rcv.Received()) != 2 {
		t.Fatalf("replayed delivery = %+v after %d POSTs, want success at attempt 3 after 2 POSTs", d, len(rcv.Received()))
	}
	// The cancelled attempt's text, shown above attempt 3, does not say that nothing follows it.
	if msg := d.Attempts[1].Error.Message; strings.Contains(msg, "no attempt is sent after it") || !strings.Contains(msg, "retried or replayed") {
		t.Errorf("the cancelled attempt 2 says %q above attempt 3: it must say that a retry or replay sends again", msg)
	}
	if code, bad := cancelDelivery(s, t, did); code != 409 || bad.Error.Code != "delivery_terminal" {
		t.Fatalf("cancel of a successful delivery answered %d %+v, want 409 delivery_terminal", code, bad)
	}
}

// A delivery is cancelled through replica B while replica A holds its attempt (the receiver holds the POST,
// then answers 500 with a retry due at once): the POST finishes and its result is recorded, but the delivery
// stays cancelled and no attempt follows; a retry waits for the POST to end (409 attempt_in_flight), then
// re-opens the delivery.
func TestCancelWhileAnotherReplicaHoldsTheAttempt(t *testing.T) {
	b := harness.Setup(t)
	a := b.Start(b.FastEnv())
	rcv := harness.NewHoldingReceiver(t, 500)
	a.RegisterEndpoint(t, "billing", map[string]any{"url": rcv.URL, "topics": []string{"t"}, "retryDelay": "1ms"})
	did := deliveryOf(a, t, a.Publish(t, "t", 1), "billing") // the publishing replica leases attempt 1 itself
	rcv.WaitArrival(t)
	bb := b.Start(b.FastEnv()) // started now, so that A holds attempt 1

	code, ok := cancelDelivery(bb, t, did)
	if code != 200 || ok.FinalAttempt != 2 || !ok.AttemptInFlight {
		t.Fatalf("cancel answered %d %+v, want 200 with attempt 1 in flight and attempt 2 taken", code, ok)
	}
	d := getDelivery(bb, t, did)
	if d.Status != "cancelled" || len(d.Attempts) != 2 || d.Attempts[0].Status != "pending" || d.Attempts[0].LockState != "active" {
		t.Fatalf("delivery = %+v, want cancelled with attempt 1 still leased", d)
	}
	wantCancelAttempt(t, d.Attempts[1], 2)
	var bad errorAnswer
	if code := harness.Do(t, "POST", bb.URL+"/v1/deliveries/"+did+"/retry", nil, &bad); code != 409 || bad.Error.Code != "attempt_in_flight" {
		t.Fatalf("retry during the POST answered %d %+v, want 409 attempt_in_flight", code, bad)
	}

	rcv.LetGo()
	// A counts the attempt once its result and follow-up are written: from then on nothing can create
	// another attempt.
	testwait.Eventually(t, 20*time.Second, "replica A to record attempt 1 and its follow-up", func() bool {
		return strings.Contains(scrape(t, a), `pulse_attempts_total{consumer_group="billing",outcome="retry"} 1`)
	})
	d = getDelivery(bb, t, did)
	if d.Status != "cancelled" || d.Error == nil || d.Error.Code != "cancelled" || len(d.Attempts) != 2 ||
		d.Attempts[0].Status != "error" || d.Attempts[0].HTTPStatus != 500 {
		t.Fatalf("delivery = %+v, want still cancelled, attempt 1 recorded with HTTP 500, no attempt 3", d)
	}
	if n := b.Count("history", bson.M{"deliveryId": did, "status": "pending"}); n != 0 {
		t.Fatalf("%d pending attempts remain for the cancelled delivery", n)
	}
	rcv.WantPOSTs(t, 1, "")

	var retried struct{ Attempt int }
	if code := harness.Do(t, "POST", bb.URL+"/v1/deliveries/"+did+"/retry", nil, &retried); code != 202 || retried.Attempt != 3 {
		t.Fatalf("retry after the POST ended answered %d %+v, want 202 attempt 3", code, retried)
	}
	rcv.WaitArrival(t)
	if got := rcv.Received(); len(got) != 2 || got[1].Header.Get("Pulse-Attempt") != "3" {
		t.Fatalf("POSTs after the retry: %d, want attempt 3 as the second", len(got))
	}
}

// In an ordered group, cancelling the failing head of a line lets the next event of the line go.
func TestCancellingTheHeadUnblocksAnOrderedLine(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv())
	rcv := harness.NewReceiver(t, 500, 200)
	s.RegisterEndpoint(t, "ledger", map[string]any{"url": rcv.URL, "topics": []string{"t"}, "ordered": true, "retryDelay": "1h"})
	head := deliveryOf(s, t, s.Publish(t, "t", "first"), "ledger")
	testwait.Eventually(t, 20*time.Second, "the head's first POST", func() bool { return len(rcv.Received()) == 1 })
	next := s.Publish(t, "t", "second")
	if code, _ := cancelDelivery(s, t, head); code != 200 {
		t.Fatalf("cancel of the head answered %d", code)
	}
	if d := s.WaitDelivery(t, next, "ledger", 20*time.Second); d.Status != "success" {
		t.Fatalf("next delivery = %+v, want success once the head was cancelled", d)
	}
	rcv.WantPOSTs(t, 2, "(the head once, then the next)")
}

// A cancel that stopped between its two writes (the attempt recording the cancel exists, the delivery is
// still pending) is finished by the repair scan: the delivery ends as cancelled, and nothing is POSTed.
func TestHalfDoneCancelIsFinishedByTheRepair(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv(harness.ShortLease))
	rcv := harness.NewReceiver(t, 200)
	s.RegisterEndpoint(t, "g", map[string]any{"url": rcv.URL, "topics": []string{"t"}})
	now := time.Now().UTC()
	id := tornState(b, "g", bson.M{}, bson.M{"status": "error", "endedAt": now, "terminal": true,
		"error": bson.M{"code": "cancelled", "message": "cancelled through the API: nothing more is sent unless the delivery is retried or replayed"}})
	d := s.WaitDelivery(t, id, "g", 20*time.Second)
	if d.Status != "cancelled" || d.Error == nil || d.Error.Code != "cancelled" || len(d.Attempts) != 1 {
		t.Fatalf("delivery = %+v, want cancelled with its one attempt", d)
	}
	rcv.WantPOSTs(t, 0, "")
}
