package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/pulse-sidecar/pulse/e2e/internal/harness"
	"github.com/pulse-sidecar/pulse/internal/testwait"
)

// A filter includes the events it holds for and excludes the others, at fan-out: the excluded event has no
// delivery for the filtered group at all, while a group without a filter receives both; a topics pattern
// "payment.*" matches payment.captured and not payment.card.captured.
func TestFilterIncludesAndExcludes(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv())
	big, all := harness.NewReceiver(t, 200), harness.NewReceiver(t, 200)
	s.RegisterEndpoint(t, "big", map[string]any{"url": big.URL, "topics": []string{"payment.*", "payment.card.captured"},
		"filter": `event.data.amount > 100 && event.headers.source == "checkout"`})
	s.RegisterEndpoint(t, "all", map[string]any{"url": all.URL, "topics": []string{"payment.captured", "payment.card.captured"}})

	publish := func(topic string, amount int, source string) string {
		var out struct{ ID string }
		body := map[string]any{"topic": topic, "data": map[string]any{"amount": amount}, "headers": map[string]string{"source": source}}
		if code := harness.Do(t, "POST", s.URL+"/v1/events", body, &out); code != 202 {
			t.Fatalf("publish answered %d", code)
		}
		return out.ID
	}
	small := publish("payment.captured", 50, "checkout")
	large := publish("payment.captured", 500, "checkout")
	otherSource := publish("payment.captured", 500, "batch")
	deeper := publish("payment.card.captured", 500, "checkout")
	s.WantSuccess(t, "all", 30*time.Second, small, large, otherSource, deeper)
	s.WantSuccess(t, "big", 30*time.Second, large, deeper)
	// Each event's fan-out wrote the deliveries of both groups at once: "all" has its delivery, so the
	// filtered group's absence is the filter's decision, not a fan-out still to come.
	for _, id := range []string{small, otherSource} {
		if n := b.Count("deliveries", bson.M{"consumerGroup": "big", "eventId": id}); n != 0 {
			t.Errorf("event %s excluded by the filter has %d deliveries for group big, want 0", id, n)
		}
	}
	got := big.Received()
	if len(got) != 2 {
		t.Fatalf("the filtered group got %d POSTs, want 2 (the events of amount 500 from checkout)", len(got))
	}
	for _, r := range got {
		if !strings.Contains(string(r.Body), large) && !strings.Contains(string(r.Body), deeper) {
			t.Errorf("the filtered group got %s, want only %s and %s", r.Body, large, deeper)
		}
	}

	// The backfill of an earliest-offset group registered now applies the pattern and the filter too.
	s.RegisterEndpoint(t, "backfilled", map[string]any{"url": all.URL, "topics": []string{"payment.*"}, "offsetReset": "earliest",
		"filter": `event.data.amount >= 500`})
	s.WantSuccess(t, "backfilled", 30*time.Second, large, otherSource)
	for _, id := range []string{small, deeper} {
		if n := b.Count("deliveries", bson.M{"consumerGroup": "backfilled", "eventId": id}); n != 0 {
			t.Errorf("the backfill gave event %s, which the pattern or the filter excludes, %d deliveries, want 0", id, n)
		}
	}

	// The pattern alone: payment.card.captured is one segment too deep for payment.*.
	s.RegisterEndpoint(t, "pattern", map[string]any{"url": all.URL, "topics": []string{"payment.*"}})
	captured, card := publish("payment.captured", 1, "x"), publish("payment.card.captured", 1, "x")
	s.WantSuccess(t, "all", 30*time.Second, captured, card)
	s.WantSuccess(t, "pattern", 30*time.Second, captured)
	if n := b.Count("deliveries", bson.M{"consumerGroup": "pattern", "eventId": card}); n != 0 {
		t.Errorf("payment.card.captured has %d deliveries for a group of payment.*, want 0", n)
	}
}

