package e2e

import (
	"cmp"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/pulse-sidecar/pulse/e2e/internal/harness"
	"github.com/pulse-sidecar/pulse/internal/testwait"
)

// slowReceiver answers 200 after holding each POST for hold; it records when each POST arrived.
func slowReceiver(t *testing.T, hold time.Duration) *harness.Receiver {
	r := &harness.Receiver{Statuses: []int{200}, Notify: make(chan struct{}, 1000)}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.Mu.Lock()
		r.Got = append(r.Got, harness.Received{Header: req.Header.Clone(), At: time.Now()})
		r.Mu.Unlock()
		select { // the receiver's own slowness, not a wait for an outcome
		case <-time.After(hold):
		case <-req.Context().Done():
		}
		w.WriteHeader(200)
	}))
	t.Cleanup(r.Close)
	return r
}

// Retention holds on every path: attempts made by the local fan-out keep the event in memory, yet none of
// them starts a POST after the event's expiresAt; they end event_expired instead.
func TestNoPostAfterTheEventExpired(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv(map[string]string{"PULSE_EVENT_RETENTION": "2s"}))
	rcv := slowReceiver(t, 900*time.Millisecond)
	s.RegisterEndpoint(t, "slow", map[string]any{"url": rcv.URL, "topics": []string{"t"}, "maxConcurrency": 1})
	batch := make([]map[string]any, 6)
	for i := range batch {
		batch[i] = map[string]any{"topic": "t", "data": i}
	}
	var published []struct {
		ID        string    `json:"id"`
		CreatedAt time.Time `json:"createdAt"`
	}
	if code := harness.Do(t, "POST", s.URL+"/v1/events", batch, &published); code != 202 {
		t.Fatalf("publish answered %d", code)
	}
	ds := waitGroupDone(s, t, "slow", len(published), 30*time.Second)
	expired := 0
	for _, d := range ds {
		last := d.Attempts[len(d.Attempts)-1]
		if d.Status == "error" && last.Error != nil && last.Error.Code == "event_expired" {
			expired++
		}
	}
	if expired == 0 {
		t.Fatalf("no delivery ended event_expired: the scenario did not outlast the retention: %+v", ds)
	}
	// Every POST received was of an attempt leased before its event expired: the check before the POST
	// comes after the lease, so a POST that started at or after expiresAt would show as one of an attempt
	// leased after it (as every attempt leased after the expiry would be POSTed without the check). The
	// arrival time is not compared: a busy machine delays a POST started in time by any amount.
	expiresAt := map[string]time.Time{}
	for _, e := range published {
		expiresAt[e.ID] = e.CreatedAt.Add(2 * time.Second)
	}
	wantPostedBeforeExpiry(t, rcv.Received(), ds, expiresAt)
	t.Logf("%d of %d deliveries ended event_expired, %d POSTs", expired, len(published), len(rcv.Received()))
}

// wantPostedBeforeExpiry fails t unless every POST in got is of an attempt of ds (by its Idempotency-Key and
// Pulse-Attempt headers) that was leased (startedAt) before its event's expiresAt.
func wantPostedBeforeExpiry(t *testing.T, got []harness.Received, ds []harness.DeliveryView, expiresAt map[string]time.Time) {
	t.Helper()
	started := map[string]time.Time{} // "<event id>/<attempt>": when the attempt was leased
	for _, d := range ds {
		for _, a := range d.Attempts {
			if a.StartedAt != nil {
				started[fmt.Sprintf("%s/%d", d.EventID, a.Attempt)] = *a.StartedAt
			}
		}
	}
	for _, g := range got {
		key := g.Header.Get("Idempotency-Key") + "/" + g.Header.Get("Pulse-Attempt")
		at, ok := started[key]
		switch exp := expiresAt[g.Header.Get("Idempotency-Key")]; {
		case !ok:
			t.Errorf("POST of attempt %s: no such attempt was leased", key)
		case !at.Before(exp):
			t.Errorf("POST of attempt %s, leased %s after its event expired", key, at.Sub(exp))
		}
	}
}

