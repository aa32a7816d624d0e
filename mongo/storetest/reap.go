package storetest

import (
	"errors"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// reapCases are the cases of reap.
var reapCases = []Case{
	{Name: "ReapOneReapsExpiredLease", Run: testReapOneReapsExpiredLease},
	{Name: "ReapOneSparesRenewedLease", Run: testReapOneSparesRenewedLease, Race: true},
	{Name: "LeaseWithoutItsQueueCopyIsReaped", Run: testLeaseWithoutItsQueueCopyIsReaped},
}

func testReapOneReapsExpiredLease(t *testing.T, e *Env) {
	b := e.setup(t)
	s := b.store(nil, func(o *Options) { o.LeaseTimeout = 100 * time.Millisecond; o.Now = nil })
	b.putEndpoint(s, "billing", "t")
	b.publishOne(s, "evt-1", "t")
	a := b.claim(s, "worker-a")

	var reaped *pulsetype.Attempt
	b.eventually("ReapOne reaps a 100ms lease", func() bool {
		r, err := s.ReapOne(b.ctx)
		returnedAt := time.Now()
		if err != nil {
			t.Fatalf("ReapOne: %v", err)
		}
		if r != nil && returnedAt.Before(*a.LeasedUntil) {
			t.Fatalf("ReapOne returned at %v having reaped a lease valid until %v", returnedAt, a.LeasedUntil)
		}
		reaped = r
		return reaped != nil
	})
	if reaped.ID != a.ID || reaped.Status != pulsetype.StatusError || reaped.Error == nil ||
		reaped.Error.Code != pulsetype.CodeWorkerLost || reaped.LeaseOwner != "worker-a" {
		t.Errorf("reaped attempt = %+v (error %+v)", reaped, reaped.Error)
	}
	if d := b.historyDoc(a.ID); d.Status != pulsetype.StatusError || d.Error == nil || d.Error.Code != pulsetype.CodeWorkerLost {
		t.Errorf("stored reaped attempt = %+v", d)
	}
	if err := s.FinishAttempt(b.ctx, a, pulsetype.AttemptResult{Status: pulsetype.StatusSuccess}); !errors.Is(err, pulsetype.ErrLeaseLost) {
		t.Errorf("FinishAttempt after the reap = %v, want ErrLeaseLost", err)
	}
	if lost, err := s.Renew(b.ctx, []pulsetype.LeaseKey{a.Key()}); err != nil || len(lost) != 1 {
		t.Errorf("Renew after the reap = %v, %v; want the token lost", lost, err)
	}
	if r, err := s.ReapOne(b.ctx); err != nil || r != nil {
		t.Errorf("second ReapOne = %+v, %v; want nil, nil", r, err)
	}
}

func testReapOneSparesRenewedLease(t *testing.T, e *Env) {
	b := e.setup(t)
	s := b.store(nil, func(o *Options) { o.LeaseTimeout = 100 * time.Millisecond })
	b.putEndpoint(s, "billing", "t")
	b.publishOne(s, "evt-1", "t")
	a := b.claim(s, "worker-a")

	b.clock.Advance(80 * time.Millisecond)
	if lost, err := s.Renew(b.ctx, []pulsetype.LeaseKey{a.Key()}); err != nil || len(lost) != 0 {
		t.Fatalf("Renew of a held lease = %v, %v; want none lost", lost, err)
	}
	b.clock.Advance(70 * time.Millisecond) // 150ms after the claim: the first lease would have expired
	if r, err := s.ReapOne(b.ctx); err != nil || r != nil {
		t.Fatalf("ReapOne of a renewed lease = %+v, %v; want nil, nil", r, err)
	}
	if d := b.historyDoc(a.ID); d.Status != pulsetype.StatusPending || d.FencingToken != a.FencingToken {
		t.Fatalf("renewed attempt changed: %+v", d)
	}
	expiredAt := b.clock.Advance(40 * time.Millisecond) // 190ms: the renewed lease (until 180ms) has expired too

	// Each replica's clock reads a little differently, so that each would write different values.
	const n = 6
	stores := make([]Store, n)
	for i := range stores {
		now := expiredAt.Add(time.Duration(i) * time.Millisecond)
		stores[i] = b.store(b.connect(), func(o *Options) {
			o.LeaseTimeout, o.Now = 100*time.Millisecond, func() time.Time { return now }
		})
	}
	reaped := make([]*pulsetype.Attempt, n)
	errs := make([]error, n)
	Concurrently(n, func(i int) { reaped[i], errs[i] = stores[i].ReapOne(b.ctx) })
	winners := 0
	for i := range n {
		if errs[i] != nil {
			t.Errorf("ReapOne #%d: %v", i, errs[i])
		}
		if reaped[i] != nil {
			winners++
			if reaped[i].ID != a.ID {
				t.Errorf("ReapOne #%d reaped %s, want %s", i, reaped[i].ID, a.ID)
			}
		}
	}
	if winners != 1 {
		t.Errorf("%d concurrent ReapOne calls reaped the attempt, want exactly 1", winners)
	}
}

// A claimer that dies between leasing an attempt and copying the lease to the queue leaves a queue document
// that says "claimable" for an attempt that is leased. Claims of the queue skip nothing then, but the reaper
// reads the queue's copies: the look at an ordered line's head, and the repair scan, copy the lease, so the
// reaper ends the attempt as worker_lost once the lease expires and its line moves on.
func testLeaseWithoutItsQueueCopyIsReaped(t *testing.T, e *Env) {
	b := e.setup(t)
	s := b.store(nil, func(o *Options) { o.LeaseTimeout = time.Second })
	ordered := b.endpoint("o", "t")
	ordered.Ordered = true
	if _, _, err := s.PutEndpoint(b.ctx, ordered); err != nil {
		t.Fatalf("PutEndpoint: %v", err)
	}
	b.putEndpoint(s, "u", "t")
	created := b.fanOutN(s, 1, "t")
	if len(created) != 2 {
		t.Fatalf("fan-out created %d attempts, want 2 (one per group)", len(created))
	}
	b.clock.Advance(time.Minute) // past the ordered line's settle window
	// Leased in the history by a claimer that died before copying the lease to the queue.
	until := b.clock.Now().Add(time.Second)
	if _, err := b.coll("history").UpdateMany(b.ctx, bson.M{}, bson.M{"$set": storedLease{LeaseOwner: "dead", FencingToken: "dead",
		LeasedAt: b.clock.Now(), LeasedUntil: until, StartedAt: b.clock.Now()}}); err != nil {
		t.Fatal(err)
	}
	byGroup := map[string]*pulsetype.Attempt{}
	for _, a := range created {
		byGroup[a.ConsumerGroup] = a
	}
	reap := func() map[string]bool {
		t.Helper()
		reaped := map[string]bool{}
		for range 2 {
			a, err := s.ReapOne(b.ctx)
			if err != nil {
				t.Fatalf("ReapOne: %v", err)
			}
			if a != nil {
				reaped[a.ConsumerGroup] = true
			}
		}
		return reaped
	}
	// The ordered line's head: its look at the line copies the lease.
	if got, err := s.ClaimHeads(b.ctx, pulsetype.ClaimHeadsParams{Owner: "w", ConsumerGroup: "o", Topic: "t", Limit: 1}); err != nil || len(got.Attempts) > 0 {
		t.Fatalf("ClaimHeads = %v, %v; want nothing (the head is leased)", got.Attempts, err)
	}
	b.clock.Advance(2 * time.Second) // the dead claimer's lease expires
	if reaped := reap(); !reaped["o"] || reaped["u"] {
		t.Fatalf("after the look at the ordered line, the reaper ended the leases of %v, want o's alone", reaped)
	}
	// The unordered group's attempt: the repair scan finds the lease without its copy, and copies it.
	page, err := s.QueuedDeliveries(b.ctx, "", 100)
	if err != nil {
		t.Fatalf("QueuedDeliveries: %v", err)
	}
	if reaped := reap(); reaped["u"] {
		t.Fatalf("after the repair scan's read alone, the reaper ended the leases of %v, want none of u's: a read repairs nothing", reaped)
	}
	if err := s.RepairQueue(b.ctx, page.Repairs); err != nil {
		t.Fatalf("RepairQueue: %v", err)
	}
	if reaped := reap(); !reaped["u"] {
		t.Fatalf("after the repair scan, the reaper ended the leases of %v, want u's", reaped)
	}
	for g, a := range byGroup {
		if h := b.historyDoc(a.ID); h.Status != pulsetype.StatusError || h.Error == nil || h.Error.Code != pulsetype.CodeWorkerLost {
			t.Errorf("group %s's attempt is %s %+v after the reaper, want error worker_lost", g, h.Status, h.Error)
		}
	}
}
