package mongo

import (
	"context"
	"fmt"
	"testing"

	"github.com/pulse-sidecar/pulse/mongo/storetest"
	"github.com/pulse-sidecar/pulse/pulsetype"
)

// filterBenchGroups is how many consumer groups BenchmarkPublishFilters subscribes to the topic.
const filterBenchGroups = 100

// BenchmarkPublishFilters measures the publish cost (Publish and FanOut of one event) with 100 consumer
// groups on the event's topic, in one run: without a filter, and each with the filter
// `event.data.amount > 0 && event.headers.source == "checkout"`, which holds, so both write the same 100
// deliveries and differ only by the filters. The wants/* cases time the rule alone (the fan-out's loop of
// WantsInput over the 100 groups for one event, no database). It reports µs/event.
//
// Run: go test -run '^$' -bench PublishFilters -benchtime 50x ./mongo/
func BenchmarkPublishFilters(b *testing.B) {
	const filter = `event.data.amount > 0 && event.headers.source == "checkout"`
	for _, f := range []string{"", filter} {
		name := "no-filter"
		if f != "" {
			name = "filter"
		}
		b.Run("publish/"+name, func(b *testing.B) { benchPublishFilters(b, f) })
	}
	for _, f := range []string{"", filter} {
		name := "no-filter"
		if f != "" {
			name = "filter"
		}
		b.Run("wants/"+name, func(b *testing.B) { benchWants(b, f) })
	}
}

func filterBenchEvent(id string) *pulsetype.Event {
	ev := storetest.Event(id, "t", `{"amount":12.5,"currency":"EUR","customer":{"id":"c-1","tier":"gold"}}`)
	ev.Headers = map[string]string{"source": "checkout"}
	return ev
}

func benchPublishFilters(b *testing.B, filter string) {
	s, _ := benchStore(b) // two groups of its own, ledger and mailer, on topic t
	ctx := context.Background()
	for i := range filterBenchGroups - 2 {
		ep := &pulsetype.Endpoint{ConsumerGroup: fmt.Sprintf("g%03d", i), URL: "http://127.0.0.1:9/", Topics: []string{"t"}, Filter: filter}
		if err := ep.Normalize(); err != nil {
			b.Fatal(err)
		}
		if _, _, err := s.PutEndpoint(ctx, ep); err != nil {
			b.Fatal(err)
		}
	}
	n, deliveries := 0, 0
	for b.Loop() {
		out, err := s.Publish(ctx, []*pulsetype.Event{filterBenchEvent(fmt.Sprintf("evt-%d", n))})
		if err != nil {
			b.Fatal(err)
		}
		n++
		created, err := s.FanOut(ctx, []*pulsetype.Event{out[0].Event})
		if err != nil {
			b.Fatal(err)
		}
		deliveries += len(created)
	}
	if want := filterBenchGroups * n; deliveries != want {
		b.Fatalf("%d deliveries for %d events, want %d (every filter holds)", deliveries, n, want)
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(n), "µs/event")
}

func benchWants(b *testing.B, filter string) {
	subs := make([]subscriptionDoc, filterBenchGroups)
	for i := range subs {
		subs[i] = subscriptionDoc{ID: fmt.Sprintf("g%03d", i), Topics: []string{"t"}, Filter: filter, OffsetReset: pulsetype.OffsetEarliest}
	}
	ev := filterBenchEvent("e")
	filters := &pulsetype.FilterCache{}
	n := 0
	for b.Loop() {
		in := pulsetype.InputOf(ev)
		for i := range subs {
			if !subs[i].wants(in, filters) {
				b.Fatal("a group does not want the event")
			}
		}
		n++
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(n), "µs/event")
}