// waitGroupDone waits until the consumer group has n deliveries, none pending, and returns them with their
// attempts (it reads deliveries, not events: an expired event is gone from GET /v1/events).
func waitGroupDone(s *harness.Sidecar, t *testing.T, group string, n int, timeout time.Duration) []harness.DeliveryView {
	t.Helper()
	var out []harness.DeliveryView
	testwait.Eventually(t, timeout, "the deliveries of "+group+" to end", func() bool {
		var list struct{ Deliveries []harness.DeliveryView }
		if harness.Do(t, "GET", s.URL+"/v1/deliveries?limit=500&consumerGroup="+group, nil, &list) != 200 || len(list.Deliveries) != n {
			return false
		}
		out = out[:0]
		for _, x := range list.Deliveries {
			if x.Status == "pending" {
				return false
			}
			var d harness.DeliveryView
			harness.Do(t, "GET", s.URL+"/v1/deliveries/"+x.ID, nil, &d)
			out = append(out, d)
		}
		return true
	})
	return out
}

// lastAttempt returns the delivery's last attempt, failing the test when it has none.
func lastAttempt(t *testing.T, d harness.DeliveryView) harness.AttemptView {
	t.Helper()
	if len(d.Attempts) == 0 {
		t.Fatalf("delivery %s has no attempts", d.ID)
	}
	return d.Attempts[len(d.Attempts)-1]
}

// getDelivery reads one delivery by id.
func getDelivery(s *harness.Sidecar, t *testing.T, id string) harness.DeliveryView {
	t.Helper()
	return harness.Get[harness.DeliveryView](t, s.URL+"/v1/deliveries/"+id)
}

// deliveryOf returns the id of the event's delivery to group, waiting until it exists.
func deliveryOf(s *harness.Sidecar, t *testing.T, eventID, group string) string {
	t.Helper()
	id := ""
	testwait.Eventually(t, 20*time.Second, "the delivery of "+eventID+" to "+group, func() bool {
		var ev harness.EventView
		harness.Do(t, "GET", s.URL+"/v1/events/"+eventID, nil, &ev)
		for _, x := range ev.Deliveries {
			if x.ConsumerGroup == group {
				id = x.ID
			}
		}
		return id != ""
	})
	return id
}

// A consumer group deleted while a delivery waits for its retry, then registered again at once through
// another replica with another URL and topic: the pending delivery ends at once as endpoint_deleted, and
// nothing of the old subscription ever reaches the new receiver.
func TestDeletedGroupEndsItsPendingDeliveries(t *testing.T) {
	b := harness.Setup(t)
	s1, s2 := b.Start(b.FastEnv()), b.Start(b.FastEnv())
	old, fresh := harness.NewReceiver(t, 500), harness.NewReceiver(t, 200)
	s1.RegisterEndpoint(t, "billing", map[string]any{"url": old.URL, "topics": []string{"invoice.paid"}, "retryDelay": "1s"})
	paid := s1.Publish(t, "invoice.paid", map[string]any{"invoice": 1})
	did := deliveryOf(s1, t, paid, "billing")
	testwait.Eventually(t, 20*time.Second, "attempt 2 to wait for its retry", func() bool {
		d := getDelivery(s1, t, did)
		return len(d.Attempts) == 2 && d.Attempts[1].Status == "pending"
	})
	s2.DeleteEndpoint(t, "billing")
	d := getDelivery(s1, t, did)
	if d.Status != "error" || lastAttempt(t, d).Error == nil || lastAttempt(t, d).Error.Code != "endpoint_deleted" {
		t.Fatalf("right after the delete, delivery = %+v, want error with endpoint_deleted", d)
	}
	s2.RegisterEndpoint(t, "billing", map[string]any{"url": fresh.URL, "topics": []string{"user.created"}, "offsetReset": "latest"})
	created := s1.Publish(t, "user.created", map[string]any{"user": 1})
	if got := s1.WaitDelivery(t, created, "billing", 20*time.Second); got.Status != "success" {
		t.Fatalf("delivery to the re-created group = %+v", got)
	}
	retryAt := d.Attempts[1].NextAttemptAt
	testwait.Eventually(t, 20*time.Second, "the old retry's due time to pass by a second", func() bool { return time.Now().After(retryAt.Add(time.Second)) })
	if got := postsByKey(fresh); got[paid] != 0 || got[created] != 1 {
		t.Fatalf("the re-created group's receiver got %v, want only %s once", got, created)
	}
	old.WantPOSTs(t, 1, "at the deleted group's endpoint (before the delete)")
	if d := getDelivery(s1, t, did); d.Status != "error" || len(d.Attempts) != 2 {
		t.Fatalf("the old delivery changed after the re-creation: %+v", d)
	}
	if strings.Contains(s1.Logs.String()+s2.Logs.String(), `"level":"error","consumer_group":"billing"`) {
		t.Fatal("the deletion was logged at error level")
	}
}

