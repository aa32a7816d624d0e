package main

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// slowReceiver answers 200 after holding each POST for hold; it records when each POST arrived.
func slowReceiver(t *testing.T, hold time.Duration) *receiver {
	r := &receiver{statuses: []int{200}, notify: make(chan struct{}, 1000)}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.got = append(r.got, received{Header: req.Header.Clone(), At: time.Now()})
		r.mu.Unlock()
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
	b := setup(t)
	env := b.fastEnv()
	env["PULSE_EVENT_RETENTION"] = "2s"
	s := b.start(env)
	rcv := slowReceiver(t, 900*time.Millisecond)
	s.registerEndpoint(t, "slow", map[string]any{"url": rcv.URL, "topics": []string{"t"}, "maxConcurrency": 1})
	batch := make([]map[string]any, 6)
	for i := range batch {
		batch[i] = map[string]any{"topic": "t", "data": i}
	}
	var published []struct {
		ID        string    `json:"id"`
		CreatedAt time.Time `json:"createdAt"`
	}
	if code := do(t, "POST", s.URL+"/v1/events", batch, &published); code != 202 {
		t.Fatalf("publish answered %d", code)
	}
	ds := s.waitGroupDone(t, "slow", len(published), 30*time.Second)
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
	for _, g := range rcv.received() {
		for _, e := range published {
			// 100 ms of slack for the POST to travel from the sidecar's start to the receiver.
			if g.Header.Get("Idempotency-Key") == e.ID && g.At.After(e.CreatedAt.Add(2*time.Second+100*time.Millisecond)) {
				t.Errorf("event %s was POSTed %s after it expired", e.ID, g.At.Sub(e.CreatedAt.Add(2*time.Second)))
			}
		}
	}
	t.Logf("%d of %d deliveries ended event_expired, %d POSTs", expired, len(published), len(rcv.received()))
}

// waitGroupDone waits until the consumer group has n deliveries, none pending, and returns them with their
// attempts (it reads deliveries, not events: an expired event is gone from GET /v1/events).
func (s *sidecar) waitGroupDone(t *testing.T, group string, n int, timeout time.Duration) []deliveryView {
	t.Helper()
	var out []deliveryView
	waitFor(t, timeout, "the deliveries of "+group+" to end", func() bool {
		var list struct{ Deliveries []deliveryView }
		if do(t, "GET", s.URL+"/v1/deliveries?limit=500&consumerGroup="+group, nil, &list) != 200 || len(list.Deliveries) != n {
			return false
		}
		out = out[:0]
		for _, x := range list.Deliveries {
			if x.Status == "pending" {
				return false
			}
			var d deliveryView
			do(t, "GET", s.URL+"/v1/deliveries/"+x.ID, nil, &d)
			out = append(out, d)
		}
		return true
	})
	return out
}
