package e2e

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/pulse-sidecar/pulse/e2e/internal/harness"
	"github.com/pulse-sidecar/pulse/internal/testwait"
)

// A published event reaches the consumer group's webhook once, with the envelope and the idempotency headers,
// and long before the poll interval: a publish to this process wakes its dispatcher.
func TestPublishDeliversOnceWithIdempotencyKey(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv(map[string]string{
		"PULSE_POLL_INTERVAL": "1m", // delivery must not wait for a poll
	}))
	rcv := harness.NewReceiver(t, 200)
	s.RegisterEndpoint(t, "billing", map[string]any{"url": rcv.URL + "/hook", "topics": []string{"payment.captured"}})

	id := s.Publish(t, "payment.captured", map[string]any{"paymentId": "p1"})
	d := s.WaitDelivery(t, id, "billing", 20*time.Second)

	got := rcv.Received()
	if len(got) != 1 {
		t.Fatalf("receiver got %d POSTs, want 1", len(got))
	}
	h := got[0].Header
	for k, want := range map[string]string{
		"Idempotency-Key": id, "Webhook-Id": id, "Pulse-Attempt": "1", "Pulse-Topic": "payment.captured",
		"Pulse-Consumer-Group": "billing", "Pulse-Delivery-Id": d.ID, "Content-Type": "application/json",
	} {
		if h.Get(k) != want {
			t.Errorf("header %s = %q, want %q", k, h.Get(k), want)
		}
	}
	var env2 struct {
		ID, Topic, CreatedAt string
		Data                 json.RawMessage
	}
	if err := json.Unmarshal(got[0].Body, &env2); err != nil {
		t.Fatalf("body is not JSON: %s", got[0].Body)
	}
	if env2.ID != id || env2.Topic != "payment.captured" || string(env2.Data) != `{"paymentId":"p1"}` || env2.CreatedAt == "" {
		t.Errorf("envelope = %s", got[0].Body)
	}
	if d.Status != "success" || len(d.Attempts) != 1 || d.Attempts[0].Status != "success" {
		t.Errorf("delivery = %+v", d)
	}
	if strings.Contains(s.Logs.String(), id) {
		t.Errorf("a successful delivery was logged at info level:\n%s", s.Logs.String())
	}
}

// 500, 500, 200: three byte-identical POSTs with backoff, and the history shows each attempt.
func TestRetriesUntilSuccess(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv())
	rcv := harness.NewReceiver(t, 500, 500, 200)
	s.RegisterEndpoint(t, "billing", map[string]any{"url": rcv.URL, "topics": []string{"payment.captured"}, "retryDelay": "100ms"})

	var pub struct{ ID string }
	raw := `{"topic":"payment.captured","data":{"paymentId":"p1","amount":12.50,"big":12345678901234567890,"note":"crème <b> \u00e9"}}`
	if code := harness.Do(t, "POST", s.URL+"/v1/events", raw, &pub); code != 202 {
		t.Fatalf("publish = %d", code)
	}
	id := pub.ID
	d := s.WaitDelivery(t, id, "billing", 30*time.Second)

	got := rcv.Received()
	if len(got) != 3 {
		t.Fatalf("receiver got %d POSTs, want 3", len(got))
	}
	for i, g := range got {
		if !bytes.Equal(g.Body, got[0].Body) {
			t.Errorf("POST %d body differs:\n%s\n%s", i+1, g.Body, got[0].Body)
		}
		if g.Header.Get("Pulse-Attempt") != string(rune('1'+i)) || g.Header.Get("Idempotency-Key") != id {
			t.Errorf("POST %d headers: attempt %q key %q", i+1, g.Header.Get("Pulse-Attempt"), g.Header.Get("Idempotency-Key"))
		}
	}
	if gap1, gap2 := got[1].At.Sub(got[0].At), got[2].At.Sub(got[1].At); gap1 < 70*time.Millisecond || gap2 < 140*time.Millisecond {
		t.Errorf("retries came without backoff: gaps %s, %s (retryDelay 100ms ×2, ±20%% jitter)", gap1, gap2)
	}
	if !strings.Contains(string(got[0].Body), `"data":{"paymentId":"p1","amount":12.50,"big":12345678901234567890,"note":"crème <b> \u00e9"}`) {
		t.Errorf("data not carried verbatim: %s", got[0].Body)
	}
	if d.Status != "success" || len(d.Attempts) != 3 {
		t.Fatalf("delivery = %+v", d)
	}
	for i, want := range []string{"error", "error", "success"} {
		a := d.Attempts[i]
		if a.Attempt != i+1 || a.Status != want {
			t.Errorf("attempt %d = %+v, want status %s", i+1, a, want)
		}
		if want == "error" && (a.Error == nil || a.Error.Code != "handler_error" || a.HTTPStatus != 500) {
			t.Errorf("attempt %d error = %+v, status %d", i+1, a.Error, a.HTTPStatus)
		}
	}
}

