package e2e

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/pulse-sidecar/pulse/e2e/internal/harness"
	"github.com/pulse-sidecar/pulse/internal/drill"
	"github.com/pulse-sidecar/pulse/internal/testwait"
)

// Every connection the sidecar holds is left half-open (bytes accepted, never answered, no reset), while new
// connections work: the dispatcher's loop, the reconciler and the API were each stuck on their pooled
// connections with no deadline. Now every publish answers (202 or 503 database_unavailable) within its
// bound, and delivery goes on by itself, on new connections, without a restart: an event published after
// the cut is delivered.
func TestHalfOpenConnectionsDoNotStopDelivery(t *testing.T) {
	const dbTimeout = 2 * time.Second
	b := harness.Setup(t)
	proxy, uri := b.StartDrill()
	s := b.Start(b.FastEnv(map[string]string{"PULSE_MONGODB_URI": uri, "PULSE_DATABASE_TIMEOUT": dbTimeout.String()}))
	rcv := harness.NewReceiver(t, 200)
	s.RegisterEndpoint(t, "g", map[string]any{"url": rcv.URL, "topics": []string{"t"}})
	s.WantSuccess(t, "g", 30*time.Second, s.Publish(t, "t", "before"))

	hung := proxy.HangOpen()
	t.Logf("%d connections left half-open", hung)
	var (
		mu      sync.Mutex
		slowest time.Duration
		codes   = map[string]int{}
		after   []string
	)
	var wg sync.WaitGroup
	for i := range 8 { // concurrent publishes: each takes a pooled connection, all of them hung
		wg.Go(func() {
			id := fmt.Sprintf("after-%d", i)
			a, err := timedRequest("POST", s.URL+"/v1/events", map[string]any{"id": id, "topic": "t", "data": id})
			if err != nil {
				t.Errorf("publish %d: %v", i, err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			slowest = max(slowest, a.took)
			codes[fmt.Sprintf("%d %s", a.code, a.errCode)]++
			if a.code == 202 {
				after = append(after, id)
			}
		})
	}
	wg.Wait()
	t.Logf("publishes on half-open connections: %v, the slowest in %s; proxy %+v", codes, slowest.Round(time.Millisecond), proxy.Stats())
	for c := range codes {
		if c != "202 " && c != "503 database_unavailable" {
			t.Errorf("a publish on half-open connections answered %s, want 202 or 503 database_unavailable", c)
		}
	}
	if slowest > dbTimeout+dbTimeout/2 {
		t.Errorf("the slowest publish answered in %s, over PULSE_DATABASE_TIMEOUT %s and half of it", slowest, dbTimeout)
	}
	publishUntilStored(t, s, "later")
	s.WantSuccess(t, "g", 3*time.Minute, append(after, "later")...)
}

// publishUntilStored publishes the event id (topic t) until it answers 202 or 200 (stored, or stored before),
// as a client re-sends a publish answered 503; it fails t after 3 minutes.
func publishUntilStored(t *testing.T, s *harness.Sidecar, id string) {
	t.Helper()
	testwait.Eventually(t, 3*time.Minute, "publish "+id+" to be stored", func() bool {
		a, err := timedRequest("POST", s.URL+"/v1/events", map[string]any{"id": id, "topic": "t", "data": id})
		return err == nil && (a.code == 202 || a.code == 200)
	})
}

// The database resets every connection while array publishes arrive concurrently (the driver then clears its
// pool, and requests waiting for a connection fail with "connection pool ... was cleared"): every publish
// answers 202 or 503 database_unavailable, never a bare 500, and each publish re-sent after the resets is
// stored and delivered.
func TestConnectionResetsAnswer503(t *testing.T) {
	b := harness.Setup(t)
	proxy, uri := b.StartDrill()
	s := b.Start(b.FastEnv(map[string]string{"PULSE_MONGODB_URI": uri, "PULSE_DATABASE_TIMEOUT": "2s"}))
	rcv := harness.NewReceiver(t, 200)
	s.RegisterEndpoint(t, "g", map[string]any{"url": rcv.URL, "topics": []string{"t"}})
	s.WantSuccess(t, "g", 30*time.Second, s.Publish(t, "t", "before"))

	codes := map[string]int{}
	var mu sync.Mutex
	const rounds, perRound = 6, 24
	for r := range rounds {
		proxy.Set(drill.Reset)
		var wg sync.WaitGroup
		for i := range perRound {
			wg.Go(func() {
				// Arrays of two: each is written by its own commands (no group commit), so several
				// connections are in use when one is reset and the driver clears the pool under the others.
				id := fmt.Sprintf("r%d-%d", r, i)
				a, err := timedRequest("POST", s.URL+"/v1/events", []map[string]any{{"id": id, "topic": "t", "data": id}, {"id": id + "-b", "topic": "t", "data": id}})
				if err != nil {
					t.Errorf("publish: %v", err)
					return
				}
				mu.Lock()
				codes[fmt.Sprintf("%d %s", a.code, a.errCode)]++
				mu.Unlock()
			})
		}
		wg.Wait()
		proxy.Set(drill.Pass) // the pool refills between the rounds, to be reset again
		between := fmt.Sprintf("between-%d", r)
		publishUntilStored(t, s, between)
		s.WantSuccess(t, "g", time.Minute, between)
	}
	t.Logf("publishes during the resets: %v; proxy %+v", codes, proxy.Stats())
	for c, n := range codes {
		if c != "202 " && c != "503 database_unavailable" {
			t.Errorf("%d publishes during the resets answered %s, want 202 or 503 database_unavailable", n, c)
		}
	}
	var ids []string
	for r := range rounds {
		for i := range perRound {
			id := fmt.Sprintf("r%d-%d", r, i)
			testwait.Eventually(t, 3*time.Minute, "publish "+id+" to be stored", func() bool {
				a, err := timedRequest("POST", s.URL+"/v1/events", []map[string]any{{"id": id, "topic": "t", "data": id}, {"id": id + "-b", "topic": "t", "data": id}})
				return err == nil && (a.code == 202 || a.code == 200)
			})
			ids = append(ids, id, id+"-b")
		}
	}
	s.WantSuccess(t, "g", 2*time.Minute, ids...)
}
