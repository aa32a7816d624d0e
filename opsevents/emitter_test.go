package opsevents

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pulse-sidecar/pulse/internal/testwait"
	"github.com/pulse-sidecar/pulse/pulsetype"
)

// recorder is a Store that records what it is asked to publish.
type recorder struct {
	mu     sync.Mutex
	events []*pulsetype.Event
}

func (r *recorder) Publish(_ context.Context, events []*pulsetype.Event) ([]pulsetype.Published, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]pulsetype.Published, len(events))
	for i, e := range events {
		r.events = append(r.events, e)
		out[i] = pulsetype.Published{Event: e}
	}
	return out, nil
}

func (r *recorder) all() []*pulsetype.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*pulsetype.Event(nil), r.events...)
}

func dataOf(t *testing.T, e *pulsetype.Event) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(e.Data, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// A failed delivery of an operational event publishes nothing, so a failing operations receiver cannot
// feed itself; any other failed delivery publishes pulse.delivery.failed about its group.
func TestDeliveryFailedOfAnOperationalEventPublishesNothing(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	e := New(rec, Options{Logger: zerolog.Nop()})
	res := pulsetype.AttemptResult{Status: pulsetype.StatusError, HTTPStatus: 500}
	end := &pulsetype.ErrorInfo{Code: pulsetype.CodeHandlerError, Message: "HTTP 500"}
	e.DeliveryFailed(&pulsetype.Attempt{ConsumerGroup: "ops", Topic: pulsetype.TopicDeliveryFailed, DeliveryID: "d1", Number: 9}, res, end)
	e.DeliveryFailed(&pulsetype.Attempt{ConsumerGroup: "ops", Topic: pulsetype.TopicEndpointDisabled, DeliveryID: "d2", Number: 9}, res, end)
	e.DeliveryFailed(&pulsetype.Attempt{ConsumerGroup: "billing", Topic: "orders", DeliveryID: "d3", EventID: "e3", Number: 4}, res, end)
	e.Wait()
	got := rec.all()
	if len(got) != 1 || got[0].Topic != pulsetype.TopicDeliveryFailed || got[0].Headers[pulsetype.SubjectGroupHeader] != "billing" {
		t.Fatalf("published %d events (%v), want one pulse.delivery.failed about billing", len(got), got)
	}
	// The header naming the group the event is about is not the webhook request's Pulse-Consumer-Group,
	// which names the receiving group: an envelope's headers beside the request's would then disagree.
	for k := range got[0].Headers {
		if strings.EqualFold(k, "Pulse-Consumer-Group") {
			t.Errorf("the event's header %q has the name of the request header that names the receiving group", k)
		}
	}
	d := dataOf(t, got[0])
	if d["deliveryId"] != "d3" || d["eventId"] != "e3" || d["attempt"] != float64(4) || d["errorCode"] != "handler_error" || d["httpStatus"] != float64(500) {
		t.Fatalf("data = %v", d)
	}
}

// Within the interval one (topic, group) publishes once at once; the events after it are coalesced into
// one published when the interval ends, with their count, and another group is not held back.
func TestEventsAreCoalescedPerTopicAndGroup(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	frozen := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	e := New(rec, Options{Logger: zerolog.Nop(), Interval: 50 * time.Millisecond, Now: func() time.Time { return frozen }})
	for range 5 {
		e.EndpointDisabled("billing", pulsetype.ReasonFailing)
	}
	e.EndpointDisabled("audit", pulsetype.ReasonGone)
	testwait.Eventually(t, 10*time.Second, "the coalesced event", func() bool { return len(rec.all()) >= 3 })
	e.Wait()
	counts := map[string][]float64{}
	for _, ev := range rec.all() {
		g := ev.Headers[pulsetype.SubjectGroupHeader]
		counts[g] = append(counts[g], dataOf(t, ev)["count"].(float64))
	}
	if len(counts["billing"]) != 2 || counts["billing"][0] != 1 || counts["billing"][1] != 4 {
		t.Fatalf("billing's events carry counts %v, want [1 4]: one at once, four coalesced", counts["billing"])
	}
	if len(counts["audit"]) != 1 || counts["audit"][0] != 1 {
		t.Fatalf("audit's events carry counts %v, want [1]", counts["audit"])
	}
}

// Every timestamp of an operational event is written as the API writes times (pulsetype.TimeLayout: UTC,
// exactly three fraction digits), whatever the clock's precision.
func TestOperationalTimestampsHaveMilliseconds(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	at := time.Date(2026, 1, 1, 12, 0, 0, 123456789, time.FixedZone("x", 3600))
	e := New(rec, Options{Logger: zerolog.Nop(), Now: func() time.Time { return at }})
	e.EndpointDisabled("billing", pulsetype.ReasonGone)
	e.EndpointEnabled("mailer", pulsetype.ReasonGone)
	e.DeliveryFailed(&pulsetype.Attempt{ConsumerGroup: "audit", Topic: "orders", DeliveryID: "d", EventID: "e", Number: 1},
		pulsetype.AttemptResult{Status: pulsetype.StatusError}, nil)
	e.Wait()
	got := rec.all()
	if len(got) != 3 {
		t.Fatalf("published %d events, want 3", len(got))
	}
	for _, ev := range got {
		if d := dataOf(t, ev); d["at"] != "2026-01-01T11:00:00.123Z" {
			t.Errorf("%s at = %v, want 2026-01-01T11:00:00.123Z", ev.Topic, d["at"])
		}
	}

	var data map[string]any
	st := &backlogStore{high: map[string]bool{}, oldest: map[string]time.Time{"billing": at.Add(-time.Hour)},
		eps: []*pulsetype.Endpoint{{ConsumerGroup: "billing", BacklogAlertAfter: pulsetype.Duration(time.Minute)}}}
	w := NewBacklogWatcher(st, e, time.Second, func() time.Time { return at }, zerolog.Nop())
	w.emit = func(_, _ string, d map[string]any) { data = d }
	if err := w.Check(context.Background()); err != nil {
		t.Fatal(err)
	}
	if data["at"] != "2026-01-01T11:00:00.123Z" || data["oldestPendingAt"] != "2026-01-01T10:00:00.123Z" {
		t.Fatalf("pulse.backlog.high at %v, oldestPendingAt %v; want milliseconds", data["at"], data["oldestPendingAt"])
	}
}
