package sidecar

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/event"

	"github.com/pulse-sidecar/pulse/internal/testdb"
	"github.com/pulse-sidecar/pulse/internal/testwait"
)

// housekeeping are commands that bound nothing of the sidecar's work: the driver's connection handshake and
// monitoring, a cursor's next batch (bounded by its find's maxTimeMS, which MongoDB counts over its
// getMores), and the cleanup of cursors and sessions.
var housekeeping = map[string]bool{"hello": true, "isMaster": true, "ismaster": true, "saslStart": true, "saslContinue": true,
	"getMore": true, "killCursors": true, "endSessions": true}

// No database call of the sidecar is without a deadline: every command it sends through a whole life (the
// start, registering an endpoint, publishes, the dispatcher's loop and its reconciliation, the deliveries,
// /readyz, the shutdown) carries maxTimeMS, which the driver derives from the call's deadline (its context's,
// or the client's operation timeout); before, the loop's, the reconciler's and most API calls had none, and a
// connection that never answered held them forever.
func TestEveryDatabaseCallHasADeadline(t *testing.T) {
	t.Parallel()
	_, dbName := testdb.Database(t)
	var (
		mu      sync.Mutex
		sent    = map[string]int{}
		without = map[string]int{}
	)
	monitor := &event.CommandMonitor{Started: func(_ context.Context, ev *event.CommandStartedEvent) {
		if housekeeping[ev.CommandName] {
			return
		}
		if v, err := ev.Command.LookupErr("pipeline", "0", "$changeStream"); err == nil && v.Type != 0 {
			return // a change stream's aggregate opens a stream that has no end to bound
		}
		ms, ok := ev.Command.Lookup("maxTimeMS").AsInt64OK()
		mu.Lock()
		defer mu.Unlock()
		sent[ev.CommandName]++
		if !ok || ms <= 0 {
			without[ev.CommandName]++
		}
	}}
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(200) }))
	t.Cleanup(rcv.Close)
	cfg := load(t, map[string]string{"PULSE_MONGODB_URI": testdb.URI(t), "PULSE_DATABASE": dbName, "PULSE_LISTEN": "127.0.0.1:0",
		"PULSE_POLL_INTERVAL": "50ms", "PULSE_LOCK_TIMEOUT": "2s"})
	s := New(cfg, Options{Monitor: monitor})
	if err := s.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	base := "http://" + s.Addr()
	do := func(method, path string, body any) int {
		t.Helper()
		raw, _ := json.Marshal(body)
		req, _ := http.NewRequest(method, base+path, bytes.NewReader(raw))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := do("PUT", "/v1/endpoints/g", map[string]any{"url": rcv.URL, "topics": []string{"t"}}); code != 201 {
		t.Fatalf("PUT endpoint = %d", code)
	}
	for i := range 5 {
		if code := do("POST", "/v1/events", map[string]any{"id": "e" + string(rune('0'+i)), "topic": "t", "data": i}); code != 202 {
			t.Fatalf("publish = %d", code)
		}
	}
	if code := do("POST", "/v1/events", []map[string]any{{"id": "a1", "topic": "t", "data": 1}, {"id": "a2", "topic": "t", "data": 2}}); code != 202 {
		t.Fatalf("array publish = %d", code)
	}
	testwait.Eventually(t, time.Minute, "the 7 deliveries to succeed", func() bool {
		resp, err := http.Get(base + "/v1/deliveries?consumerGroup=g&status=success&limit=100")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var out struct{ Deliveries []json.RawMessage }
		_ = json.NewDecoder(resp.Body).Decode(&out)
		return len(out.Deliveries) == 7
	})
	// A few reap and repair passes (every 500 ms and 1 s with a 2 s lease) and the periodic reads.
	testwait.Eventually(t, time.Minute, "the reconciliation to run a few passes", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return sent["find"] > 40
	})
	for _, p := range []string{"/readyz", "/v1/stats", "/v1/endpoints/g/activity", "/v1/events/e1"} {
		if resp, err := http.Get(base + p); err == nil {
			resp.Body.Close()
		}
	}
	s.Stop()
	if err := s.Wait(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	var names []string
	for n := range without {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		t.Errorf("%d of %d %s commands carried no maxTimeMS: a database call without a deadline", without[n], sent[n], n)
	}
	t.Logf("commands sent, each with a deadline: %v", sent)
	if len(sent) == 0 || !strings.Contains(strings.Join(keys(sent), " "), "update") {
		t.Fatalf("the sidecar sent too little to judge: %v", sent)
	}
}

func keys(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
