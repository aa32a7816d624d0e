package mongo

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// fanOutN publishes n events of topic and fans them out, returning the first attempts FanOut created.
func (b *bundle) fanOutN(s *Store, n int, topic string) []*pulsetype.Attempt {
	b.t.Helper()
	events := make([]*pulsetype.Event, n)
	for i := range events {
		out, err := s.Publish(b.ctx, []*pulsetype.Event{event(fmt.Sprintf("evt-%s-%d", topic, i), topic, `{"n":1}`)})
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

// ClaimAttempts leases with one token what it wins and reads back exactly its own share when another replica
// leased some first; racing replicas never lease one attempt twice.
func testClaimAttemptsLeasesEachAttemptOnce(t *testing.T, e *env) {
	b := e.setup(t)
	s := b.store(nil, nil)
	b.putEndpoint(s, "billing", "t")
	created := b.fanOutN(s, 12, "t")
	if len(created) != 12 {
		t.Fatalf("FanOut created %d first attempts, want 12", len(created))
	}

	first, err := s.ClaimAttempts(b.ctx, "worker-a", created[:4])
	if err != nil || len(first) != 4 {
		t.Fatalf("ClaimAttempts(4 free) = %d attempts, %v; want 4", len(first), err)
	}
	other := b.store(b.connect(), nil)
	rest, err := other.ClaimAttempts(b.ctx, "worker-b", created) // 4 of 12 are leased already: read back
	if err != nil {
		t.Fatalf("ClaimAttempts: %v", err)
	}
	if want := ids(created[4:]); !slices.Equal(ids(rest), want) {
		t.Fatalf("second ClaimAttempts leased %v, want the 8 free ones %v", ids(rest), want)
	}
	for _, a := range append(first, rest...) {
		d := b.historyDoc(a.ID)
		if d.FencingToken != a.FencingToken || d.LeaseOwner != a.LeaseOwner || d.LeasedUntil == nil || !d.LeasedUntil.Equal(*a.LeasedUntil) {
			t.Errorf("attempt %s: stored lease (%s, %s, %v) differs from the returned one (%s, %s, %v)",
				a.ID, d.LeaseOwner, d.FencingToken, d.LeasedUntil, a.LeaseOwner, a.FencingToken, a.LeasedUntil)
		}
		if a.EventID == "" || a.DeliveryID == "" || a.Number != 1 {
			t.Errorf("returned attempt lacks its fields: %+v", a)
		}
	}
	if first[0].FencingToken == rest[0].FencingToken {
		t.Error("two claims share a fencing token")
	}
	if again, err := s.ClaimAttempts(b.ctx, "worker-a", created); err != nil || len(again) != 0 {
		t.Errorf("ClaimAttempts of leased attempts = %d, %v; want none", len(again), err)
	}

	// Six replicas race for 12 fresh attempts: each is leased by exactly one.
	s2 := b.store(nil, nil)
	b.putEndpoint(s2, "audit", "u")
	fresh := b.fanOutN(s2, 12, "u")
	const n = 6
	won := make([][]*pulsetype.Attempt, n)
	errs := make([]error, n)
	stores := make([]*Store, n)
	for i := range stores {
		stores[i] = b.store(b.connect(), nil)
	}
	concurrently(n, func(i int) { won[i], errs[i] = stores[i].ClaimAttempts(b.ctx, "racer", fresh) })
	var all []*pulsetype.Attempt
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("racer %d: %v", i, errs[i])
		}
		all = append(all, won[i]...)
	}
	if !slices.Equal(ids(all), ids(fresh)) {
		t.Errorf("racers leased %v, want each of %v exactly once", ids(all), ids(fresh))
	}
}