// A PUT that drops a topic ends the group's pending deliveries of that topic as unsubscribed; one that only
// changes the URL keeps pending work, and the next attempt goes to the new URL.
func TestPutDroppingATopicEndsItsDeliveries(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv())
	failing, fixed := harness.NewReceiver(t, 500), harness.NewReceiver(t, 200)
	s.RegisterEndpoint(t, "g", map[string]any{"url": failing.URL, "topics": []string{"a", "b"}, "retryDelay": "1s"})
	ea, eb := s.Publish(t, "a", 1), s.Publish(t, "b", 2)
	da, db := deliveryOf(s, t, ea, "g"), deliveryOf(s, t, eb, "g")
	testwait.Eventually(t, 20*time.Second, "both deliveries to wait for a retry", func() bool {
		return len(getDelivery(s, t, da).Attempts) == 2 && len(getDelivery(s, t, db).Attempts) == 2
	})
	s.RegisterEndpoint(t, "g", map[string]any{"url": fixed.URL, "topics": []string{"b"}, "retryDelay": "1s"})
	d := getDelivery(s, t, da)
	if d.Status != "error" || lastAttempt(t, d).Error == nil || lastAttempt(t, d).Error.Code != "unsubscribed" {
		t.Fatalf("delivery of the dropped topic = %+v, want error with unsubscribed", d)
	}
	if got := s.WaitDelivery(t, eb, "g", 20*time.Second); got.Status != "success" {
		t.Fatalf("delivery of the kept topic = %+v, want success at the new URL", got)
	}
	if got := postsByKey(fixed); got[ea] != 0 || got[eb] != 1 {
		t.Fatalf("the new URL got %v, want only %s", got, eb)
	}
}

// A POST in flight when its group is deleted finishes and is recorded; its failure does not carry the
// delivery over to the group registered again under the same name.
func TestInFlightAttemptOfADeletedGroupDoesNotReachItsSuccessor(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv())
	old := harness.NewHoldingReceiver(t, 500)
	fresh := harness.NewReceiver(t, 200)
	s.RegisterEndpoint(t, "billing", map[string]any{"url": old.URL, "topics": []string{"t"}, "retryDelay": "100ms"})
	id := s.Publish(t, "t", 1)
	old.WaitArrival(t)
	s.DeleteEndpoint(t, "billing")
	s.RegisterEndpoint(t, "billing", map[string]any{"url": fresh.URL, "topics": []string{"t"}})
	old.LetGo()
	did := deliveryOf(s, t, id, "billing")
	var d harness.DeliveryView
	testwait.Eventually(t, 20*time.Second, "the old delivery to end", func() bool { d = getDelivery(s, t, did); return d.Status != "pending" })
	if d.Status != "error" || d.Error == nil || d.Error.Code != "endpoint_deleted" {
		t.Fatalf("old delivery = %+v, want error ending with endpoint_deleted", d)
	}
	fresh.WantPOSTs(t, 0, "at the re-created group's endpoint (none of the old subscription)")
}

// hangingReceivers returns n receivers that hold every POST until the test ends, and a function that
// counts the POSTs they hold at the moment.
func hangingReceivers(t *testing.T, n int) ([]*harness.HoldingReceiver, func() int) {
	out := make([]*harness.HoldingReceiver, n)
	for i := range out {
		out[i] = harness.NewHoldingReceiver(t, 200)
	}
	return out, func() int {
		held := 0
		for _, r := range out {
			now, _ := r.Held()
			held += now
		}
		return held
	}
}

