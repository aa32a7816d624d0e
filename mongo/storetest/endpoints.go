package storetest

import (
	"errors"
	"maps"
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
	{Name: "EndpointStateAndFailingStreak", Run: testEndpointStateAndFailingStreak},
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
	if _, err := s.DeleteEndpoint(b.ctx, "billing"); err != nil {
		t.Fatalf("DeleteEndpoint: %v", err)
	}
	if _, err := s.DeleteEndpoint(b.ctx, "billing"); !errors.Is(err, pulsetype.ErrNotFound) {
		t.Errorf("second DeleteEndpoint = %v, want ErrNotFound", err)
	}
	if _, err := s.GetEndpoint(b.ctx, "billing"); !errors.Is(err, pulsetype.ErrNotFound) {
		t.Errorf("GetEndpoint after delete = %v, want ErrNotFound", err)
	}
}

// Pause, resume and disable change only the state (a PUT keeps it, a repeated pause keeps its since); a
// failing streak disables an endpoint only once it lasted its disableAfter and a success ends it; an attempt
// that disabled its endpoint gives its successor one more uncounted attempt.
func testEndpointStateAndFailingStreak(t *testing.T, e *Env) {
	b := e.setup(t)
	s := b.store(nil, nil)
	b.putEndpoint(s, "g", "t")
	b.putEndpoint(s, "h", "t")
	state := func(want pulsetype.EndpointState, reason pulsetype.StateReason) *pulsetype.Endpoint {
		t.Helper()
		ep, err := s.GetEndpoint(b.ctx, "g")
		if err != nil || ep.State != want || ep.StateReason != reason || (want == pulsetype.EndpointActive) != (ep.StateSince == nil) {
			t.Fatalf("endpoint = %+v, %v; want state %s reason %q", ep, err, want, reason)
		}
		return ep
	}
	state(pulsetype.EndpointActive, "")
	if _, err := s.SetEndpointState(b.ctx, "nobody", pulsetype.EndpointPaused); err != pulsetype.ErrNotFound {
		t.Fatalf("pausing an unknown group: %v, want ErrNotFound", err)
	}
	paused := b.clock.Now()
	if _, err := s.SetEndpointState(b.ctx, "g", pulsetype.EndpointPaused); err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(time.Minute)
	if _, err := s.SetEndpointState(b.ctx, "g", pulsetype.EndpointPaused); err != nil {
		t.Fatal(err)
	}
	b.putEndpoint(s, "g", "t")
	if ep := state(pulsetype.EndpointPaused, pulsetype.ReasonPaused); !ep.StateSince.Equal(paused) {
		t.Fatalf("paused since %s after a second pause and a PUT, want %s", ep.StateSince, paused)
	}
	off, err := s.InactiveGroups(b.ctx, []string{"g", "h", "nobody"})
	if err != nil || !maps.Equal(off, map[string]bool{"g": true}) {
		t.Fatalf("InactiveGroups = %v, %v; want g", off, err)
	}
	if ok, err := s.DisableEndpoint(b.ctx, "g", pulsetype.ReasonGone, time.Time{}); ok || err != nil {
		t.Fatalf("DisableEndpoint of a paused endpoint = %v, %v; want false", ok, err)
	}
	if _, err := s.SetEndpointState(b.ctx, "g", pulsetype.EndpointActive); err != nil {
		t.Fatal(err)
	}
	state(pulsetype.EndpointActive, "")
	if ok, err := s.DisableEndpoint(b.ctx, "g", pulsetype.ReasonGone, time.Time{}); !ok || err != nil {
		t.Fatalf("DisableEndpoint = %v, %v; want true", ok, err)
	}
	if ok, _ := s.DisableEndpoint(b.ctx, "g", pulsetype.ReasonGone, time.Time{}); ok {
		t.Fatal("a second DisableEndpoint disabled it again")
	}
	state(pulsetype.EndpointDisabled, pulsetype.ReasonGone)
	states, err := s.EndpointStates(b.ctx)
	if err != nil || !maps.Equal(states, map[string]pulsetype.EndpointState{"g": pulsetype.EndpointDisabled, "h": pulsetype.EndpointActive}) {
		t.Fatalf("EndpointStates = %v, %v", states, err)
	}
	if _, err := s.SetEndpointState(b.ctx, "g", pulsetype.EndpointActive); err != nil {
		t.Fatal(err)
	}

	failed := map[string]time.Duration{"g": 10 * time.Second}
	record := func(failed map[string]time.Duration, succeeded ...string) []string {
		t.Helper()
		disabled, err := s.RecordHealth(b.ctx, failed, succeeded)
		if err != nil {
			t.Fatal(err)
		}
		return disabled
	}
	record(failed)
	b.clock.Advance(9 * time.Second)
	record(nil, "g") // a success ends the streak
	b.clock.Advance(2 * time.Second)
	if got := record(failed); len(got) != 0 {
		t.Fatalf("disabled %v 11 s after the first failure with a success between, want none", got)
	}
	b.clock.Advance(9 * time.Second)
	if got := record(failed); len(got) != 0 {
		t.Fatalf("disabled %v 9 s into the streak, want none", got)
	}
	b.clock.Advance(time.Second)
	if got := record(failed); !slices.Equal(got, []string{"g"}) {
		t.Fatalf("disabled %v 10 s into the streak, want g", got)
	}
	state(pulsetype.EndpointDisabled, pulsetype.ReasonFailing)
	if _, err := s.SetEndpointState(b.ctx, "g", pulsetype.EndpointActive); err != nil {
		t.Fatal(err)
	}
	if n := b.count("subscriptions", bson.M{"_id": "g", "failingSince": bson.M{"$ne": nil}}); n != 0 {
		t.Fatal("the resume kept the failing streak")
	}

	b.publishOne(s, "e1", "t")
	a, err := s.Claim(b.ctx, "me", []string{"g"})
	if err != nil || a == nil {
		t.Fatalf("Claim = %v, %v", a, err)
	}
	gone := pulsetype.AttemptResult{Status: pulsetype.StatusError, HTTPStatus: 410, Error: &pulsetype.ErrorInfo{Code: pulsetype.CodeEndpointGone}}
	c := pulsetype.Completion{Attempt: a, Result: gone, Next: pulsetype.RetryPolicy{MaxRetries: 0}.Decide(a.Counted(), gone, 0)}
	if _, err := s.FinishAttempts(b.ctx, []pulsetype.Completion{c}); err != nil {
		t.Fatal(err)
	}
	if err := s.FollowUps(b.ctx, []pulsetype.Completion{c}); err != nil {
		t.Fatal(err)
	}
	attempts, err := s.AttemptsOf(b.ctx, []string{a.DeliveryID})
	if err != nil || len(attempts[a.DeliveryID]) != 2 {
		t.Fatalf("attempt 2 after a 410 with maxRetries 0: %v, %v", attempts[a.DeliveryID], err)
	}
	if got := attempts[a.DeliveryID][1]; got.Number != 2 || got.Uncounted != 1 || got.Counted() != 1 {
		t.Fatalf("attempt 2 carries uncounted %d (counted %d), want 1 (1)", got.Uncounted, got.Counted())
	}
}