// maxRetryDuration ends a delivery whose next attempt would be due after the window, counted from the first
// attempt's start: the delivery ends error/retry_window_exceeded although maxRetries has retries left, no
// attempt was scheduled past the window, and the receiver got exactly the attempts recorded.
func TestRetryWindowEndsDelivery(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv())
	rcv := harness.NewReceiver(t, 500)
	const window = 2 * time.Second
	s.RegisterEndpoint(t, "billing", map[string]any{"url": rcv.URL, "topics": []string{"payment.captured"}, "retryDelay": "300ms",
		"retryBackoffMultiplier": 1, "maxRetries": 100, "maxRetryDuration": window.String()})

	id := s.Publish(t, "payment.captured", 1)
	d := s.WaitDelivery(t, id, "billing", 60*time.Second)
	if d.Status != "error" || d.Error == nil || d.Error.Code != "retry_window_exceeded" || !strings.Contains(d.Error.Message, "maxRetryDuration 2s") {
		t.Fatalf("delivery = %+v (error %+v), want error retry_window_exceeded naming maxRetryDuration 2s", d, d.Error)
	}
	if len(d.Attempts) < 2 || len(d.Attempts) > 100 {
		t.Fatalf("%d attempts, want a retry inside the window and the end long before maxRetries", len(d.Attempts))
	}
	first := d.Attempts[0].StartedAt
	if first == nil {
		t.Fatalf("attempt 1 has no startedAt: %+v", d.Attempts[0])
	}
	for _, a := range d.Attempts {
		if a.Status != "error" || a.Error == nil || a.Error.Code != "handler_error" {
			t.Errorf("attempt %d = %+v, want error handler_error (the window is the delivery's code, not the attempt's)", a.Attempt, a)
		}
		if a.NextAttemptAt.Sub(*first) > window {
			t.Errorf("attempt %d was due %s after the first attempt started, past the window %s", a.Attempt, a.NextAttemptAt.Sub(*first), window)
		}
	}
	rcv.WantPOSTs(t, len(d.Attempts), "")
}

// A terminal status (422) ends the delivery after exactly one POST.
func TestTerminalStatusEndsDelivery(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv())
	rcv := harness.NewReceiver(t, 422)
	s.RegisterEndpoint(t, "billing", map[string]any{"url": rcv.URL, "topics": []string{"payment.captured"}, "retryDelay": "10ms"})

	id := s.Publish(t, "payment.captured", 1)
	d := s.WaitDelivery(t, id, "billing", 20*time.Second)
	if d.Status != "error" || len(d.Attempts) != 1 || d.Attempts[0].HTTPStatus != 422 {
		t.Fatalf("delivery = %+v", d)
	}
	rcv.WantPOSTs(t, 1, "")
	if n := b.Count("history", bson.M{"deliveryId": d.ID}); n != 1 {
		t.Fatalf("%d attempts stored, want 1", n)
	}
	// One log line for the terminal failure, with the fields an operator needs.
	var found bool
	for _, line := range strings.Split(s.Logs.String(), "\n") {
		var l map[string]any
		if json.Unmarshal([]byte(line), &l) != nil || l["message"] != "delivery failed terminally" {
			continue
		}
		found = true
		if l["consumer_group"] != "billing" || l["event_id"] != id || l["delivery_id"] != d.ID || l["attempt"] != float64(1) || l["error_code"] != "handler_error" {
			t.Fatalf("terminal failure logged as %v", l)
		}
	}
	if !found {
		t.Fatalf("no log line for the terminal failure:\n%s", s.Logs.String())
	}
}