// A bad filter is refused at PUT with 400 naming the field and the problem, and nothing is stored.
func TestFilterRefusedAtPut(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv())
	for _, tt := range []struct{ filter, want string }{
		{`event.data.amount >`, "not a valid CEL expression"},
		{`event.data.amount`, ""}, // dyn: allowed, the result must be true at run time
		{`event.data.amount + 1`, "must be a boolean expression"},
		{`event.data.items.all(i, event.data.items.all(j, i == j))`, "may cost up to"},
		// The result type is the typed check's: a header and the topic are strings, refused naming the type.
		{`event.headers.source`, "must be a boolean expression, got string"},
		{`event.topic`, "must be a boolean expression, got string"},
		// Regular expressions are compiled at PUT only: a literal pattern, of a bounded program.
		{`event.data.s.matches(event.data.p)`, "pattern as a string literal"},
		{`event.data.s.matches('[ab]{1000}c')`, "regex program size"},
	} {
		var out struct {
			Error struct{ Code, Message, Field string }
		}
		code := harness.Do(t, "PUT", s.URL+"/v1/endpoints/g", map[string]any{"url": "http://127.0.0.1:9/", "topics": []string{"t"}, "filter": tt.filter}, &out)
		if tt.want == "" {
			if code != 201 && code != 200 {
				t.Fatalf("PUT filter %q = %d, want it accepted", tt.filter, code)
			}
			continue
		}
		if code != 400 || !strings.Contains(out.Error.Message, "filter") || !strings.Contains(out.Error.Message, tt.want) {
			t.Fatalf("PUT filter %q = %d %+v, want 400 naming the filter and %q", tt.filter, code, out, tt.want)
		}
	}
}

// A PUT that changes the filter ends the group's pending deliveries as error/unsubscribed, as a PUT that
// removes a topic ends that topic's: they were chosen by the old filter, which is never evaluated again.
func TestFilterChangeEndsPendingWork(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv())
	rcv := harness.NewReceiver(t, 200)
	body := map[string]any{"url": rcv.URL, "topics": []string{"payment.captured"}, "filter": `event.data.amount > 1`}
	s.RegisterEndpoint(t, "g", body)
	if code := harness.Do(t, "POST", s.URL+"/v1/endpoints/g/pause", nil, nil); code != 200 {
		t.Fatalf("pause = %d", code)
	}
	id := s.Publish(t, "payment.captured", map[string]any{"amount": 5})
	testwait.Eventually(t, 30*time.Second, "the delivery of "+id+" to be created", func() bool {
		return b.Count("deliveries", bson.M{"consumerGroup": "g", "eventId": id, "status": "pending"}) == 1
	})
	body["filter"] = `event.data.amount > 2`
	s.RegisterEndpoint(t, "g", body)
	d := s.WaitDelivery(t, id, "g", 30*time.Second)
	if d.Status != "error" || d.Error == nil || d.Error.Code != "unsubscribed" || !strings.Contains(d.Error.Message, "filter changed") {
		t.Fatalf("delivery after the filter changed = %+v (error %+v), want error unsubscribed saying the filter changed", d, d.Error)
	}
	rcv.WantPOSTs(t, 0, "(the endpoint was paused, then its pending work ended)")
}

