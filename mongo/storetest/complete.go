package storetest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// completeCases are the cases of complete.
var completeCases = []Case{
	{Name: "FinishAttemptsIsFencedPerAttempt", Run: testFinishAttemptsIsFencedPerAttempt},
	{Name: "CreateAttemptAndEndDeliveryAreExactlyOnce", Run: testCreateAttemptAndEndDeliveryAreExactlyOnce, Race: true},
	{Name: "LargeBatchesDoNotStallTheDatabase", Run: testLargeBatchesDoNotStallTheDatabase},
}

// FinishAttempts records, in one bulk write, the results whose lease is still held, and reports the ones it
// did not write (reaped, released); FollowUps then ends deliveries and creates retries exactly once.
func testFinishAttemptsIsFencedPerAttempt(t *testing.T, e *Env) {
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
	var ended storedDelivery
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
	var failedDoc storedDelivery
	if err := b.coll("deliveries").FindOne(b.ctx, bson.M{"_id": leased[2].DeliveryID}).Decode(&failedDoc); err != nil {
		t.Fatal(err)
	}
	if failedDoc.Status != pulsetype.StatusError || failedDoc.Error == nil || failedDoc.Error.Message != "410" || failedDoc.FinalAttempt != 1 {
		t.Errorf("delivery after a terminal error = %+v", failedDoc)
	}
}

func testCreateAttemptAndEndDeliveryAreExactlyOnce(t *testing.T, e *Env) {
	b := e.setup(t)
	s := b.store(nil, nil)
	b.putEndpoint(s, "billing", "t")
	ev := b.publishOne(s, "evt-1", "t")
	deliveryID := b.deliveryID("billing", ev.ID)
	first := b.claim(s, "worker-a")
	if err := s.FinishAttempt(b.ctx, first, pulsetype.AttemptResult{Status: pulsetype.StatusError, HTTPStatus: 500,
		Error: &pulsetype.ErrorInfo{Code: pulsetype.CodeHandlerError, Message: "500"}}); err != nil {
		t.Fatalf("FinishAttempt: %v", err)
	}

	for i, want := range []bool{true, false} {
		created, err := s.CreateAttempt(b.ctx, pulsetype.DeliveryRef{DeliveryID: deliveryID, EventID: ev.ID, ConsumerGroup: "billing", Topic: "t"}, 2, time.Second)
		if err != nil || created != want {
			t.Fatalf("CreateAttempt #%d of attempt 2 = %v, %v; want %v, nil", i+1, created, err, want)
		}
	}
	if got := b.count("history", bson.M{"deliveryId": deliveryID, "attempt": 2}); got != 1 {
		t.Errorf("%d documents for attempt 2, want 1", got)
	}
	if a, err := s.Claim(b.ctx, "worker-a", nil); err != nil || a != nil {
		t.Fatalf("Claim before attempt 2 is due = %+v, %v; want nil, nil", a, err)
	}
	b.clock.Advance(time.Second)
	second := b.claim(s, "worker-a")
	if second.Number != 2 || second.DeliveryID != deliveryID {
		t.Fatalf("claimed %+v, want attempt 2 of %s", second, deliveryID)
	}

	const n = 8
	created := make([]bool, n)
	errs := make([]error, n)
	Concurrently(n, func(i int) {
		created[i], errs[i] = s.CreateAttempt(b.ctx, pulsetype.DeliveryRef{DeliveryID: deliveryID, EventID: ev.ID, ConsumerGroup: "billing", Topic: "t"}, 3, 0)
	})
	winners := 0
	for i := range n {
		if errs[i] != nil {
			t.Errorf("concurrent CreateAttempt #%d: %v", i, errs[i])
		}
		if created[i] {
			winners++
		}
	}
	if winners != 1 || b.count("history", bson.M{"deliveryId": deliveryID, "attempt": 3}) != 1 {
		t.Errorf("%d concurrent CreateAttempt calls created attempt 3, want exactly 1 (and one document)", winners)
	}

	for i, want := range []bool{true, false} {
		status := []pulsetype.Status{pulsetype.StatusSuccess, pulsetype.StatusError}[i]
		var e *pulsetype.ErrorInfo
		if status == pulsetype.StatusError {
			e = &pulsetype.ErrorInfo{Code: pulsetype.CodeHandlerError, Message: "late"}
		}
		ended, err := s.EndDelivery(b.ctx, pulsetype.EndDeliveryParams{DeliveryID: deliveryID, Status: status, FinalAttempt: 2, Error: e})
		if err != nil || ended != want {
			t.Fatalf("EndDelivery #%d = %v, %v; want %v, nil", i+1, ended, err, want)
		}
	}
	d, attempts, err := s.GetDelivery(b.ctx, deliveryID)
	if err != nil {
		t.Fatalf("GetDelivery: %v", err)
	}
	if d.Status != pulsetype.StatusSuccess || d.FinalAttempt != 2 || d.EndedAt == nil || d.Error != nil {
		t.Errorf("delivery after EndDelivery twice = %+v; want success, final attempt 2, no error", d)
	}
	if len(attempts) != 3 || attempts[0].Number != 1 || attempts[1].Number != 2 || attempts[2].Number != 3 {
		t.Fatalf("attempts = %+v, want 1, 2, 3 in order", attempts)
	}
	wantStates := []pulsetype.LeaseState{"", pulsetype.LeaseActive, pulsetype.LeaseQueued}
	for i, a := range attempts {
		if a.LeaseState != wantStates[i] {
			t.Errorf("attempt %d lockState = %q, want %q", a.Number, a.LeaseState, wantStates[i])
		}
	}
	if _, _, err := s.GetDelivery(b.ctx, "no-such-delivery"); !errors.Is(err, pulsetype.ErrNotFound) {
		t.Errorf("GetDelivery(unknown) = %v, want ErrNotFound", err)
	}
}

// A batch larger than FerretDB's pool of backend connections is written in several commands instead of one
// that would wait forever for a connection it holds itself (120 statements > 100 on SQLite, 50 on PostgreSQL).
func testLargeBatchesDoNotStallTheDatabase(t *testing.T, e *Env) {
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
