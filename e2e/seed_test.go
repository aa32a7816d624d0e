package e2e

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/pulse-sidecar/pulse/e2e/internal/harness"
	"github.com/pulse-sidecar/pulse/internal/testwait"
	pmongo "github.com/pulse-sidecar/pulse/mongo"
)

// A retry the reconciler creates (the worker died after recording the failure) waits for the Retry-After
// that the failed attempt received, as the worker's own retry would have.
func TestReconcilerRetryHonoursRetryAfter(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv(harness.ShortLease))
	rcv := harness.NewReceiver(t, 200)
	s.RegisterEndpoint(t, "g", map[string]any{"url": rcv.URL, "topics": []string{"t"}, "retryDelay": "10ms"})
	ended := time.Now().UTC().Truncate(time.Millisecond)
	id := tornState(b, "g", bson.M{}, bson.M{"status": "error", "httpStatus": 429, "endedAt": ended, "startedAt": ended,
		"lockToken": "dead", "lockOwner": "dead", "lockedUntil": ended, "retryAfterMs": 4000,
		"error": bson.M{"code": "handler_error", "message": "HTTP 429 Too Many Requests"}})
	did := deliveryOf(s, t, id, "g")
	var d harness.DeliveryView
	testwait.Eventually(t, 20*time.Second, "the reconciler to create attempt 2", func() bool { d = getDelivery(s, t, did); return len(d.Attempts) == 2 })
	if due := d.Attempts[1].NextAttemptAt; due.Before(ended.Add(4 * time.Second)) {
		t.Fatalf("attempt 2 is due %s after attempt 1 ended, want at least the 4 s Retry-After", due.Sub(ended))
	}
}

// The database stalls for 1.5 × the lease timeout while a POST is in flight: the stalled replica's lease
// expires, its POST is cancelled (a lost lease cancels the POST in flight), another replica records the
// attempt as worker_lost and delivers attempt 2, and the stalled replica records nothing when the database
// comes back: one success, as the crash table says.
func TestDatabaseStallDuringAPostRecordsOneSuccess(t *testing.T) {
	b := harness.Setup(t)
	env := b.FastEnv()
	env["PULSE_LOCK_TIMEOUT"] = "1s"
	stalled, proxy := startBehindPauseProxy(b, env)

	cancelled, testDone := make(chan struct{}, 1), make(chan struct{})
	var mu sync.Mutex
	var attempts []string
	rcv := harness.NewReceiver(t, 200)
	t.Cleanup(func() { close(testDone) }) // runs before the receiver closes
	rcv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // the server notices a closed connection only once the body is read
		mu.Lock()
		attempts = append(attempts, r.Header.Get("Pulse-Attempt"))
		mu.Unlock()
		if r.Header.Get("Pulse-Attempt") == "1" {
			select { // attempt 1 hangs until its sender gives it up
			case <-r.Context().Done():
				cancelled <- struct{}{}
			case <-testDone:
			}
			return
		}
		w.WriteHeader(200)
	})
	stalled.RegisterEndpoint(t, "g", map[string]any{"url": rcv.URL, "topics": []string{"t"}, "retryDelay": "10ms", "timeout": "1m"})
	id := stalled.Publish(t, "t", 1) // the publishing replica leases the first attempt itself
	testwait.Eventually(t, 20*time.Second, "attempt 1 to arrive", func() bool { mu.Lock(); defer mu.Unlock(); return len(attempts) == 1 })
	other := b.Start(env) // started now, so that the stalled replica holds attempt 1
	proxy.pause("")
	stallStart := time.Now()
	select {
	case <-cancelled:
	case <-time.After(20 * time.Second):
		t.Fatalf("the stalled replica did not cancel its POST when its lease could not be renewed\n%s", stalled.Logs.String())
	}
	d := other.WaitDelivery(t, id, "g", 30*time.Second)
	testwait.Eventually(t, 10*time.Second, "the stall to last 1.5 × the lease timeout", func() bool { return time.Since(stallStart) > 1500*time.Millisecond })
	proxy.resume()
	// The stalled replica is back: give it a poll or two to (wrongly) write anything, then read again.
	testwait.Eventually(t, 30*time.Second, "the stalled replica to answer again", func() bool {
		var h struct{ Status string }
		return harness.Do(t, "GET", stalled.URL+"/readyz", nil, &h) == 200
	})
	d = getDelivery(other, t, deliveryOf(other, t, id, "g"))
	successes := 0
	for _, a := range d.Attempts {
		if a.Status == "success" {
			successes++
		}
	}
	if d.Status != "success" || successes != 1 || d.Attempts[0].Error == nil || d.Attempts[0].Error.Code != "worker_lost" {
		t.Fatalf("delivery = %+v, want attempt 1 worker_lost and exactly one success", d)
	}
}

