package storetest

import (
	"errors"
	"slices"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// claimCases are the cases of claim.
var claimCases = []Case{
	{Name: "ClaimIsFencedByFencingToken", Run: testClaimIsFencedByFencingToken},
	{Name: "ClaimAttemptsLeasesEachAttemptOnce", Run: testClaimAttemptsLeasesEachAttemptOnce, Race: true},
	{Name: "QueueHoldsPendingWorkOnly", Run: testQueueHoldsPendingWorkOnly},
}

func testClaimIsFencedByFencingToken(t *testing.T, e *Env) {
	b := e.setup(t)
	s := b.store(nil, nil)
	b.putEndpoint(s, "billing", "t")
	ev := b.publishOne(s, "evt-1", "t")

	if a, err := s.Claim(b.ctx, "worker-a", []string{"other"}); err != nil || a != nil {
		t.Fatalf("Claim of another group only = %+v, %v; want nil, nil", a, err)
	}
	if a, err := s.ClaimBatch(b.ctx, "worker-a", []string{"other", "more"}, 4); err != nil || len(a) != 0 {
		t.Fatalf("ClaimBatch of other groups only = %+v, %v; want none", a, err)
	}
	a := b.claim(s, "worker-a")
	if a.FencingToken == "" || a.LeaseOwner != "worker-a" || a.Number != 1 || a.EventID != ev.ID ||
		a.DeliveryID != b.deliveryID("billing", ev.ID) || a.Status != pulsetype.StatusPending {
		t.Fatalf("claimed attempt = %+v", a)
	}
	if want := b.clock.Now().Add(30 * time.Second); a.LeasedUntil == nil || !a.LeasedUntil.Equal(want) {
		t.Errorf("lockedUntil = %v, want now + lease timeout = %v", a.LeasedUntil, want)
	}
	if other, err := s.Claim(b.ctx, "worker-b", nil); err != nil || other != nil {
		t.Fatalf("second Claim of a leased attempt = %+v, %v; want nil, nil", other, err)
	}

	unknown := pulsetype.LeaseKey{AttemptID: a.ID, Token: "not-a-token"}
	lost, err := s.Renew(b.ctx, []pulsetype.LeaseKey{a.Key(), unknown})
	if err != nil || !slices.Equal(lost, []pulsetype.LeaseKey{unknown}) {
		t.Errorf("Renew(held, unknown) = %v, %v; want [unknown], nil", lost, err)
	}
	// A renewal extends the lease by the lease timeout from its clock reading; one sent earlier that lands
	// after a later one (the heartbeat does not wait for one before it sends the next) never shortens it.
	later := b.clock.Advance(10 * time.Second)
	if lost, err := s.Renew(b.ctx, []pulsetype.LeaseKey{a.Key()}); err != nil || len(lost) != 0 {
		t.Fatalf("Renew(held) = %v, %v; want nil, nil", lost, err)
	}
	b.clock.Advance(-5 * time.Second) // the earlier renewal's reading
	if lost, err := s.Renew(b.ctx, []pulsetype.LeaseKey{a.Key()}); err != nil || len(lost) != 0 {
		t.Fatalf("Renew(held) landing late = %v, %v; want nil, nil", lost, err)
	}
	b.clock.Advance(5 * time.Second)
	if d := b.historyDoc(a.ID); d.LeasedUntil == nil || !d.LeasedUntil.Equal(later.Add(30*time.Second)) {
		t.Errorf("lockedUntil after a late renewal = %v, want the later renewal's %v", d.LeasedUntil, later.Add(30*time.Second))
	}

	wrong := *a
	wrong.FencingToken = "0190d1f4-0000-7000-8000-000000000000"
	result := pulsetype.AttemptResult{Status: pulsetype.StatusSuccess, HTTPStatus: 200, Duration: 15 * time.Millisecond}
	if err := s.FinishAttempt(b.ctx, &wrong, result); !errors.Is(err, pulsetype.ErrLeaseLost) {
		t.Fatalf("FinishAttempt with a wrong token = %v, want ErrLeaseLost", err)
	}
	if d := b.historyDoc(a.ID); d.Status != pulsetype.StatusPending || d.HTTPStatus != 0 {
		t.Fatalf("a fenced-out FinishAttempt wrote: status %s httpStatus %d", d.Status, d.HTTPStatus)
	}
	if err := s.FinishAttempt(b.ctx, a, result); err != nil {
		t.Fatalf("FinishAttempt with the right token = %v, want nil", err)
	}
	if d := b.historyDoc(a.ID); d.Status != pulsetype.StatusSuccess || d.HTTPStatus != 200 || d.DurationMs == nil || *d.DurationMs != 15 || d.EndedAt == nil {
		t.Errorf("finished attempt = %+v", d)
	}
	if err := s.FinishAttempt(b.ctx, a, result); !errors.Is(err, pulsetype.ErrLeaseLost) {
		t.Errorf("FinishAttempt twice = %v, want ErrLeaseLost", err)
	}
	if next, err := s.Claim(b.ctx, "worker-a", nil); err != nil || next != nil {
		t.Errorf("Claim after the only attempt finished = %+v, %v; want nil, nil", next, err)
	}
	lost, err = s.Renew(b.ctx, []pulsetype.LeaseKey{a.Key()})
	if err != nil || !slices.Equal(lost, []pulsetype.LeaseKey{a.Key()}) {
		t.Errorf("Renew of a finished attempt's token = %v, %v; want it lost", lost, err)
	}
}

// ClaimAttempts leases with one token what it wins and reads back exactly its own share when another replica
// leased some first; racing replicas never lease one attempt twice.
func testClaimAttemptsLeasesEachAttemptOnce(t *testing.T, e *Env) {
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
	if want := IDs(created[4:]); !slices.Equal(IDs(rest), want) {
		t.Fatalf("second ClaimAttempts leased %v, want the 8 free ones %v", IDs(rest), want)
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
	stores := make([]Store, n)
	for i := range stores {
		stores[i] = b.store(b.connect(), nil)
	}
	Concurrently(n, func(i int) { won[i], errs[i] = stores[i].ClaimAttempts(b.ctx, "racer", fresh) })
	var all []*pulsetype.Attempt
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("racer %d: %v", i, errs[i])
		}
		all = append(all, won[i]...)
	}
	if !slices.Equal(IDs(all), IDs(fresh)) {
		t.Errorf("racers leased %v, want each of %v exactly once", IDs(all), IDs(fresh))
	}
}

