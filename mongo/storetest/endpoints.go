package storetest

import (
	"errors"
	"slices"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// endpointCases are the cases of endpoints.
var endpointCases = []Case{
	{Name: "PutEndpointConcurrentNewGroupLeavesOneSubscription", Run: testPutEndpointConcurrentNewGroupLeavesOneSubscription, Race: true},
	{Name: "PutEndpointReplaceKeepsCreatedAt", Run: testPutEndpointReplaceKeepsCreatedAt},
}

func testPutEndpointConcurrentNewGroupLeavesOneSubscription(t *testing.T, e *Env) {
	b := e.setup(t)
	stores := []Store{b.store(nil, nil), b.store(b.connect(), nil)}
	const n = 16
	created := make([]bool, n)
	errs := make([]error, n)
	Concurrently(n, func(i int) {
		_, created[i], errs[i] = stores[i%2].PutEndpoint(b.ctx, b.endpoint("billing", "payment.captured"))
	})
	for i, err := range errs {
		if err != nil {
			t.Errorf("PutEndpoint #%d: %v", i, err)
		}
	}
	if got := b.count("subscriptions", bson.M{}); got != 1 {
		t.Errorf("%d subscription documents, want 1", got)
	}
	if got := b.count("subscriptions", bson.M{"_id": "billing"}); got != 1 {
		t.Errorf("%d subscription documents for billing, want 1", got)
	}
	nCreated := 0
	for _, c := range created {
		if c {
			nCreated++
		}
	}
	if nCreated != 1 {
		t.Errorf("%d of %d PutEndpoint calls reported created=true, want exactly 1", nCreated, n)
	}
	got, err := stores[1].GetEndpoint(b.ctx, "billing")
	if err != nil || got.URL != "http://127.0.0.1:9/billing" || !slices.Equal(got.Topics, []string{"payment.captured"}) {
		t.Errorf("GetEndpoint(billing) = %+v, %v", got, err)
	}
}

func testPutEndpointReplaceKeepsCreatedAt(t *testing.T, e *Env) {
	b := e.setup(t)
	s := b.store(nil, nil)
	first, created, err := s.PutEndpoint(b.ctx, b.endpoint("billing", "a"))
	if err != nil || !created {
		t.Fatalf("first PutEndpoint = created %v, %v; want true, nil", created, err)
	}
	b.clock.Advance(time.Minute)
	second, created, err := s.PutEndpoint(b.ctx, b.endpoint("billing", "b", "c"))
	if err != nil || created {
		t.Fatalf("second PutEndpoint = created %v, %v; want false, nil", created, err)
	}
	if !second.CreatedAt.Equal(first.CreatedAt) || !second.UpdatedAt.Equal(b.clock.Now()) {
		t.Errorf("replaced endpoint createdAt %v updatedAt %v; want createdAt %v, updatedAt %v",
			second.CreatedAt, second.UpdatedAt, first.CreatedAt, b.clock.Now())
	}
	if !slices.Equal(second.Topics, []string{"b", "c"}) {
		t.Errorf("replaced topics = %v, want [b c]", second.Topics)
	}
	if err := s.DeleteEndpoint(b.ctx, "billing"); err != nil {
		t.Fatalf("DeleteEndpoint: %v", err)
	}
	if err := s.DeleteEndpoint(b.ctx, "billing"); !errors.Is(err, pulsetype.ErrNotFound) {
		t.Errorf("second DeleteEndpoint = %v, want ErrNotFound", err)
	}
	if _, err := s.GetEndpoint(b.ctx, "billing"); !errors.Is(err, pulsetype.ErrNotFound) {
		t.Errorf("GetEndpoint after delete = %v, want ErrNotFound", err)
	}
}
