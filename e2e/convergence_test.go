package e2e

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/pulse-sidecar/pulse/e2e/internal/harness"
	"github.com/pulse-sidecar/pulse/internal/testwait"
	pmongo "github.com/pulse-sidecar/pulse/mongo"
	"github.com/pulse-sidecar/pulse/pulsetype"
)

// postsByKey counts a receiver's POSTs per Idempotency-Key.
func postsByKey(r *harness.Receiver) map[string]int {
	out := map[string]int{}
	for _, g := range r.Received() {
		out[g.Header.Get("Idempotency-Key")]++
	}
	return out
}

// waitDeliveries waits until n deliveries are in status, polling the database. It fails when stall passes
// without one more delivery reaching status: a bound on a stuck run, not on the machine's speed (a busy
// machine delivers slower, but keeps delivering).
func waitDeliveries(b *harness.Bundle, status string, n int64, stall time.Duration) {
	b.T.Helper()
	var last int64
	lastChange := time.Now()
	testwait.Eventually(b.T, 25*time.Minute, fmt.Sprintf("%d deliveries in status %s", n, status), func() bool {
		got := b.Count("deliveries", bson.M{"status": status})
		if got > last {
			last, lastChange = got, time.Now()
		}
		if time.Since(lastChange) > stall {
			b.T.Fatalf("%d of %d deliveries in status %s, none more for %s", got, n, status, stall)
		}
		return got >= n
	})
}

// Convergence: 6 replicas (separate processes, separate clients) share one database; 500 events are
// published through all of them; each of 2 consumer groups gets every event exactly once when nothing
// crashes, and nothing stays pending.
func TestReplicasConvergeOnOneDeliveryPerEventAndGroup(t *testing.T) {
	if testing.Short() {
		t.Skip("convergence run skipped with -short")
	}
	const replicas = 6
	events := 500
	if os.Getenv("PULSE_TEST_POSTGRES_URL") == "" && os.Getenv("PULSE_TEST_MONGODB_URI") == "" {
		// FerretDB's SQLite handler pushes down only {_id: x} filters and scans the collection for every
		// other query, which makes it ~6x slower than its PostgreSQL handler here. .ci/run uses PostgreSQL and
		// the full size; a bare `go test` keeps the same shape at a size SQLite finishes in about a minute.
		events = 100
		t.Logf("SQLite test database: %d events (set PULSE_TEST_POSTGRES_URL for the full 500)", events)
	}
	b := harness.Setup(t)
	env := b.FastEnv()
	// No lease may expire in a healthy run (FastEnv's leases are long): the test database serializes every
	// operation, so under this load a renewal can wait seconds in its queue.
	env["PULSE_POLL_INTERVAL"] = "200ms"
	env["PULSE_WORKERS"] = "8" // bounded queues at the test database keep renewals fast
	procs := b.StartProcesses(replicas, env)
	rcvA, rcvB := harness.NewReceiver(t, 200), harness.NewReceiver(t, 200)
	procs[0].Sidecar().RegisterEndpoint(t, "ledger", map[string]any{"url": rcvA.URL, "topics": []string{"t"}})
	procs[1].Sidecar().RegisterEndpoint(t, "mailer", map[string]any{"url": rcvB.URL, "topics": []string{"t"}})

	start := time.Now()
	ids := make(chan string, events)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < events; i += 8 {
				ids <- procs[i%replicas].Sidecar().Publish(t, "t", map[string]int{"i": i})
			}
		}()
	}
	wg.Wait()
	close(ids)
	waitDeliveries(b, "success", int64(2*events), 2*time.Minute)
	elapsed := time.Since(start)

	for name, r := range map[string]*harness.Receiver{"ledger": rcvA, "mailer": rcvB} {
		byKey := postsByKey(r)
		dups := 0
		for _, n := range byKey {
			dups += n - 1
		}
		t.Logf("%s: %d POSTs for %d events, %d duplicates", name, len(r.Received()), len(byKey), dups)
		if len(byKey) != events || dups != 0 {
			t.Errorf("%s got %d distinct events and %d duplicates, want %d and 0", name, len(byKey), dups, events)
		}
	}
	for id := range ids {
		if postsByKey(rcvA)[id] != 1 {
			t.Fatalf("event %s was POSTed %d times to ledger", id, postsByKey(rcvA)[id])
		}
	}
	if n := b.Count("deliveries", bson.M{"status": bson.M{"$ne": "success"}}); n != 0 {
		t.Fatalf("%d deliveries not successful", n)
	}
	if n := b.Count("history", bson.M{}); n != int64(2*events) {
		t.Fatalf("%d attempts stored, want %d (one each)", n, 2*events)
	}
	t.Logf("convergence: %d deliveries by %d replicas in %s (%.0f deliveries/s)", 2*events, replicas, elapsed.Round(time.Millisecond), float64(2*events)/elapsed.Seconds())
}

// Stampede: 12 replicas start at once on a new earliest-offset subscription over 100 retained events;
// every event is delivered once.
func TestStampedeOnEarliestSubscriptionDeliversEachEventOnce(t *testing.T) {
	const replicas, events = 12, 100
	b := harness.Setup(t)
	ctx := context.Background()
	store := pmongo.New(b.Client, pmongo.Options{Database: b.DBName, CollectionPrefix: "pulse", LeaseTimeout: time.Second})
	if _, err := store.EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	batch := make([]*pulsetype.Event, events)
	for i := range batch {
		batch[i] = &pulsetype.Event{ID: fmt.Sprintf("old-%03d", i), Topic: "t", Data: []byte(fmt.Sprint(i))}
	}
	if _, err := store.Publish(ctx, batch); err != nil {
		t.Fatal(err)
	}
	if _, err := store.FanOut(ctx, batch); err != nil { // no subscriber yet: nothing to deliver
		t.Fatal(err)
	}
	rcv := harness.NewReceiver(t, 200)
	ep := &pulsetype.Endpoint{ConsumerGroup: "late", URL: rcv.URL, Topics: []string{"t"}, OffsetReset: pulsetype.OffsetEarliest}
	if err := ep.Normalize(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := store.PutEndpoint(ctx, ep); err != nil {
		t.Fatal(err)
	}

	env := b.FastEnv()
	env["PULSE_POLL_INTERVAL"] = "500ms" // 12 idle replicas polling every 50ms saturate the test database
	env["PULSE_WORKERS"] = "4"
	// The serialized SQLite test database under 12 replicas (and other test packages) has shown renewal
	// latencies near 10 s: FastEnv's lease (LongLease) outlasts them, or at-least-once would redeliver.
	procs := b.StartProcesses(replicas, env)
	defer func() {
		if t.Failed() {
			t.Logf("deliveries: %d, success: %d; logs of replica 0:\n%s", b.Count("deliveries", bson.M{}),
				b.Count("deliveries", bson.M{"status": "success"}), procs[0].Logs.String())
		}
	}()
	waitDeliveries(b, "success", events, 2*time.Minute)
	byKey := postsByKey(rcv)
	if len(byKey) != events || len(rcv.Received()) != events {
		t.Fatalf("receiver got %d POSTs for %d events, want %d each once", len(rcv.Received()), len(byKey), events)
	}
	if n := b.Count("deliveries", bson.M{}); n != events {
		t.Fatalf("%d deliveries, want %d", n, events)
	}
}