// FinishAttempts records, in one bulk write, the results whose lease is still held, and reports the ones it
// did not write (reaped, released); FollowUps then ends deliveries and creates retries exactly once.
func testFinishAttemptsIsFencedPerAttempt(t *testing.T, e *env) {
	b := e.setup(t)
	s := b.store(nil, func(o *Options) { o.HistoryRetention = time.Hour })
	b.putEndpoint(s, "billing", "t")
	created := b.fanOutN(s, 5, "t")
	leased, err := s.ClaimAttempts(b.ctx, "worker-a", created)
	if err != nil || len(leased) != 5 {
		t.Fatalf("ClaimAttempts = %d, %v; want 5", len(leased), err)
	}
	slices.SortFunc(leased, func(x, y *pulsetype.Attempt) int { return cmp.Compare(x.EventID, y.EventID) })
	// leased[3] is reaped meanwhile, leased[4] given back.
	b.clock.Advance(31 * time.Second)
	reaped, err := s.ReapOne(b.ctx)
	if err != nil || reaped == nil {
		t.Fatalf("ReapOne = %v, %v", reaped, err)
	}
	reapedAt := slices.IndexFunc(leased, func(a *pulsetype.Attempt) bool { return a.ID == reaped.ID })
	leased[3], leased[reapedAt] = leased[reapedAt], leased[3]
	if err := s.ReleaseAttempt(b.ctx, leased[4]); err != nil {
		t.Fatalf("ReleaseAttempt: %v", err)
	}

	lost, err := s.Renew(b.ctx, []pulsetype.LeaseKey{leased[0].Key(), leased[3].Key(), leased[4].Key()})
	if want := []pulsetype.LeaseKey{leased[3].Key(), leased[4].Key()}; err != nil || !slices.Equal(lost, want) {
		t.Errorf("Renew(held, reaped, released) = %v, %v; want the last two lost", lost, err)
	}

	ok := pulsetype.AttemptResult{Status: pulsetype.StatusSuccess, HTTPStatus: 200, Duration: 7 * time.Millisecond}
	bad := pulsetype.AttemptResult{Status: pulsetype.StatusError, HTTPStatus: 500, Error: &pulsetype.ErrorInfo{Code: pulsetype.CodeHandlerError, Message: "500"}}
	badAgain := bad
	badAgain.Duration, badAgain.ResponseBody = 9*time.Millisecond, "second"
	gone := pulsetype.AttemptResult{Status: pulsetype.StatusError, HTTPStatus: 410, Terminal: true, Error: &pulsetype.ErrorInfo{Code: pulsetype.CodeHandlerError, Message: "410"},
		Duration: 400 * time.Microsecond} // a POST under a millisecond
	cs := []pulsetype.Completion{
		{Attempt: leased[0], Result: ok, Next: pulsetype.NextStep{EndStatus: pulsetype.StatusSuccess}},
		{Attempt: leased[1], Result: bad, Next: pulsetype.NextStep{Retry: true, Delay: 2 * time.Second}},
		{Attempt: leased[2], Result: gone, Next: pulsetype.NextStep{EndStatus: pulsetype.StatusError, EndError: gone.Error}},
		{Attempt: leased[3], Result: ok, Next: pulsetype.NextStep{EndStatus: pulsetype.StatusSuccess}},
		{Attempt: leased[4], Result: ok, Next: pulsetype.NextStep{EndStatus: pulsetype.StatusSuccess}},
		// A second result of leased[1] in the same batch, the same outcome with other evidence: only the first
		// one is written, and only the first reported recorded.
		{Attempt: leased[1], Result: badAgain, Next: pulsetype.NextStep{Retry: true, Delay: 2 * time.Second}},
	}
	recorded, err := s.FinishAttempts(b.ctx, cs)
	if want := []bool{true, true, true, false, false, false}; err != nil || !slices.Equal(recorded, want) {
		t.Fatalf("FinishAttempts = %v, %v; want %v", recorded, err, want)
	}
	if d := b.historyDoc(leased[1].ID); d.Status != pulsetype.StatusError || d.HTTPStatus != 500 || d.DurationMs != nil || d.ResponseBody != "" {
		t.Errorf("attempt with two results in one batch = %+v, want the first (HTTP 500, no evidence)", d)
	}
	if d := b.historyDoc(leased[0].ID); d.Status != pulsetype.StatusSuccess || d.HTTPStatus != 200 || d.DurationMs == nil || *d.DurationMs != 7 || d.ExpiresAt == nil {
		t.Errorf("recorded success = %+v", d)
	}
	if d := b.historyDoc(leased[2].ID); d.HTTPStatus != 410 || d.DurationMs == nil || *d.DurationMs != 0 {
		t.Errorf("attempt whose POST took 400µs = %+v, want durationMs 0 (present)", d)
	}
	if d := b.historyDoc(leased[3].ID); d.Status != pulsetype.StatusError || d.Error == nil || d.Error.Code != pulsetype.CodeWorkerLost || d.HTTPStatus != 0 || d.DurationMs != nil {
		t.Errorf("the reaped attempt was overwritten: %+v", d)
	}
	if d := b.historyDoc(leased[4].ID); d.Status != pulsetype.StatusPending || d.FencingToken != "" || d.HTTPStatus != 0 || d.DurationMs != nil {
		t.Errorf("the released attempt was overwritten: %+v", d)
	}

	for range 2 { // idempotent: a second application changes nothing
		if err := s.FollowUps(b.ctx, cs[:3]); err != nil {
			t.Fatalf("FollowUps: %v", err)
		}
	}
	var ended deliveryDoc
	if err := b.coll("deliveries").FindOne(b.ctx, bson.M{"_id": leased[0].DeliveryID}).Decode(&ended); err != nil {
		t.Fatal(err)
	}
	if ended.Status != pulsetype.StatusSuccess || ended.FinalAttempt != 1 || ended.EndedAt == nil || ended.ExpiresAt == nil {
		t.Errorf("delivery after success = %+v", ended)
	}
	if got := b.count("history", bson.M{"deliveryId": leased[1].DeliveryID, "attempt": 2, "status": pulsetype.StatusPending,
		"nextAttemptAt": b.clock.Now().Add(2 * time.Second)}); got != 1 {
		t.Errorf("%d pending attempt 2 due in 2s after the retryable error, want 1", got)
	}
	if got := b.count("deliveries", bson.M{"_id": leased[1].DeliveryID, "status": pulsetype.StatusPending}); got != 1 {
		t.Errorf("the retried delivery is not pending any more")
	}
	var failedDoc deliveryDoc
	if err := b.coll("deliveries").FindOne(b.ctx, bson.M{"_id": leased[2].DeliveryID}).Decode(&failedDoc); err != nil {
		t.Fatal(err)
	}
	if failedDoc.Status != pulsetype.StatusError || failedDoc.Error == nil || failedDoc.Error.Message != "410" || failedDoc.FinalAttempt != 1 {
		t.Errorf("delivery after a terminal error = %+v", failedDoc)
	}
}

