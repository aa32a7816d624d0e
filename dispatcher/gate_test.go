package dispatcher

import (
	"context"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pulse-sidecar/pulse/internal/testwait"
)

// gateStore answers InactiveGroups from off, recording each read's groups; each read waits for proceed.
type gateStore struct {
	off     map[string]bool
	proceed chan struct{}
	mu      sync.Mutex
	reads   [][]string
	started chan struct{}
}

func (s *gateStore) InactiveGroups(_ context.Context, groups []string) (map[string]bool, error) {
	slices.Sort(groups)
	s.mu.Lock()
	s.reads = append(s.reads, groups)
	s.mu.Unlock()
	s.started <- struct{}{}
	<-s.proceed
	out := map[string]bool{}
	for _, g := range groups {
		if s.off[g] {
			out[g] = true
		}
	}
	return out, nil
}

// Every question is answered by a read that began after it was asked; the questions asked while a read runs
// share the next one.
func TestStateGateAnswersWithALaterRead(t *testing.T) {
	t.Parallel()
	store := &gateStore{off: map[string]bool{"paused": true}, proceed: make(chan struct{}), started: make(chan struct{}, 10)}
	g := newStateGate(store)
	answers := make(chan map[string]bool, 10)
	ask := func(groups ...string) {
		for _, group := range groups {
			go func() {
				off, err := g.ask(t.Context(), []string{group})[0].wait(t.Context())
				if err != nil {
					t.Error(err)
				}
				answers <- map[string]bool{group: off}
			}()
		}
	}
	ask("a")
	<-store.started // the first read runs: questions asked now wait for the next one
	ask("paused", "b", "b")
	testwait.Eventually(t, 10*time.Second, "the questions to queue", func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return len(g.asked["b"])+len(g.asked["paused"]) == 3
	})
	store.proceed <- struct{}{}
	<-store.started
	store.proceed <- struct{}{}
	got := map[string]bool{}
	for range 4 {
		maps.Copy(got, <-answers)
	}
	if !maps.Equal(got, map[string]bool{"a": false, "b": false, "paused": true}) {
		t.Fatalf("answers %v, want only paused inactive", got)
	}
	if want := [][]string{{"a"}, {"b", "paused"}}; !slices.EqualFunc(store.reads, want, slices.Equal) {
		t.Fatalf("reads %v, want %v", store.reads, want)
	}
}

// The questions of one batch of launches, asked together, are answered by one read.
func TestStateGateAnswersABatchWithOneRead(t *testing.T) {
	t.Parallel()
	store := &gateStore{off: map[string]bool{"paused": true}, proceed: make(chan struct{}, 10), started: make(chan struct{}, 10)}
	g := newStateGate(store)
	groups := []string{"a", "paused", "b", "a"}
	asked := g.ask(t.Context(), groups)
	store.proceed <- struct{}{}
	for i, q := range asked {
		off, err := q.wait(t.Context())
		if err != nil || off != (groups[i] == "paused") {
			t.Errorf("answer for %s = %v, %v; want inactive only for paused", groups[i], off, err)
		}
	}
	if want := [][]string{{"a", "b", "paused"}}; !slices.EqualFunc(store.reads, want, slices.Equal) {
		t.Fatalf("reads %v, want one read of every group asked: %v", store.reads, want)
	}
}
