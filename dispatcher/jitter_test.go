package dispatcher

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pulse-sidecar/pulse/lease"
	"github.com/pulse-sidecar/pulse/pulsetype"
	"github.com/pulse-sidecar/pulse/webhook"
)

// idleStore is a Store with no work that records when the loop polled it (ClaimBatch).
type idleStore struct {
	mu    sync.Mutex
	polls []time.Time
}

func (s *idleStore) FanOut(context.Context, []*pulsetype.Event) ([]*pulsetype.Attempt, error) {
	return nil, nil
}
func (s *idleStore) ClearFanOut(context.Context, []string) error { return nil }
func (s *idleStore) ClaimAttempts(context.Context, string, []*pulsetype.Attempt) ([]*pulsetype.Attempt, error) {
	return nil, nil
}
func (s *idleStore) ClaimBatch(context.Context, string, []string, int) ([]*pulsetype.Attempt, error) {
	s.mu.Lock()
	s.polls = append(s.polls, time.Now())
	s.mu.Unlock()
	return nil, nil
}
func (s *idleStore) ClaimHead(context.Context, string, pulsetype.Line) (*pulsetype.Attempt, time.Duration, error) {
	return nil, 0, nil
}
func (s *idleStore) OrderingKeys(context.Context, string, string) ([]string, error) {
	return []string{""}, nil
}
func (s *idleStore) ReleaseAttempt(context.Context, *pulsetype.Attempt) error { return nil }
func (s *idleStore) FinishAttempts(_ context.Context, cs []pulsetype.Completion) ([]bool, error) {
	return make([]bool, len(cs)), nil
}
func (s *idleStore) FollowUps(context.Context, []pulsetype.Completion) error { return nil }
func (s *idleStore) GetEvent(context.Context, string) (*pulsetype.Event, error) {
	return nil, pulsetype.ErrNotFound
}
func (s *idleStore) GetEvents(context.Context, []string) (map[string]*pulsetype.Event, error) {
	return nil, nil
}
func (s *idleStore) ListEndpoints(context.Context) ([]*pulsetype.Endpoint, error) { return nil, nil }
func (s *idleStore) GetEndpoint(context.Context, string) (*pulsetype.Endpoint, error) {
	return nil, pulsetype.ErrNotFound
}
func (s *idleStore) Reap(context.Context) (bool, error)  { return false, nil }
func (s *idleStore) Repair(context.Context) (int, error) { return 0, nil }

func (s *idleStore) times() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.polls...)
}

type noSender struct{}

func (noSender) Send(context.Context, webhook.Request) webhook.Result { return webhook.Result{} }

// Two replicas started in the same instant do not poll in lockstep: their poll intervals are jittered, so
// most polls of one fall well apart from every poll of the other.
func TestReplicasStartedTogetherPollApart(t *testing.T) {
	t.Parallel()
	const poll = 50 * time.Millisecond
	stores := []*idleStore{{}, {}}
	ds := make([]*Dispatcher, len(stores))
	for i, s := range stores {
		keeper := lease.NewKeeper(func(context.Context, []pulsetype.LeaseKey) ([]pulsetype.LeaseKey, error) { return nil, nil },
			time.Second, nil, zerolog.Nop())
		ds[i] = New(s, noSender{}, s, keeper, Options{Owner: "o", Workers: 4, PollInterval: poll, LockTimeout: time.Second,
			ShutdownTimeout: time.Second, Logger: zerolog.Nop()})
	}
	for _, d := range ds {
		_ = d.Start(t.Context())
	}
	deadline := time.Now().Add(20 * time.Second)
	for len(stores[0].times()) < 40 || len(stores[1].times()) < 40 {
		if time.Now().After(deadline) {
			t.Fatal("the loops did not poll 40 times within 20s")
		}
		time.Sleep(poll) // polling for the count, not waiting for an outcome
	}
	for _, d := range ds {
		d.Stop()
	}
	a, b := stores[0].times(), stores[1].times()
	together := 0
	for _, x := range a[:40] {
		for _, y := range b {
			if d := x.Sub(y); d > -3*time.Millisecond && d < 3*time.Millisecond {
				together++
				break
			}
		}
	}
	t.Logf("%d of 40 polls of one replica fell within 3 ms of a poll of the other", together)
	if together > 20 {
		t.Fatalf("%d of 40 polls of two replicas started together coincide: they poll in lockstep", together)
	}
}
