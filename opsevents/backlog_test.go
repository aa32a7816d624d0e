package opsevents

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// backlogStore is a BacklogStore in memory: endpoints, oldest pending times and the alert states.
type backlogStore struct {
	mu     sync.Mutex
	eps    []*pulsetype.Endpoint
	oldest map[string]time.Time
	high   map[string]bool
}

func (s *backlogStore) ListEndpoints(context.Context) ([]*pulsetype.Endpoint, error) {
	return s.eps, nil
}

func (s *backlogStore) OldestPending(context.Context) (map[string]time.Time, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.oldest, nil
}

func (s *backlogStore) SetBacklogHigh(_ context.Context, group string, high bool) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.high[group] == high {
		return false, nil
	}
	s.high[group] = high
	return true, nil
}

// pulse.backlog.high is raised once when the oldest pending delivery passes the threshold, not again while it
// stays high (nor by a second replica that sees the same state), cleared once when the backlog drains, and
// never for an endpoint without backlogAlertAfter.
func TestBacklogHighRaisedAndCleared(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	st := &backlogStore{high: map[string]bool{}, oldest: map[string]time.Time{},
		eps: []*pulsetype.Endpoint{{ConsumerGroup: "billing", BacklogAlertAfter: pulsetype.Duration(time.Minute)}, {ConsumerGroup: "quiet"}}}
	var got []map[string]any
	newWatcher := func() *BacklogWatcher {
		w := NewBacklogWatcher(st, New(&recorder{}, Options{Logger: zerolog.Nop()}), time.Second, func() time.Time { return now }, zerolog.Nop())
		w.emit = func(topic, group string, data map[string]any) {
			if topic != pulsetype.TopicBacklogHigh || group != data["consumerGroup"] {
				t.Errorf("published %s about %s: %v", topic, group, data)
			}
			got = append(got, data)
		}
		return w
	}
	w, other := newWatcher(), newWatcher()
	check := func(w *BacklogWatcher) {
		t.Helper()
		if err := w.Check(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	check(w)
	st.oldest = map[string]time.Time{"billing": now.Add(-30 * time.Second), "quiet": now.Add(-time.Hour)}
	check(w)
	if len(got) != 0 {
		t.Fatalf("published %v below the threshold and for an endpoint without one, want nothing", got)
	}
	st.oldest = map[string]time.Time{"billing": now.Add(-2 * time.Minute), "quiet": now.Add(-time.Hour)}
	check(w)
	check(other)
	check(w)
	if len(got) != 1 || got[0]["high"] != true || got[0]["ageSeconds"] != 120.0 || got[0]["threshold"] != "1m0s" {
		t.Fatalf("published %v, want one raise of billing at 120 s over 1m0s", got)
	}
	st.oldest = map[string]time.Time{}
	check(other)
	check(w)
	if len(got) != 2 || got[1]["high"] != false || got[1]["oldestPendingAt"] != nil {
		t.Fatalf("published %v, want the raise then one clear with nothing pending", got)
	}
}