// A receiver that accepts and never answers fails at the endpoint timeout and is retried, while another
// consumer group's deliveries keep arriving.
func TestHangingReceiverHoldsUpNoOtherEndpoint(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv())
	release := make(chan struct{})
	hang := harness.NewReceiver(t, 200)
	hang.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	defer close(release)
	ok := harness.NewReceiver(t, 200)
	s.RegisterEndpoint(t, "slow", map[string]any{"url": hang.URL, "topics": []string{"t"}, "timeout": "300ms", "retryDelay": "50ms", "maxRetries": 1})
	s.RegisterEndpoint(t, "fast", map[string]any{"url": ok.URL, "topics": []string{"t"}})

	var ids []string
	for range 5 {
		ids = append(ids, s.Publish(t, "t", "x"))
	}
	s.WantSuccess(t, "fast", 20*time.Second, ids...)
	harness.WantErrorAfter(t, s.WaitDelivery(t, ids[0], "slow", 30*time.Second), 2, 1, "timeout")
}

// A 301 is not followed: the attempt fails (retryable) saying so, and the redirect target is never called.
func TestRedirectIsNotFollowed(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv())
	target := harness.NewReceiver(t, 200)
	rcv := harness.NewReceiver(t, 301)
	rcv.Headers = map[string]string{"Location": target.URL + "/elsewhere"}
	s.RegisterEndpoint(t, "g", map[string]any{"url": rcv.URL, "topics": []string{"t"}, "maxRetries": 1, "retryDelay": "10ms"})

	d := s.WaitDelivery(t, s.Publish(t, "t", "x"), "g", 20*time.Second)
	harness.WantErrorAfter(t, d, 2, 1, "not followed") // 301 is retryable
	if d.Attempts[0].HTTPStatus != 301 {
		t.Fatalf("attempt 1 = %+v, want httpStatus 301", d.Attempts[0])
	}
	target.WantPOSTs(t, 0, "at the redirect target")
}

// 429 with Retry-After (seconds, or an HTTP date) delays the next attempt at least that long, not the 10ms
// backoff.
func TestRetryAfterIsHonoured(t *testing.T) {
	for _, tc := range []struct {
		name string
		// value gives the header; earliest, given when the first POST arrived, when the second may arrive.
		value    func() (header string, earliest func(first time.Time) time.Time)
		schedule time.Duration // the least delay between attempt 1's end and attempt 2's due time, less 1 s
	}{
		{"seconds", func() (string, func(time.Time) time.Time) {
			return "2", func(first time.Time) time.Time { return first.Add(2 * time.Second) }
		}, 2 * time.Second},
		{"http-date", func() (string, func(time.Time) time.Time) {
			// An HTTP date has whole seconds: the second POST is due at the date itself, which is 2-3 s
			// after now, not necessarily 2 s after the first POST (which comes some time after now).
			at := time.Now().Add(3 * time.Second).UTC().Truncate(time.Second)
			return at.Format(http.TimeFormat), func(time.Time) time.Time { return at }
		}, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := harness.Setup(t)
			s := b.Start(b.FastEnv())
			rcv := harness.NewReceiver(t, 429, 200)
			header, earliest := tc.value()
			rcv.Headers = map[string]string{"Retry-After": header}
			s.RegisterEndpoint(t, "g", map[string]any{"url": rcv.URL, "topics": []string{"t"}, "retryDelay": "10ms"})
			d := s.WaitDelivery(t, s.Publish(t, "t", "x"), "g", 30*time.Second)
			got := rcv.Received()
			if d.Status != "success" || len(got) != 2 {
				t.Fatalf("delivery = %+v, %d POSTs", d, len(got))
			}
			if want := earliest(got[0].At); got[1].At.Before(want.Add(-50 * time.Millisecond)) {
				t.Fatalf("second POST came at %s, %s after the first; Retry-After %q allows it from %s", got[1].At.Format(time.RFC3339Nano),
					got[1].At.Sub(got[0].At), header, want.Format(time.RFC3339Nano))
			}
			if next := d.Attempts[1].NextAttemptAt.Sub(*d.Attempts[0].EndedAt); next < tc.schedule-time.Second {
				t.Fatalf("attempt 2 scheduled %s after attempt 1 ended", next)
			}
		})
	}
}