// fairnessCase: slow groups whose receivers hang, each with backlog enough to fill its maxConcurrency, and
// one event for a healthy group, delivered while every slow POST still hangs. It returns how long the
// healthy event waited between its publish answer and its POST.
func fairnessCase(t *testing.T, workers, slowGroups, events, maxConcurrency, busy int) time.Duration {
	const hang = 60 * time.Second // the slow endpoints' timeout: how long their POSTs hang
	b := harness.Setup(t)
	env := b.FastEnv()
	if workers > 0 {
		env["PULSE_WORKERS"] = strconv.Itoa(workers)
	}
	s := b.Start(env)
	slow, held := hangingReceivers(t, slowGroups)
	healthy := harness.NewReceiver(t, 200)
	for i, r := range slow {
		s.RegisterEndpoint(t, fmt.Sprintf("slow%d", i), map[string]any{"url": r.URL, "topics": []string{fmt.Sprintf("s%d", i)},
			"maxConcurrency": maxConcurrency, "timeout": hang.String()})
	}
	s.RegisterEndpoint(t, "healthy", map[string]any{"url": healthy.URL, "topics": []string{"h"}})
	// The baseline: how long the healthy group's POST takes on this machine now, before anything hangs.
	start := time.Now()
	first := s.Publish(t, "h", "baseline")
	testwait.Eventually(t, hang/2, "the healthy group's baseline POST", func() bool { return postsByKey(healthy)[first] == 1 })
	baseline := healthy.Received()[0].At.Sub(start)
	for i := range slow {
		batch := make([]map[string]any, events)
		for j := range batch {
			batch[j] = map[string]any{"topic": fmt.Sprintf("s%d", i), "data": j}
		}
		if code := harness.Do(t, "POST", s.URL+"/v1/events", batch, nil); code != 202 {
			t.Fatalf("publish answered %d", code)
		}
	}
	testwait.Eventually(t, 30*time.Second, fmt.Sprintf("%d slow POSTs to hang", busy), func() bool { return held() >= busy })
	start = time.Now()
	id := s.Publish(t, "h", "healthy")
	// The slow POSTs hang until the test ends, each given up only by its endpoint's timeout (hang): without
	// fairness the healthy POST would wait for that timeout. The bound is measured against the baseline taken
	// in this test (20 times it, at least 10 s: a held slot is given back after 1 s), never more than half the
	// hang, and the check after it is the mechanism: every slow POST still hung when the healthy one came.
	bound := min(hang/2, max(10*time.Second, 20*baseline))
	testwait.Eventually(t, bound, fmt.Sprintf("the healthy group's POST while every slow one hangs (baseline %s)", baseline.Round(time.Millisecond)),
		func() bool { return postsByKey(healthy)[id] == 1 })
	waited := healthy.Received()[1].At.Sub(start)
	if n := held(); n < busy {
		t.Fatalf("only %d slow POSTs hang when the healthy one arrived; the case needs %d", n, busy)
	}
	t.Logf("%d workers, %d hanging groups × maxConcurrency %d: %d POSTs hang, the healthy group's POST came %s after its publish",
		cmp.Or(workers, 64), slowGroups, maxConcurrency, held(), waited.Round(time.Millisecond))
	return waited
}

// A healthy group's event is POSTed while every POST of the hanging groups hangs: with more hanging groups than
// PULSE_WORKERS / maxConcurrency (5 × 16 > 64); with more hanging groups than worker slots (6 > 4: the slots they
// hold are given back after a second); with more than twice PULSE_WORKERS (10 groups × 2 POSTs, 2 workers).
func TestHangingGroupsDoNotStarveAHealthyOne(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name                                              string
		workers, slowGroups, events, maxConcurrency, busy int
	}{
		{"more groups than workers over maxConcurrency", 0, 5, 20, 16, 64},
		{"more groups than worker slots", 4, 6, 2, 1, 6},
		{"far more groups than worker slots", 2, 10, 2, 2, 20},
	} {
		t.Run(tt.name, func(t *testing.T) {
			fairnessCase(t, tt.workers, tt.slowGroups, tt.events, tt.maxConcurrency, tt.busy)
		})
	}
}

// A group deleted (through another replica) while its POST is in flight, with a retry due at once: the
// failed POST is recorded, no further attempt is created or POSTed, and the delivery ends endpoint_deleted.
func TestNoAttemptAfterTheDelete(t *testing.T) {
	b := harness.Setup(t)
	s1, s2 := b.Start(b.FastEnv()), b.Start(b.FastEnv()) // leases of LongLease: a loaded machine does not reap the attempt in flight
	rcv := harness.NewHoldingReceiver(t, 500)
	s1.RegisterEndpoint(t, "billing", map[string]any{"url": rcv.URL, "topics": []string{"t"}, "retryDelay": "1ms"})
	id := s1.Publish(t, "t", 1)
	rcv.WaitArrival(t)
	s2.DeleteEndpoint(t, "billing")
	rcv.LetGo()
	did := deliveryOf(s1, t, id, "billing")
	var d harness.DeliveryView
	testwait.Eventually(t, 20*time.Second, "the delivery to end", func() bool { d = getDelivery(s1, t, did); return d.Status != "pending" })
	if d.Status != "error" || len(d.Attempts) != 1 || d.Attempts[0].HTTPStatus != 500 {
		t.Fatalf("delivery = %+v, want error after the one attempt in flight (HTTP 500)", d)
	}
	if d.Error == nil || d.Error.Code != "endpoint_deleted" {
		t.Fatalf("delivery error = %+v, want endpoint_deleted", d.Error)
	}
	rcv.WantPOSTs(t, 1, "")
}

