package mongo

import (
	"bytes"
	"strings"
	"sync"
	"testing"

	"github.com/rs/zerolog"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// lockedBuffer is a log sink safe for concurrent writes.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// A filter whose evaluation fails for an event (a dyn result that is not a boolean, a matches() over a
// 1 MB string past the cost limit) ends that group's delivery as terminal filter_error at fan-out, with its
// attempt and no queue document, so nothing POSTs it and nothing is silently dropped; every such delivery
// is counted (Options.FilterErrors), the first of each group logged once, and a second fan-out of the same
// events (the repair) changes nothing. The other groups of the same events get their deliveries.
func testFanOutEndsAFailedFilterAsFilterError(t *testing.T, e *env) {
	b := e.setup(t)
	var mu sync.Mutex
	counted := map[string]int{}
	logs := &lockedBuffer{}
	s := b.store(nil, func(o *Options) {
		o.Logger = zerolog.New(logs)
		o.FilterErrors = func(group string) { mu.Lock(); counted[group]++; mu.Unlock() }
	})
	put := func(group, filter string) {
		t.Helper()
		ep := b.endpoint(group, "t")
		ep.Filter = filter
		if _, _, err := s.PutEndpoint(b.ctx, ep); err != nil {
			t.Fatalf("PutEndpoint %s: %v", group, err)
		}
	}
	put("flagged", `event.data.flag`)
	put("costly", `event.data.s.matches('[ab]{30}c')`)
	put("plain", "")
	big := `"` + strings.Repeat("a", 1_000_000) + `"`
	var events []*pulsetype.Event
	for _, ev := range []*pulsetype.Event{
		{ID: "yes-1", Topic: "t", Data: []byte(`{"flag":"yes"}`)},
		{ID: "yes-2", Topic: "t", Data: []byte(`{"flag":"yes"}`)},
		{ID: "big", Topic: "t", Data: []byte(`{"flag":true,"s":` + big + `}`)},
	} {
		out, err := s.Publish(b.ctx, []*pulsetype.Event{ev})
		if err != nil {
			t.Fatalf("Publish %s: %v", ev.ID, err)
		}
		events = append(events, out[0].Event)
	}
	created, err := s.FanOut(b.ctx, events)
	if err != nil {
		t.Fatalf("FanOut: %v", err)
	}
	got := map[string]int{}
	for _, a := range created {
		got[a.ConsumerGroup]++
	}
	if len(created) != 4 || got["plain"] != 3 || got["flagged"] != 1 {
		t.Fatalf("FanOut returned %d attempts by group %v, want plain 3 and flagged 1 (the event whose flag is true)", len(created), got)
	}
	check := func(group, eventID, want string) {
		t.Helper()
		var d deliveryDoc
		if err := b.coll("deliveries").FindOne(b.ctx, bson.M{"_id": DeliveryID(group, eventID)}).Decode(&d); err != nil {
			t.Fatalf("delivery of %s to %s: %v", eventID, group, err)
		}
		if d.Status != pulsetype.StatusError || d.Error == nil || d.Error.Code != pulsetype.CodeFilterError || !strings.Contains(d.Error.Message, want) ||
			d.EndedAt == nil || d.FinalAttempt != 1 {
			t.Errorf("delivery of %s to %s = %+v (error %+v), want error filter_error naming %q, ended with attempt 1", eventID, group, d, d.Error, want)
		}
		var a attemptDoc
		if err := b.coll("history").FindOne(b.ctx, bson.M{"deliveryId": d.ID}).Decode(&a); err != nil {
			t.Fatalf("attempt of %s: %v", d.ID, err)
		}
		if a.Attempt != 1 || a.Status != pulsetype.StatusError || !a.Terminal || a.Error == nil || a.Error.Code != pulsetype.CodeFilterError || a.EndedAt == nil {
			t.Errorf("attempt of %s to %s = %+v, want attempt 1 ended terminal filter_error", eventID, group, a)
		}
		if n := b.count("queue", bson.M{"deliveryId": d.ID}); n != 0 {
			t.Errorf("%d queue documents for the delivery of %s to %s, want 0 (nothing to run)", n, eventID, group)
		}
	}
	check("flagged", "yes-1", `string "yes"`)
	check("flagged", "yes-2", `string "yes"`)
	check("costly", "big", "matches() over 1000000 bytes")
	for _, id := range []string{"yes-1", "yes-2"} { // event.data.s is missing: false, no delivery
		if n := b.count("deliveries", bson.M{"consumerGroup": "costly", "eventId": id}); n != 0 {
			t.Errorf("%d deliveries of %s to costly, want 0 (a missing field is false)", n, id)
		}
	}
	mu.Lock()
	if counted["flagged"] != 2 || counted["costly"] != 1 || len(counted) != 2 {
		t.Errorf("FilterErrors counted %v, want flagged 2 and costly 1", counted)
	}
	mu.Unlock()
	if n := strings.Count(logs.String(), `"consumer_group":"flagged"`); n != 1 {
		t.Errorf("%d log lines name group flagged, want 1 (once per group and filter):\n%s", n, logs)
	}
	if n := strings.Count(logs.String(), "its delivery ends as filter_error"); n != 2 {
		t.Errorf("%d log lines say filter_error, want 2 (flagged and costly):\n%s", n, logs)
	}

	// The repair's fan-out of the same events creates nothing more and leaves the ended deliveries ended.
	again, err := s.FanOut(b.ctx, events)
	if err != nil {
		t.Fatalf("second FanOut: %v", err)
	}
	if len(again) != 0 {
		t.Errorf("a second FanOut returned %d attempts, want 0", len(again))
	}
	if n := b.count("deliveries", bson.M{}); n != 7 {
		t.Errorf("%d deliveries after the second fan-out, want 7 (plain 3, flagged 3, costly 1)", n)
	}
	check("flagged", "yes-1", `string "yes"`)
}