// Forty-eight torn states of six kinds written straight into the database beside 400 pending deliveries,
// with six live replicas: every delivery converges, each torn one with only the POSTs the crash table
// allows, within the bound stated below. (With 1,000 pending deliveries the serialized test database,
// FerretDB behind the linearizing proxy, stops answering under six replicas: left to the embedded-database
// performance work.)
func TestManyTornStatesConvergeUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: a minute of load")
	}
	b := harness.Setup(t)
	env := b.FastEnv()
	// Six replicas' repair scans would saturate the serialized test database at 600 ms; and on a loaded
	// machine the database can stall a heartbeat past 5 s, so that a live POST's lease is reaped and its
	// event POSTed twice (at-least-once, but not what this test is about).
	env["PULSE_LOCK_TIMEOUT"] = "10s"
	replicas := make([]*harness.Sidecar, 6)
	for i := range replicas {
		replicas[i] = b.Start(env)
	}
	s := replicas[0]
	rcv := harness.NewReceiver(t, 200)
	s.RegisterEndpoint(t, "g", map[string]any{"url": rcv.URL, "topics": []string{"t", "bulk"}, "retryDelay": "10ms"})
	const bulk = 400
	for range bulk / 100 {
		batch := make([]map[string]any, 100)
		for i := range batch {
			batch[i] = map[string]any{"topic": "bulk", "data": i}
		}
		if code := harness.Do(t, "POST", s.URL+"/v1/events", batch, nil); code != 202 {
			t.Fatalf("publish answered %d", code)
		}
	}
	past := time.Now().Add(-time.Minute).UTC()
	dead := bson.M{"lockToken": "dead", "lockOwner": "dead", "lockedAt": past, "lockedUntil": past, "startedAt": past}
	kinds := []struct {
		name      string
		delivery  bson.M
		attempts  []bson.M
		wantPOSTs []string
	}{
		{"expired lease", bson.M{}, []bson.M{merge(dead, bson.M{"status": "pending"})}, []string{"2"}},
		{"success not carried to the delivery", bson.M{}, []bson.M{merge(dead, bson.M{"status": "success", "httpStatus": 200, "endedAt": past})}, nil},
		{"error without its retry", bson.M{}, []bson.M{merge(dead, bson.M{"status": "error", "httpStatus": 500, "endedAt": past,
			"error": bson.M{"code": "handler_error", "message": "HTTP 500"}})}, []string{"2"}},
		{"delivery without attempt", bson.M{}, nil, []string{"1"}},
		{"unfinished fan-out", nil, nil, []string{"1"}},
		{"reopened without its attempt", bson.M{"reopenedAttempt": 2}, []bson.M{merge(dead, bson.M{"status": "success", "httpStatus": 200, "endedAt": past})}, []string{"2"}},
	}
	type torn struct {
		id   string
		want []string
	}
	var all []torn
	for i := range 48 {
		k := kinds[i%len(kinds)]
		id := tornStateNamed(b, fmt.Sprintf("torn-%02d", i), "g", k.delivery, k.attempts...)
		if k.delivery == nil {
			markForFanOut(b, id)
		}
		all = append(all, torn{id, k.wantPOSTs})
	}
	// The bound is on progress, not on the machine's speed: the repair scan looks at 100 pending deliveries
	// per pass, at least every lease timeout / 2 (5 s here) and at once again while it finds work, and an
	// unfinished fan-out is repaired once it is a lease timeout old, so a run in which no delivery succeeds
	// for two minutes is stuck. It took 6 s on a quiet machine at a 5 s lease, 11 s at 10 s, 40 s beside four
	// CPU burners; a fixed three minutes ran out once on such a machine, with the six replicas' starts and
	// publishes slowed by the other system tests.
	start := time.Now()
	waitDeliveries(b, "success", bulk+48, 2*time.Minute)
	if n := b.Count("deliveries", bson.M{}); n != bulk+48 {
		t.Fatalf("%d deliveries, want %d", n, bulk+48)
	}
	t.Logf("%d deliveries (48 torn) converged in %s with 6 replicas", bulk+48, time.Since(start).Round(time.Second))
	if n := b.Count("deliveries", bson.M{"status": "success"}); n != bulk+48 {
		t.Fatalf("%d deliveries succeeded, want %d", n, bulk+48)
	}
	posts := map[string][]string{}
	for _, r := range rcv.Received() {
		k := r.Header.Get("Idempotency-Key")
		posts[k] = append(posts[k], r.Header.Get("Pulse-Attempt"))
	}
	for _, tr := range all {
		if got := strings.Join(posts[tr.id], ","); got != strings.Join(tr.want, ",") {
			t.Errorf("torn delivery %s got POSTs of attempts [%s], want %v", tr.id, got, tr.want)
		}
	}
	// At-least-once allows a second POST of an event only after its lease expired: on a loaded machine the
	// database can stall a live POST's heartbeats past the lease, and the reaper then ends that attempt as
	// worker_lost. Any other duplicate is a bug.
	for k, p := range posts {
		if len(p) > 1 && !strings.HasPrefix(k, "torn-") {
			if lost := b.Count("history", bson.M{"deliveryId": pmongo.DeliveryID("g", k), "error.code": "worker_lost"}); lost < int64(len(p)-1) {
				t.Errorf("event %s was POSTed %d times (attempts %v) with %d attempts ended by the reaper", k, len(p), p, lost)
			} else {
				t.Logf("event %s was POSTed %d times (attempts %v) after its lease expired (worker_lost)", k, len(p), p)
			}
		}
	}
}