// The queue and the outbox hold pending work only: queued when created, gone once delivered; the history,
// the deliveries and the events keep everything.
func testQueueHoldsPendingWorkOnly(t *testing.T, e *Env) {
	b := e.setup(t)
	s := b.store(nil, nil)
	b.putEndpoint(s, "ledger", "t")
	b.putEndpoint(s, "mailer", "t")
	created := b.fanOutN(s, 3, "t")
	if len(created) != 6 || b.count("queue", bson.M{}) != 6 || b.count("outbox", bson.M{}) != 3 {
		t.Fatalf("after fan-out: %d attempts, %d queued, %d in the outbox; want 6, 6, 3", len(created), b.count("queue", bson.M{}), b.count("outbox", bson.M{}))
	}
	leased, err := s.ClaimAttempts(b.ctx, "w", created)
	if err != nil || len(leased) != 6 {
		t.Fatalf("ClaimAttempts = %d, %v", len(leased), err)
	}
	if n := countWhere(b, "queue", func(q storedQueueEntry) bool { return q.LeasedUntil != nil }); n != 6 {
		t.Errorf("%d queue documents carry the lease, want 6", n)
	}
	cs := make([]pulsetype.Completion, len(leased))
	for i, a := range leased {
		cs[i] = pulsetype.Completion{Attempt: a, Result: pulsetype.AttemptResult{Status: pulsetype.StatusSuccess, HTTPStatus: 200},
			Next: pulsetype.NextStep{EndStatus: pulsetype.StatusSuccess}}
		if i%3 == 0 {
			cs[i] = pulsetype.Completion{Attempt: a, Result: pulsetype.AttemptResult{Status: pulsetype.StatusError, HTTPStatus: 500,
				Error: &pulsetype.ErrorInfo{Code: pulsetype.CodeHandlerError, Message: "HTTP 500"}}, Next: pulsetype.NextStep{Retry: true, Delay: time.Hour}}
		}
	}
	if _, err := s.FinishAttempts(b.ctx, cs); err != nil {
		t.Fatal(err)
	}
	if err := s.FollowUps(b.ctx, cs); err != nil {
		t.Fatal(err)
	}
	if err := s.ClearFanOut(b.ctx, []string{"evt-t-0", "evt-t-1", "evt-t-2"}); err != nil {
		t.Fatal(err)
	}
	if q, o := b.count("queue", bson.M{}), b.count("outbox", bson.M{}); q != 2 || o != 0 {
		t.Errorf("after 4 successes and 2 retries: %d queued, %d in the outbox; want the 2 retries, 0", q, o)
	}
	if n := countWhere(b, "queue", func(q storedQueueEntry) bool { return q.Attempt == 2 && q.LeasedUntil == nil }); n != 2 {
		t.Errorf("%d queued second attempts without a lease, want 2", n)
	}
	if h, d := b.count("history", bson.M{}), b.count("deliveries", bson.M{"status": "success"}); h != 8 || d != 4 {
		t.Errorf("history holds %d attempts and %d successful deliveries, want 8 and 4", h, d)
	}
}
