package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// reapCases are the cases of reap.
var reapCases = []Case{
	{Name: "ReapOneReapsExpiredLease", Run: testReapOneReapsExpiredLease},
	{Name: "ReapOneSparesRenewedLease", Run: testReapOneSparesRenewedLease, Race: true},
}

func testReapOneReapsExpiredLease(t *testing.T, e *Env) {
	b := e.setup(t)
	s := b.store(nil, func(o *Options) { o.LeaseTimeout = 100 * time.Millisecond; o.Now = nil })
	b.putEndpoint(s, "billing", "t")
	b.publishOne(s, "evt-1", "t")
	a := b.claim(s, "worker-a")

	var reaped *pulsetype.Attempt
	b.eventually("ReapOne reaps a 100ms lease", 10*time.Millisecond, func() bool {
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