func merge(a, b bson.M) bson.M {
	out := bson.M{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}

// Replicas whose clocks run 5 minutes ahead and behind: a consumer group registered (offsetReset latest)
// through one receives every event published after its registration, through either, exactly once, and an
// event whose publisher died before fanning it out is fanned out once by a skewed replica.
func TestClockSkewNeitherSkipsNorDuplicates(t *testing.T) {
	b := harness.Setup(t)
	ahead, behind := b.FastEnv(harness.ShortLease), b.FastEnv(harness.ShortLease)
	ahead["PULSE_TEST_CLOCK_SKEW"] = "5m"
	behind["PULSE_TEST_CLOCK_SKEW"] = "-5m"
	sa, sb := b.Start(ahead), b.Start(behind)
	before := sb.Publish(t, "t", "before the group")
	rcv := harness.NewReceiver(t, 200)
	for i, reg := range []*harness.Sidecar{sb, sa} {
		group := fmt.Sprintf("g%d", i)
		reg.RegisterEndpoint(t, group, map[string]any{"url": rcv.URL, "topics": []string{"t"}})
	}
	var ids []string
	for i := range 10 {
		ids = append(ids, []*harness.Sidecar{sa, sb}[i%2].Publish(t, "t", i))
	}
	crashEnv := b.FastEnv(harness.ShortLease)
	crashEnv["PULSE_TEST_CRASH_AFTER_PUBLISH"] = "true"
	crashEnv["PULSE_TEST_CLOCK_SKEW"] = "-5m"
	doomed := b.StartProcess(crashEnv)
	var orphan published
	if code := harness.Do(t, "POST", doomed.URL+"/v1/events", map[string]any{"topic": "t", "data": "orphan"}, &orphan); code != 202 {
		t.Fatalf("publish through the doomed replica answered %d", code)
	}
	ids = append(ids, orphan.ID)
	for _, id := range ids {
		for _, g := range []string{"g0", "g1"} {
			if d := sa.WaitDelivery(t, id, g, 30*time.Second); d.Status != "success" {
				t.Fatalf("delivery of %s to %s = %+v", id, g, d)
			}
		}
	}
	got := postsByKey(rcv)
	for _, id := range ids {
		if got[id] != 2 {
			t.Errorf("event %s was POSTed %d times, want once per group (2)", id, got[id])
		}
	}
	if got[before] != 0 {
		t.Errorf("the event published before both groups registered was POSTed %d times", got[before])
	}
}
