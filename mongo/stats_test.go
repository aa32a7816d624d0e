package mongo

import (
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// stats returns the figures of groups computed both ways, with indexed queries per group and by scanning for
// all groups, failing the test unless both agree, and logs how long each took.
func (b *bundle) stats(s *Store, groups ...string) []*pulsetype.GroupStats {
	b.t.Helper()
	now, since := s.statsWindow()
	start := time.Now()
	var indexed []*pulsetype.GroupStats
	for _, g := range groups {
		st, err := s.groupStats(b.ctx, g, now, since)
		if err != nil {
			b.t.Fatalf("groupStats(%s): %v", g, err)
		}
		indexed = append(indexed, st)
	}
	tookIndexed := time.Since(start)
	start = time.Now()
	scanned, err := s.statsByScan(b.ctx, groups, now, since)
	if err != nil {
		b.t.Fatalf("statsByScan: %v", err)
	}
	b.t.Logf("stats of %d groups: %s with indexed queries, %s by scanning", len(groups), tookIndexed.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	for i := range indexed {
		if !reflect.DeepEqual(indexed[i], scanned[i]) {
			b.t.Errorf("stats of %s: indexed %+v, scanned %+v", groups[i], *indexed[i], *scanned[i])
		}
	}
	return indexed
}

// GroupStats counts a group's pending deliveries and its attempts ended in the last hour (not earlier ones,
// not those ended without a POST for an Ended code), takes the latency median over the window's POSTs,
// and never counts another group's work; a history retention shorter than the hour shortens the window.
func testGroupStatsCountsTheLastHour(t *testing.T, e *env) {
	b := e.setup(t)
	s := b.store(nil, nil)
	b.putEndpoint(s, "billing", "t")
	b.putEndpoint(s, "mailer", "u")
	b.putEndpoint(s, "refused", "r")
	t0 := b.clock.Now()
	first := b.fanOutN(s, 6, "t")
	b.fanOutN(s, 2, "u")
	refusedAttempts := b.fanOutN(s, 2, "r")
	leased, err := s.ClaimAttempts(b.ctx, "w", first)
	if err != nil || len(leased) != 6 {
		t.Fatalf("ClaimAttempts = %d attempts, %v; want 6", len(leased), err)
	}
	finish := func(a *pulsetype.Attempt, status pulsetype.Status, ms int, e *pulsetype.ErrorInfo) {
		t.Helper()
		res := pulsetype.AttemptResult{Status: status, Duration: time.Duration(ms) * time.Millisecond, Error: e, Terminal: e != nil}
		next := pulsetype.NextStep{EndStatus: status, EndError: e}
		switch {
		case status == pulsetype.StatusSuccess:
			res.HTTPStatus = 200
		case e.Message == "HTTP 500":
			res.HTTPStatus = 500
		}
		cs := []pulsetype.Completion{{Attempt: a, Result: res, Next: next}}
		if _, err := s.FinishAttempts(b.ctx, cs); err != nil {
			t.Fatal(err)
		}
		if err := s.FollowUps(b.ctx, cs); err != nil {
			t.Fatal(err)
		}
	}
	finish(leased[0], pulsetype.StatusSuccess, 10, nil) // two hours before: outside the window
	b.clock.Advance(2 * time.Hour)
	finish(leased[1], pulsetype.StatusSuccess, 30, nil)
	finish(leased[2], pulsetype.StatusSuccess, 20, nil)
	finish(leased[3], pulsetype.StatusError, 50, &pulsetype.ErrorInfo{Code: pulsetype.CodeHandlerError, Message: "HTTP 500"})
	finish(leased[4], pulsetype.StatusError, 0, &pulsetype.ErrorInfo{Code: pulsetype.CodeEventExpired, Message: "gone"})
	refused, err := s.ClaimAttempts(b.ctx, "w", refusedAttempts)
	if err != nil || len(refused) != 2 {
		t.Fatalf("ClaimAttempts = %d attempts, %v; want 2", len(refused), err)
	}
	for _, a := range refused { // connection refused: a POST of 0 ms without an HTTP status
		finish(a, pulsetype.StatusError, 0, &pulsetype.ErrorInfo{Code: pulsetype.CodeHandlerError, Message: "dial tcp 127.0.0.1:9: connect: connection refused"})
	}
	b.clock.Advance(time.Minute) // leased[5] stays pending

	all := b.stats(s, "billing", "mailer", "nobody", "refused")
	st, mailer, none, ref := all[0], all[1], all[2], all[3]
	// Every attempt of refused was refused: two failures, and no latency (no "p50 0 ms").
	if ref.Failed1h != 2 || ref.LatencyP50Ms != nil || ref.LatencySample != 0 {
		t.Errorf("refused: failed %d, p50 %v over %d; want 2 failures and no latency", ref.Failed1h, ref.LatencyP50Ms, ref.LatencySample)
	}
	if st.Pending != 1 || st.Succeeded1h != 2 || st.Failed1h != 1 {
		t.Errorf("billing: pending %d, succeeded %d, failed %d; want 1, 2, 1", st.Pending, st.Succeeded1h, st.Failed1h)
	}
	if st.OldestPendingAt == nil || !st.OldestPendingAt.Equal(t0) || st.OldestPendingAgeMs != (2*time.Hour+time.Minute).Milliseconds() {
		t.Errorf("billing: oldest pending at %v, age %d ms; want %v, %d ms", st.OldestPendingAt, st.OldestPendingAgeMs, t0, (2*time.Hour + time.Minute).Milliseconds())
	}
	// The window's POSTs took 30, 20 and 50 ms; the event_expired attempt (0 ms, no POST) is left out.
	if st.LatencyP50Ms == nil || *st.LatencyP50Ms != 30 || st.LatencySample != 3 {
		t.Errorf("billing: p50 %v over %d attempts, want 30 ms over 3", st.LatencyP50Ms, st.LatencySample)
	}

	if mailer.Pending != 2 || mailer.Succeeded1h != 0 || mailer.Failed1h != 0 || mailer.LatencyP50Ms != nil {
		t.Errorf("mailer = %+v, want 2 pending and nothing ended", mailer)
	}
	if none.Pending != 0 || none.OldestPendingAt != nil || none.Succeeded1h != 0 || none.LatencyP50Ms != nil {
		t.Errorf("a group without deliveries = %+v, want zeros", none)
	}

	short := b.store(nil, func(o *Options) { o.HistoryRetention = 30 * time.Second })
	st = b.stats(short, "billing")[0]
	if st.Succeeded1h != 0 || st.Failed1h != 0 || st.LatencyP50Ms != nil || st.Pending != 1 {
		t.Errorf("with a 30 s history retention, attempts ended a minute ago count: %+v", st)
	}
}

func TestMedian(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		in   []int64
		want int64
	}{{[]int64{7}, 7}, {[]int64{3, 1}, 1}, {[]int64{5, 1, 3}, 3}, {[]int64{4, 1, 3, 2}, 2}} {
		if got := median(tt.in); got != tt.want {
			t.Errorf("median(%v) = %d, want %d", tt.in, got, tt.want)
		}
	}
}

// The console's reads stay cheap with 10,000 deliveries: two consumer groups of 5,000, created one every
// 1.44 s over the last two hours, every fifth still pending, every fourth of the others failed (HTTP 500),
// the rest succeeded, each ended attempt 40 ms long (bulk-inserted as the store writes them). GroupStats
// answers the exact figures and the first pages of ListDeliveries (all, failing, failing of one group,
// pending of one group, by topic and status) and a second page hold 50 matching deliveries each. The
// timings are logged, not asserted.
func testConsoleReadsWith10000Deliveries(t *testing.T, e *env) {
	if testing.Short() {
		t.Skip("writes 10,000 deliveries; skipped with -short")
	}
	b := e.setup(t)
	s := b.store(nil, nil)
	now := b.clock.Now()
	groups := []string{"ledger", "mailer"}
	const perGroup = 5000
	step := 2 * time.Hour / perGroup
	type want struct{ pending, succeeded, failed int64 }
	expect := map[string]*want{}
	var deliveries, attempts []any
	for _, g := range groups {
		b.putEndpoint(s, g, "orders")
		w := &want{}
		expect[g] = w
		for i := range perGroup {
			created := now.Add(-2*time.Hour + time.Duration(i)*step)
			evID := fmt.Sprintf("ev-%05d", i)
			d := &deliveryDoc{ID: DeliveryID(g, evID), EventID: evID, ConsumerGroup: g, Topic: "orders",
				EventCreatedAt: created, Status: pulsetype.StatusPending, CreatedAt: created, UpdatedAt: created}
			a := newAttemptDoc(d.delivery().Ref(), 1, created, created)
			if i%5 != 4 {
				ended := created.Add(40 * time.Millisecond)
				a.StartedAt, a.EndedAt, a.DurationMs, a.Status, a.HTTPStatus = &created, &ended, new(int64(40)), pulsetype.StatusSuccess, 200
				if i%4 == 3 {
					a.Status, a.HTTPStatus = pulsetype.StatusError, 500
					a.Error = &pulsetype.ErrorInfo{Code: pulsetype.CodeHandlerError, Message: "HTTP 500"}
				}
				d.Status, d.EndedAt, d.FinalAttempt, d.Error = a.Status, &ended, 1, a.Error
				switch inWindow := ended.After(now.Add(-time.Hour)); {
				case inWindow && a.Status == pulsetype.StatusSuccess:
					w.succeeded++
				case inWindow:
					w.failed++
				}
			} else {
				w.pending++
			}
			deliveries, attempts = append(deliveries, d), append(attempts, a)
		}
	}
	load := time.Now()
	for _, c := range []struct {
		coll string
		docs []any
	}{{"deliveries", deliveries}, {"history", attempts}} {
		for i := 0; i < len(c.docs); i += 1000 {
			if _, err := b.coll(c.coll).InsertMany(b.ctx, c.docs[i:i+1000]); err != nil {
				t.Fatalf("insert %s: %v", c.coll, err)
			}
		}
	}
	t.Logf("inserted %d deliveries and their attempts in %s", len(deliveries), time.Since(load).Round(time.Millisecond))

	start := time.Now()
	if _, err := s.Stats(b.ctx, groups); err != nil {
		t.Fatal(err)
	}
	t.Logf("Stats of %d groups (ScansFilters %v): %s", len(groups), s.Capabilities().ScansFilters, time.Since(start).Round(time.Millisecond))
	for i, st := range b.stats(s, groups...) {
		g := groups[i]
		w := expect[g]
		if st.Pending != w.pending || st.Succeeded1h != w.succeeded || st.Failed1h != w.failed {
			t.Errorf("%s: pending %d, succeeded %d, failed %d; want %d, %d, %d", g, st.Pending, st.Succeeded1h, st.Failed1h, w.pending, w.succeeded, w.failed)
		}
		oldest := now.Add(-2*time.Hour + 4*step)
		if st.OldestPendingAt == nil || !st.OldestPendingAt.Equal(oldest) {
			t.Errorf("%s: oldest pending at %v, want %v", g, st.OldestPendingAt, oldest)
		}
		if st.LatencyP50Ms == nil || *st.LatencyP50Ms != 40 || st.LatencySample != pulsetype.LatencySampleSize {
			t.Errorf("%s: p50 %v over %d, want 40 ms over %d", g, st.LatencyP50Ms, st.LatencySample, pulsetype.LatencySampleSize)
		}
	}

	var next string
	for _, f := range []pulsetype.DeliveryFilter{
		{}, {Status: pulsetype.StatusError}, {ConsumerGroup: "mailer", Status: pulsetype.StatusError},
		{ConsumerGroup: "ledger", Status: pulsetype.StatusPending}, {Topic: "orders", Status: pulsetype.StatusSuccess},
		{ConsumerGroup: "mailer"},
	} {
		f.Limit = 50
		start := time.Now()
		page, cursor, err := s.ListDeliveries(b.ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("ListDeliveries(%+v) first page: %s", f, time.Since(start).Round(time.Millisecond))
		if len(page) != 50 || cursor == "" {
			t.Fatalf("ListDeliveries(%+v) = %d deliveries, next %q; want 50 and a next page", f, len(page), cursor)
		}
		for _, d := range page {
			if (f.ConsumerGroup != "" && d.ConsumerGroup != f.ConsumerGroup) || (f.Status != "" && d.Status != f.Status) {
				t.Fatalf("ListDeliveries(%+v) answered %s of %s (%s)", f, d.ID, d.ConsumerGroup, d.Status)
			}
		}
		if f.ConsumerGroup == "mailer" && f.Status == pulsetype.StatusError {
			next = cursor
		}
	}
	start = time.Now()
	page, _, err := s.ListDeliveries(b.ctx, pulsetype.DeliveryFilter{ConsumerGroup: "mailer", Status: pulsetype.StatusError, After: next, Limit: 50})
	t.Logf("ListDeliveries second page of mailer's failing deliveries: %s", time.Since(start).Round(time.Millisecond))
	if err != nil || len(page) != 50 {
		t.Errorf("second page = %d deliveries, %v; want 50", len(page), err)
	}
}

// The indexed queries leave out exactly the codes pulsetype.ErrorCode.Ended reports, as the scan does.
func TestEndedCodesAreEnded(t *testing.T) {
	t.Parallel()
	for _, code := range []pulsetype.ErrorCode{pulsetype.CodeHandlerError, pulsetype.CodeWorkerLost, pulsetype.CodeEventExpired,
		pulsetype.CodeEndpointDeleted, pulsetype.CodeUnsubscribed, pulsetype.CodeCancelled} {
		if got := slices.Contains(endedCodes, any(code)); got != code.Ended() {
			t.Errorf("%s in endedCodes = %v, ErrorCode.Ended = %v", code, got, code.Ended())
		}
	}
}