// No publish can make one group's filter delay another group: two 1 MB events that a costly filter of group
// costly sees (a matches() whose RE2 work is the input's size times its pattern's 193 instructions) end
// that group's deliveries as filter_error at once, charged before the match runs, and an event of another
// topic published right after them reaches group other within 10 times the latency measured for that group
// in this test beforehand, plus 1 s. Each filter_error is counted in pulse_filter_errors_total and logged
// once for the group. Before the fix each event's match held the fan-out of every group for seconds.
func TestACostlyFilterDelaysNoOtherGroup(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv())
	sink, other := harness.NewReceiver(t, 200), harness.NewReceiver(t, 200)
	s.RegisterEndpoint(t, "costly", map[string]any{"url": sink.URL, "topics": []string{"big"}, "filter": `event.data.s.matches('[ab]{190}c')`})
	s.RegisterEndpoint(t, "other", map[string]any{"url": other.URL, "topics": []string{"small"}})

	// latency publishes one event to group other and returns the time until the receiver had its POST.
	latency := func(i int) time.Duration {
		t.Helper()
		n := len(other.Received())
		start := time.Now()
		id := s.Publish(t, "small", map[string]any{"i": i})
		select {
		case <-other.Notify:
		case <-time.After(2 * time.Minute):
			t.Fatalf("event %s of group other was not POSTed within 2 min", id)
		}
		got := other.Received()
		if len(got) != n+1 || !strings.Contains(string(got[n].Body), id) {
			t.Fatalf("group other got %d POSTs, the last %s; want %d, the last event %s", len(got), got[len(got)-1].Body, n+1, id)
		}
		return got[n].At.Sub(start)
	}
	var baseline []time.Duration
	for i := range 5 {
		baseline = append(baseline, latency(i))
	}
	slices.Sort(baseline)
	base := baseline[len(baseline)/2] // the median

	big := map[string]any{"s": strings.Repeat("a", 1_000_000)}
	costly := []string{s.Publish(t, "big", big), s.Publish(t, "big", big)}
	after := latency(99)
	bound := 10*base + time.Second
	t.Logf("latency of group other: median %s of %v before, %s after two 1 MB events of group costly (bound %s)", base, baseline, after, bound)
	if after > bound {
		t.Errorf("group other's event took %s after the 1 MB events of group costly, more than 10 × its baseline %s + 1 s", after, base)
	}
	for _, id := range costly {
		d := s.WaitDelivery(t, id, "costly", time.Minute)
		if d.Status != "error" || d.Error == nil || d.Error.Code != "filter_error" || !strings.Contains(d.Error.Message, "matches() over 1000000 bytes") {
			t.Errorf("delivery of %s to costly = %+v (error %+v), want error filter_error naming the matches() over 1000000 bytes", id, d, d.Error)
		}
	}
	sink.WantPOSTs(t, 0, "(the filter failed: nothing is POSTed)")
	wantFilterErrors(t, s, "costly", 2)
}

// A filter of type dyn whose result for an event is not a boolean ends that delivery as terminal
// filter_error naming the type, counted and logged once for the group, never a silent nothing; an event for
// which it is true is delivered.
func TestAFilterThatIsNotBooleanAtRunEndsTheDelivery(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv())
	rcv := harness.NewReceiver(t, 200)
	s.RegisterEndpoint(t, "flagged", map[string]any{"url": rcv.URL, "topics": []string{"t"}, "filter": `event.data.flag`})
	yes1, yes2 := s.Publish(t, "t", map[string]any{"flag": "yes"}), s.Publish(t, "t", map[string]any{"flag": "yes"})
	ok := s.Publish(t, "t", map[string]any{"flag": true})
	s.WantSuccess(t, "flagged", time.Minute, ok)
	for _, id := range []string{yes1, yes2} {
		d := s.WaitDelivery(t, id, "flagged", time.Minute)
		if d.Status != "error" || d.Error == nil || d.Error.Code != "filter_error" || !strings.Contains(d.Error.Message, `string "yes"`) ||
			len(d.Attempts) != 1 {
			t.Errorf("delivery of %s = %+v (error %+v), want error filter_error naming the string result, with its one attempt", id, d, d.Error)
		}
	}
	rcv.WantPOSTs(t, 1, "(only the event whose flag is true)")
	wantFilterErrors(t, s, "flagged", 2)
}

// wantFilterErrors checks that /metrics counts n filter errors of group and that the sidecar logged them
// once (once per group and filter).
func wantFilterErrors(t *testing.T, s *harness.Sidecar, group string, n int) {
	t.Helper()
	if body := scrape(t, s); !strings.Contains(body, fmt.Sprintf(`pulse_filter_errors_total{consumer_group=%q} %d`, group, n)) {
		t.Errorf("/metrics does not count the %d filter errors of %s:\n%s", n, group, grepLines(body, "pulse_filter_errors_total"))
	}
	if got := strings.Count(s.Logs.String(), "its delivery ends as filter_error"); got != 1 {
		t.Errorf("%d log lines for the filter errors of %s, want 1 (once per group and filter)", got, group)
	}
}
