package mongo

import (
	"slices"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// Activity counts a group's attempts ended in each minute of the last hour (not earlier ones, not those
// ended for an Ended code, not another group's), on whole UTC minutes with the current minute last, and
// its pending deliveries now.
func testActivityCountsMinutes(t *testing.T, e *env) {
	b := e.setup(t)
	s := b.store(nil, nil)
	b.putEndpoint(s, "billing", "t")
	b.putEndpoint(s, "mailer", "u")
	t0 := b.clock.Now()
	leased, err := s.ClaimAttempts(b.ctx, "w", append(b.fanOutN(s, 6, "t"), b.fanOutN(s, 1, "u")...))
	if err != nil || len(leased) != 7 {
		t.Fatalf("ClaimAttempts = %d attempts, %v; want 7", len(leased), err)
	}
	finish := func(a *pulsetype.Attempt, status pulsetype.Status, code pulsetype.ErrorCode) {
		t.Helper()
		res := pulsetype.AttemptResult{Status: status, HTTPStatus: 200, Duration: time.Millisecond}
		next := pulsetype.NextStep{EndStatus: status}
		if code != "" {
			res.HTTPStatus, res.Error, res.Terminal = 500, &pulsetype.ErrorInfo{Code: code, Message: "HTTP 500"}, true
			next.EndError = res.Error
		}
		cs := []pulsetype.Completion{{Attempt: a, Result: res, Next: next}}
		if _, err := s.FinishAttempts(b.ctx, cs); err != nil {
			t.Fatal(err)
		}
		if err := s.FollowUps(b.ctx, cs); err != nil {
			t.Fatal(err)
		}
	}
	var mailer *pulsetype.Attempt
	var mine []*pulsetype.Attempt
	for _, a := range leased {
		if a.ConsumerGroup == "mailer" {
			mailer = a
		} else {
			mine = append(mine, a)
		}
	}
	finish(mine[0], pulsetype.StatusSuccess, "") // two hours before: outside the window
	earlier := b.clock.Advance(2 * time.Hour)
	finish(mine[1], pulsetype.StatusSuccess, "")
	finish(mine[2], pulsetype.StatusError, pulsetype.CodeHandlerError)
	now := b.clock.Advance(3 * time.Minute)
	finish(mine[3], pulsetype.StatusSuccess, "")
	finish(mine[4], pulsetype.StatusError, pulsetype.CodeEventExpired) // no failure of the receiver
	finish(mailer, pulsetype.StatusError, pulsetype.CodeHandlerError)  // another group's
	// mine[5] stays pending.

	got, err := s.Activity(b.ctx, "billing")
	if err != nil {
		t.Fatal(err)
	}
	from := now.UTC().Truncate(time.Minute).Add(-59 * time.Minute)
	if !got.From.Equal(from) || !got.To.Equal(now) || len(got.Buckets) != pulsetype.ActivityBuckets {
		t.Fatalf("window from %v to %v with %d buckets, want from %v to %v with %d", got.From, got.To, len(got.Buckets), from, now, pulsetype.ActivityBuckets)
	}
	want := make([]pulsetype.ActivityCount, pulsetype.ActivityBuckets)
	want[int(earlier.Sub(from)/time.Minute)] = pulsetype.ActivityCount{Succeeded: 1, Failed: 1}
	want[pulsetype.ActivityBuckets-1].Succeeded++
	for i := range want {
		if got.Buckets[i] != want[i] {
			t.Errorf("bucket %d (%v): %+v, want %+v", i, from.Add(time.Duration(i)*time.Minute), got.Buckets[i], want[i])
		}
	}
	if got.Pending != 1 || got.OldestPendingAt == nil || !got.OldestPendingAt.Equal(t0) || got.TruncatedBefore != nil {
		t.Errorf("pending %d, oldest %v, truncated %v; want 1 pending since %v, not truncated", got.Pending, got.OldestPendingAt, got.TruncatedBefore, t0)
	}
	// ActivityAll answers the same for every registered group, in group order, from one read of the hour.
	all, err := s.ActivityAll(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 2 || all[0].ConsumerGroup != "billing" || all[1].ConsumerGroup != "mailer" {
		t.Fatalf("ActivityAll = %d groups (%+v), want billing and mailer", len(all), all)
	}
	for _, a := range all {
		one, err := s.Activity(b.ctx, a.ConsumerGroup)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(a.Buckets, one.Buckets) || a.Pending != one.Pending || !a.From.Equal(one.From) ||
			(a.OldestPendingAt == nil) != (one.OldestPendingAt == nil) || a.OldestPendingAt != nil && !a.OldestPendingAt.Equal(*one.OldestPendingAt) {
			t.Errorf("ActivityAll's %s = %+v, Activity's = %+v", a.ConsumerGroup, a, one)
		}
	}
	if all[1].Buckets[pulsetype.ActivityBuckets-1].Failed != 1 {
		t.Errorf("ActivityAll's mailer last minute = %+v, want its one failure", all[1].Buckets[pulsetype.ActivityBuckets-1])
	}
	none, err := s.Activity(b.ctx, "nobody")
	if err != nil || none.Pending != 0 || none.OldestPendingAt != nil || len(none.Buckets) != pulsetype.ActivityBuckets {
		t.Fatalf("a group without work = %+v, %v; want 60 empty buckets", none, err)
	}
	for i, c := range none.Buckets {
		if c != (pulsetype.ActivityCount{}) {
			t.Errorf("a group without work: bucket %d = %+v", i, c)
		}
	}
}

// LineHead names the oldest pending delivery of an ordered line, and another once it ended; it removes
// nothing from the queue.
func testLineHeadReadsOnly(t *testing.T, e *env) {
	b := e.setup(t)
	s := b.store(nil, nil)
	b.putOrdered(s, "o", "t")
	first := b.fanOutN(s, 2, "t")
	line := pulsetype.Line{ConsumerGroup: "o", Topic: "t"}
	head, err := s.LineHead(b.ctx, line)
	if err != nil || head != first[0].DeliveryID {
		t.Fatalf("LineHead = %q, %v; want %s (the first event's)", head, err, first[0].DeliveryID)
	}
	queued := b.count("queue", bson.M{})
	b.endDelivery(s, pulsetype.EndDeliveryParams{DeliveryID: first[0].DeliveryID, Status: pulsetype.StatusCancelled, FinalAttempt: 1,
		Error: &pulsetype.ErrorInfo{Code: pulsetype.CodeCancelled, Message: "cancelled"}})
	if head, err = s.LineHead(b.ctx, line); err != nil || head != first[1].DeliveryID {
		t.Fatalf("after the head ended, LineHead = %q, %v; want %s", head, err, first[1].DeliveryID)
	}
	if n := b.count("queue", bson.M{}); n > queued {
		t.Errorf("queue documents %d after LineHead, were %d", n, queued)
	}
	if head, err := s.LineHead(b.ctx, pulsetype.Line{ConsumerGroup: "o", Topic: "other"}); err != nil || head != "" {
		t.Errorf("LineHead of an empty line = %q, %v; want none", head, err)
	}
}