// Publishing the same client-chosen id twice stores one event (200 with the stored event the second time);
// the same id with other data answers 409.
func TestIdempotentPublish(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv())
	body := `{"id":"order-42","topic":"order.placed","data":{"n":1}}`
	var first, second map[string]any
	if code := harness.Do(t, "POST", s.URL+"/v1/events", body, &first); code != 202 {
		t.Fatalf("first publish = %d", code)
	}
	if code := harness.Do(t, "POST", s.URL+"/v1/events", body, &second); code != 200 {
		t.Fatalf("second publish = %d, want 200", code)
	}
	if first["id"] != "order-42" || second["id"] != "order-42" || first["createdAt"] != second["createdAt"] {
		t.Fatalf("answers differ: %v vs %v", first, second)
	}
	var e map[string]map[string]string
	if code := harness.Do(t, "POST", s.URL+"/v1/events", `{"id":"order-42","topic":"order.placed","data":{"n":2}}`, &e); code != 409 || e["error"]["code"] != "id_conflict" {
		t.Fatalf("conflicting publish = %d %v", code, e)
	}
	if n := b.Count("events", bson.M{}); n != 1 {
		t.Fatalf("%d events stored, want 1", n)
	}
}

// Bad input answers 4xx with a JSON error naming the problem, and stores nothing.
func TestRejectedPublishStoresNothing(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv())
	big := `{"topic":"t","data":"` + strings.Repeat("x", 1<<20) + `"}`
	arr := "[" + strings.Repeat(`{"topic":"t","data":1},`, 1000) + `{"topic":"t","data":1}]`
	for _, tc := range []struct {
		name, body, code string
		status           int
	}{
		{"over 1 MiB", big, "body_too_large", 413},
		{"truncated JSON", `{"topic":"t","data":{"a":`, "invalid_json", 400},
		{"topic with a space", `{"topic":"payment captured","data":1}`, "invalid_topic", 400},
		{"missing topic", `{"data":1}`, "invalid_topic", 400},
		{"missing data", `{"topic":"t"}`, "missing_data", 400},
		{"not an object", `"hello"`, "invalid_json", 400},
		{"array of non-objects", `[1,2]`, "invalid_event", 400},
		{"array over 1000", arr, "batch_too_large", 400},
		{"duplicate ids in array", `[{"id":"a","topic":"t","data":1},{"id":"a","topic":"t","data":2}]`, "duplicate_id", 400},
		{"bad event in array", `[{"topic":"t","data":1},{"topic":"","data":2}]`, "invalid_topic", 400},
		{"unknown field", `{"topic":"t","data":1,"dta":2}`, "invalid_event", 400},
		{"invalid UTF-8", "{\"topic\":\"t\",\"data\":\"\xff\"}", "invalid_json", 400},
		{"100k nested arrays", `{"topic":"t","data":` + strings.Repeat("[", 100000) + `}`, "invalid_json", 400},
		{"header that is not a string", `{"topic":"t","data":1,"headers":{"a":1}}`, "invalid_event", 400},
		{"header key with a dollar", `{"topic":"t","data":1,"headers":{"$set":"x"}}`, "invalid_headers", 400},
	} {
		var e struct {
			Error struct{ Code, Message string }
		}
		status := harness.Do(t, "POST", s.URL+"/v1/events", tc.body, &e)
		if status != tc.status || e.Error.Code != tc.code || e.Error.Message == "" {
			t.Errorf("%s: got %d %+v, want %d %s", tc.name, status, e.Error, tc.status, tc.code)
		}
	}
	if n := b.Count("events", bson.M{}); n != 0 {
		t.Fatalf("%d events stored after rejected publishes", n)
	}
}

// An array publish is all or nothing and answers with one entry per event.
func TestArrayPublish(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv())
	rcv := harness.NewReceiver(t, 200)
	s.RegisterEndpoint(t, "g", map[string]any{"url": rcv.URL, "topics": []string{"a", "b"}})
	var out []struct{ ID, Topic string }
	if code := harness.Do(t, "POST", s.URL+"/v1/events", `[{"topic":"a","data":1},{"topic":"b","data":2},{"topic":"c","data":3}]`, &out); code != 202 || len(out) != 3 {
		t.Fatalf("array publish = %d %v", code, out)
	}
	testwait.Eventually(t, 20*time.Second, "two POSTs", func() bool { return len(rcv.Received()) == 2 })
	if n := b.Count("events", bson.M{"staged": true}); n != 0 {
		t.Fatalf("%d events left staged", n)
	}
}
