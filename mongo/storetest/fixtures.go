package storetest

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// The fixtures below are the suite's factories and steps, exported for a store's own tests of its
// internals: each takes the narrow part of a store it calls and fails t when a call fails.

// Publisher is the part of a store that publishes and fans out.
type Publisher interface {
	Publish(ctx context.Context, events []*pulsetype.Event) ([]pulsetype.Published, error)
	FanOut(ctx context.Context, events []*pulsetype.Event) ([]*pulsetype.Attempt, error)
}

// Event is the fixture factory of events: id, topic and data (JSON text), nothing else set.
func Event(id, topic, data string) *pulsetype.Event {
	return &pulsetype.Event{ID: id, Topic: topic, Data: json.RawMessage(data)}
}

// Endpoint is the fixture factory of endpoints: a normalized registration of group for topics, whose URL
// (http://127.0.0.1:9/<group>) nothing listens on.
func Endpoint(t testing.TB, group string, topics ...string) *pulsetype.Endpoint {
	t.Helper()
	e := &pulsetype.Endpoint{ConsumerGroup: group, URL: "http://127.0.0.1:9/" + group, Topics: topics}
	if err := e.Normalize(); err != nil {
		t.Fatalf("Normalize fixture endpoint: %v", err)
	}
	return e
}

// PutEndpoint registers group for topics through s.
func PutEndpoint(t testing.TB, ctx context.Context, s interface {
	PutEndpoint(ctx context.Context, e *pulsetype.Endpoint) (*pulsetype.Endpoint, bool, error)
}, group string, topics ...string) {
	t.Helper()
	if _, _, err := s.PutEndpoint(ctx, Endpoint(t, group, topics...)); err != nil {
		t.Fatalf("PutEndpoint(%s): %v", group, err)
	}
}

// PublishOne publishes one event through s and fans it out; it returns the stored event.
func PublishOne(t testing.TB, ctx context.Context, s Publisher, id, topic string) *pulsetype.Event {
	t.Helper()
	out, err := s.Publish(ctx, []*pulsetype.Event{Event(id, topic, `{"n":1}`)})
	if err != nil {
		t.Fatalf("Publish(%s): %v", id, err)
	}
	if _, err := s.FanOut(ctx, []*pulsetype.Event{out[0].Event}); err != nil {
		t.Fatalf("FanOut(%s): %v", id, err)
	}
	return out[0].Event
}

// FanOutN publishes n events of topic (evt-<topic>-<i>) one by one and fans them out together, returning
// the first attempts FanOut created.
func FanOutN(t testing.TB, ctx context.Context, s Publisher, n int, topic string) []*pulsetype.Attempt {
	t.Helper()
	events := make([]*pulsetype.Event, n)
	for i := range events {
		out, err := s.Publish(ctx, []*pulsetype.Event{Event(fmt.Sprintf("evt-%s-%d", topic, i), topic, `{"n":1}`)})
		if err != nil {
			t.Fatalf("Publish: %v", err)
		}
		events[i] = out[0].Event
	}
	created, err := s.FanOut(ctx, events)
	if err != nil {
		t.Fatalf("FanOut: %v", err)
	}
	return created
}

// Claim claims the next due attempt through s and fails t when there is none.
func Claim(t testing.TB, ctx context.Context, s interface {
	Claim(ctx context.Context, owner string, exclude []string) (*pulsetype.Attempt, error)
}, owner string) *pulsetype.Attempt {
	t.Helper()
	a, err := s.Claim(ctx, owner, nil)
	if err != nil || a == nil {
		t.Fatalf("Claim = %v, %v; want an attempt", a, err)
	}
	return a
}

// EndDelivery ends a delivery through s and fails t unless this call ended it.
func EndDelivery(t testing.TB, ctx context.Context, s interface {
	EndDelivery(ctx context.Context, p pulsetype.EndDeliveryParams) (bool, error)
}, p pulsetype.EndDeliveryParams) {
	t.Helper()
	if ended, err := s.EndDelivery(ctx, p); err != nil || !ended {
		t.Fatalf("EndDelivery(%s, %s) = %v, %v; want ended", p.DeliveryID, p.Status, ended, err)
	}
}

// Count returns how many documents of coll match filter.
func Count(t testing.TB, ctx context.Context, coll *mongo.Collection, filter any) int64 {
	t.Helper()
	n, err := coll.CountDocuments(ctx, filter)
	if err != nil {
		t.Fatalf("count %s %v: %v", coll.Name(), filter, err)
	}
	return n
}