// FanOut leaves the fanout mark; ClearFanOut clears it, and FanOutStale repeats a fan-out whose mark stayed
// without creating anything twice.
func testFanOutMarkIsClearedSeparately(t *testing.T, e *env) {
	b := e.setup(t)
	s := b.store(nil, nil)
	b.putEndpoint(s, "billing", "t")
	created := b.fanOutN(s, 3, "t")
	if got := b.count("events", bson.M{"fanout": true}); got != 3 {
		t.Fatalf("%d events marked after FanOut, want 3", got)
	}
	b.clock.Advance(2 * time.Minute)
	if n, err := s.FanOutStale(b.ctx, time.Minute, 10); err != nil || n != 0 {
		t.Errorf("FanOutStale after a complete fan-out = %d, %v; want 0 new attempts", n, err)
	}
	if got := b.count("history", bson.M{}); got != int64(len(created)) {
		t.Errorf("%d attempts after the repeated fan-out, want %d", got, len(created))
	}
	if got := b.count("events", bson.M{"fanout": true}); got != 0 {
		t.Errorf("%d events still marked after FanOutStale, want 0", got)
	}
	b.publishOne(s, "evt-z", "t")
	if err := s.ClearFanOut(b.ctx, []string{"evt-z"}); err != nil {
		t.Fatalf("ClearFanOut: %v", err)
	}
	if got := b.count("events", bson.M{"fanout": true}); got != 0 {
		t.Errorf("%d events still marked after ClearFanOut, want 0", got)
	}
}

// GetEvents returns the visible events among the ids, with one query.
func testGetEventsSkipsMissingAndExpired(t *testing.T, e *env) {
	b := e.setup(t)
	s := b.store(nil, func(o *Options) { o.EventRetention = time.Minute })
	b.publishOne(s, "evt-old", "t")
	b.clock.Advance(2 * time.Minute)
	b.publishOne(s, "evt-new", "t")
	got, err := s.GetEvents(b.ctx, []string{"evt-old", "evt-new", "evt-none"})
	if err != nil {
		t.Fatalf("GetEvents: %v", err)
	}
	if len(got) != 1 || got["evt-new"] == nil || string(got["evt-new"].Data) != `{"n":1}` {
		t.Errorf("GetEvents = %v, want only evt-new with its data", got)
	}
}

// A batch larger than FerretDB's pool of backend connections is written in several commands instead of one
// that would wait forever for a connection it holds itself (120 statements > 100 on SQLite, 50 on PostgreSQL).
func testLargeBatchesDoNotStallTheDatabase(t *testing.T, e *env) {
	b := e.setup(t)
	s := b.store(nil, nil)
	b.putEndpoint(s, "billing", "t")
	b.putEndpoint(s, "audit", "t")
	created := b.fanOutN(s, 60, "t")
	leased, err := s.ClaimAttempts(b.ctx, "worker-a", created)
	if err != nil || len(leased) != 120 {
		t.Fatalf("ClaimAttempts = %d, %v; want 120", len(leased), err)
	}
	cs := make([]pulsetype.Completion, len(leased))
	for i, a := range leased {
		e := &pulsetype.ErrorInfo{Code: pulsetype.CodeHandlerError, Message: fmt.Sprintf("HTTP 410 #%d", i)}
		cs[i] = pulsetype.Completion{Attempt: a,
			Result: pulsetype.AttemptResult{Status: pulsetype.StatusError, HTTPStatus: 410, Terminal: true, Duration: time.Duration(i+1) * time.Millisecond, Error: e},
			Next:   pulsetype.NextStep{EndStatus: pulsetype.StatusError, EndError: e}}
	}
	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()
	recorded, err := s.FinishAttempts(ctx, cs)
	if err != nil || !slices.Equal(recorded, slices.Repeat([]bool{true}, 120)) {
		t.Fatalf("FinishAttempts(120) = %v, %v; want all recorded", recorded, err)
	}
	if err := s.FollowUps(ctx, cs); err != nil {
		t.Fatalf("FollowUps(120 distinct ends): %v", err)
	}
	if d := b.historyDoc(leased[119].ID); d.DurationMs == nil || *d.DurationMs != 120 || d.HTTPStatus != 410 || d.Error == nil || d.Error.Message != "HTTP 410 #119" {
		t.Errorf("last attempt of the batch = %+v, want its own evidence", d)
	}
	if got := b.count("deliveries", bson.M{"status": pulsetype.StatusError}); got != 120 {
		t.Errorf("%d deliveries ended with an error, want 120", got)
	}
}
