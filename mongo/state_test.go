package mongo

import (
	"maps"
	"slices"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// Pause, resume and disable change only the state (a PUT keeps it, a repeated pause keeps its since); a
// failing streak disables an endpoint only once it lasted its disableAfter and a success ends it; an attempt
// that disabled its endpoint gives its successor one more uncounted attempt.
func testEndpointStateAndFailingStreak(t *testing.T, e *env) {
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
	a, err := s.Claim(b.ctx, "me", []string{"h"})
	if err != nil || a == nil {
		t.Fatalf("Claim = %v, %v", a, err)
	}
	gone := pulsetype.AttemptResult{Status: pulsetype.StatusError, HTTPStatus: 410, Error: &pulsetype.ErrorInfo{Code: pulsetype.CodeEndpointGone}}
	c := pulsetype.Completion{Attempt: a, Result: gone, Next: pulsetype.RetryPolicy{MaxRetries: 0}.Decide(a.Counted(), gone)}
	if _, err := s.FinishAttempts(b.ctx, []pulsetype.Completion{c}); err != nil {
		t.Fatal(err)
	}
	if err := s.FollowUps(b.ctx, []pulsetype.Completion{c}); err != nil {
		t.Fatal(err)
	}
	var next attemptDoc
	if err := b.coll("history").FindOne(b.ctx, bson.M{"deliveryId": a.DeliveryID, "attempt": 2}).Decode(&next); err != nil {
		t.Fatalf("attempt 2 after a 410 with maxRetries 0: %v", err)
	}
	if got := next.attempt(); got.Uncounted != 1 || got.Counted() != 1 {
		t.Fatalf("attempt 2 carries uncounted %d (counted %d), want 1 (1)", got.Uncounted, got.Counted())
	}
}