// A pending delivery of an earlier registration of an ordered group, its next attempt due in an hour, does
// not hold up the line of the group registered again: it ends endpoint_deleted and the new event arrives.
func TestStaleHeadDoesNotBlockARecreatedOrderedGroup(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv(harness.ShortLease))
	rcv := harness.NewReceiver(t, 200)
	s.RegisterEndpoint(t, "ledger", map[string]any{"url": rcv.URL, "topics": []string{"t"}, "ordered": true})
	later := time.Now().Add(time.Hour).UTC()
	old := tornState(b, "ledger", bson.M{"incarnation": "earlier-registration"},
		bson.M{"status": "pending", "incarnation": "earlier-registration", "nextAttemptAt": later})
	id := s.Publish(t, "t", "new")
	if d := s.WaitDelivery(t, id, "ledger", 20*time.Second); d.Status != "success" {
		t.Fatalf("new delivery = %+v", d)
	}
	if d := s.WaitDelivery(t, old, "ledger", 20*time.Second); d.Status != "error" || lastAttempt(t, d).Error == nil || lastAttempt(t, d).Error.Code != "endpoint_deleted" {
		t.Fatalf("stale delivery = %+v, want error endpoint_deleted", d)
	}
	if got := postsByKey(rcv); got[old] != 0 {
		t.Fatal("the stale delivery was POSTed")
	}
}

// A delete that removed the subscription but died before ending its pending deliveries (the subscription is
// deleted straight in the database): the reconciler ends them, and deleting again answers 404 and ends them
// too.
func TestUnfinishedDeleteIsCompleted(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv(harness.ShortLease)) // the repair scan runs every half lease
	rcv := harness.NewReceiver(t, 500)
	for _, g := range []string{"a", "b"} {
		s.RegisterEndpoint(t, g, map[string]any{"url": rcv.URL, "topics": []string{"t-" + g}, "retryDelay": "1h"})
	}
	ea, eb := s.Publish(t, "t-a", 1), s.Publish(t, "t-b", 2)
	da, db := deliveryOf(s, t, ea, "a"), deliveryOf(s, t, eb, "b")
	testwait.Eventually(t, 20*time.Second, "both retries to be scheduled", func() bool {
		return len(getDelivery(s, t, da).Attempts) == 2 && len(getDelivery(s, t, db).Attempts) == 2
	})
	subs := b.Client.Database(b.DBName).Collection("pulse.subscriptions")
	if _, err := subs.DeleteMany(t.Context(), bson.M{"_id": bson.M{"$in": []string{"a", "b"}}}); err != nil {
		t.Fatal(err)
	}
	if code := harness.Do(t, "DELETE", s.URL+"/v1/endpoints/b", nil, nil); code != 404 {
		t.Fatalf("deleting b again answered %d, want 404", code)
	}
	if d := getDelivery(s, t, db); d.Status != "error" {
		t.Fatalf("delivery of b after the second delete = %+v, want error", d)
	}
	testwait.Eventually(t, 20*time.Second, "the reconciler to end a's delivery", func() bool { return getDelivery(s, t, da).Status == "error" })
}

// maxConcurrency holds on a replica that has not seen the endpoint yet (registered through another replica
// a moment before an array publish).
func TestMaxConcurrencyHoldsOnAReplicaThatJustLearnsTheGroup(t *testing.T) {
	b := harness.Setup(t)
	s1, s2 := b.Start(b.FastEnv()), b.Start(b.FastEnv())
	rcv := harness.NewHoldingReceiver(t, 200)
	s2.RegisterEndpoint(t, "one", map[string]any{"url": rcv.URL, "topics": []string{"mc"}, "maxConcurrency": 1})
	batch := make([]map[string]any, 10)
	for i := range batch {
		batch[i] = map[string]any{"topic": "mc", "data": i}
	}
	if code := harness.Do(t, "POST", s1.URL+"/v1/events", batch, nil); code != 202 {
		t.Fatalf("publish answered %d", code)
	}
	rcv.WaitArrival(t)
	// Let POSTs through one at a time; a second one in flight would show in rcv.most.
	for range 10 {
		rcv.Release <- struct{}{}
	}
	testwait.Eventually(t, 30*time.Second, "10 POSTs", func() bool { return len(rcv.Received()) >= 10 })
	if _, most := rcv.Held(); most > 1 {
		t.Fatalf("%d POSTs were in flight at once, maxConcurrency is 1", most)
	}
}
