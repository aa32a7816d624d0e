package mongo

import (
	"fmt"
	"slices"

	"github.com/pulse-sidecar/pulse/mongo/storetest"
	"github.com/pulse-sidecar/pulse/pulsetype"
)

// fanOutN publishes n events of topic and fans them out, returning the first attempts FanOut created.
func (b *bundle) fanOutN(s *Store, n int, topic string) []*pulsetype.Attempt {
	b.t.Helper()
	events := make([]*pulsetype.Event, n)
	for i := range events {
		out, err := s.Publish(b.ctx, []*pulsetype.Event{storetest.Event(fmt.Sprintf("evt-%s-%d", topic, i), topic, `{"n":1}`)})
		if err != nil {
			b.t.Fatalf("Publish: %v", err)
		}
		events[i] = out[0].Event
	}
	created, err := s.FanOut(b.ctx, events)
	if err != nil {
		b.t.Fatalf("FanOut: %v", err)
	}
	return created
}

func ids(as []*pulsetype.Attempt) []string {
	out := make([]string, len(as))
	for i, a := range as {
		out[i] = a.ID
	}
	slices.Sort(out)
	return out
}
