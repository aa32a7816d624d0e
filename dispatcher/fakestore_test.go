package dispatcher

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pulse-sidecar/pulse/lease"
	"github.com/pulse-sidecar/pulse/pulsetype"
	"github.com/pulse-sidecar/pulse/webhook"
)

// memStore is an in-memory Store for the dispatcher's unit tests: deliveries and their attempts in maps,
// leases fenced by token, every call counted. It follows the contract of package mongo closely enough for
// the dispatcher's logic; the real store's behaviour is covered by mongo's tests against a database.
type memStore struct {
	mu         sync.Mutex
	endpoints  map[string]*pulsetype.Endpoint
	events     map[string]*pulsetype.Event
	deliveries map[string]*memDelivery
	attempts   map[string]*pulsetype.Attempt
	tokens     int
	calls      map[string]int
	polls      []time.Time // when DueAttempts ran
	finished   [][]string  // attempt ids of each FinishAttempts call
	// finishGate, when set, is received from before each FinishAttempts writes (one value per call).
	finishGate chan struct{}
	// finishing, when set, is sent the batch size as each FinishAttempts starts.
	finishing chan int
}

type memDelivery struct {
	pulsetype.DeliveryRef
	orderingKey string
	created     time.Time
	status      pulsetype.Status
}

func newMemStore(endpoints ...*pulsetype.Endpoint) *memStore {
	s := &memStore{endpoints: map[string]*pulsetype.Endpoint{}, events: map[string]*pulsetype.Event{},
		deliveries: map[string]*memDelivery{}, attempts: map[string]*pulsetype.Attempt{}, calls: map[string]int{}}
	for _, ep := range endpoints {
		s.endpoints[ep.ConsumerGroup] = ep
	}
	return s
}

// endpoint returns a normalized endpoint of group for topics, changed by each of mods.
func endpoint(t *testing.T, group string, topics []string, mods ...func(*pulsetype.Endpoint)) *pulsetype.Endpoint {
	t.Helper()
	ep := &pulsetype.Endpoint{ConsumerGroup: group, URL: "http://receiver.test/" + group, Topics: topics, Incarnation: "inc-" + group}
	for _, m := range mods {
		m(ep)
	}
	if err := ep.Normalize(); err != nil {
		t.Fatal(err)
	}
	return ep
}

func (s *memStore) count(call string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[call]
}

func (s *memStore) called(call string) {
	s.mu.Lock()
	s.calls[call]++
	s.mu.Unlock()
}

// publish stores events and creates their deliveries and first attempts, as if another replica had fanned
// them out; the attempts are due now.
func (s *memStore) publish(events ...*pulsetype.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fanOutLocked(events)
}

func (s *memStore) fanOutLocked(events []*pulsetype.Event) []*pulsetype.Attempt {
	var out []*pulsetype.Attempt
	for _, e := range events {
		if e.CreatedAt.IsZero() {
			e.CreatedAt = time.Now()
		}
		s.events[e.ID] = e
		groups := slices.Sorted(func(yield func(string) bool) {
			for g := range s.endpoints {
				if !yield(g) {
					return
				}
			}
		})
		for _, g := range groups {
			ep := s.endpoints[g]
			if !slices.Contains(ep.Topics, e.Topic) {
				continue
			}
			id := g + "/" + e.ID
			if _, ok := s.deliveries[id]; ok {
				continue
			}
			ref := pulsetype.DeliveryRef{DeliveryID: id, EventID: e.ID, ConsumerGroup: g, Topic: e.Topic, Incarnation: ep.Incarnation}
			s.deliveries[id] = &memDelivery{DeliveryRef: ref, orderingKey: e.OrderingKey, created: e.CreatedAt, status: pulsetype.StatusPending}
			out = append(out, s.createLocked(ref, 1, 0))
		}
	}
	return out
}

func (s *memStore) createLocked(ref pulsetype.DeliveryRef, n int, delay time.Duration) *pulsetype.Attempt {
	now := time.Now()
	a := &pulsetype.Attempt{ID: fmt.Sprintf("%s#%d", ref.DeliveryID, n), DeliveryID: ref.DeliveryID, EventID: ref.EventID,
		ConsumerGroup: ref.ConsumerGroup, Topic: ref.Topic, Incarnation: ref.Incarnation, Number: n,
		Status: pulsetype.StatusPending, CreatedAt: now, NextAttemptAt: now.Add(delay)}
	s.attempts[a.ID] = a
	c := *a
	return &c
}

// leaseLocked leases a to owner under token when it is pending, due and not leased; it returns a copy.
func (s *memStore) leaseLocked(a *pulsetype.Attempt, owner, token string) *pulsetype.Attempt {
	now := time.Now()
	if a.Status != pulsetype.StatusPending || a.NextAttemptAt.After(now) || a.LeasedUntil != nil && a.LeasedUntil.After(now) {
		return nil
	}
	until := now.Add(time.Minute)
	a.LeaseOwner, a.FencingToken, a.LeasedUntil = owner, token, &until
	c := *a
	return &c
}

func (s *memStore) tokenLocked() string {
	s.tokens++
	return fmt.Sprintf("token-%d", s.tokens)
}

func (s *memStore) FanOutClaiming(_ context.Context, owner string, events []*pulsetype.Event, claim func(string) bool) ([]*pulsetype.Attempt, error) {
	s.called("FanOut")
	s.mu.Lock()
	defer s.mu.Unlock()
	created := s.fanOutLocked(events)
	if claim == nil {
		return created, nil
	}
	token := s.tokenLocked()
	for i, a := range created {
		if claim(a.ConsumerGroup) {
			if c := s.leaseLocked(s.attempts[a.ID], owner, token); c != nil {
				created[i] = c
			}
		}
	}
	return created, nil
}

func (s *memStore) ClearFanOut(context.Context, []string) error {
	s.called("ClearFanOut")
	return nil
}

func (s *memStore) ClaimAttempts(_ context.Context, owner string, attempts []*pulsetype.Attempt) ([]*pulsetype.Attempt, error) {
	s.called("ClaimAttempts")
	s.mu.Lock()
	defer s.mu.Unlock()
	token := s.tokenLocked()
	var out []*pulsetype.Attempt
	for _, a := range attempts {
		if stored, ok := s.attempts[a.ID]; ok {
			if c := s.leaseLocked(stored, owner, token); c != nil {
				out = append(out, c)
			}
		}
	}
	return out, nil
}

// DueAttempts returns copies of up to limit pending, unleased, due attempts of groups (nil: any group),
// most overdue first, as the mongo store's does.
func (s *memStore) DueAttempts(_ context.Context, groups []string, limit int) ([]*pulsetype.Attempt, error) {
	s.called("DueAttempts")
	s.mu.Lock()
	defer s.mu.Unlock()
	s.polls = append(s.polls, time.Now())
	now := time.Now()
	var out []*pulsetype.Attempt
	for _, a := range s.dueLocked(groups) {
		if len(out) == limit {
			break
		}
		if a.Status == pulsetype.StatusPending && !a.NextAttemptAt.After(now) && (a.LeasedUntil == nil || !a.LeasedUntil.After(now)) {
			c := *a
			out = append(out, &c)
		}
	}
	return out, nil
}

// dueLocked returns the attempts of groups (nil: any group), by nextAttemptAt and id; s.mu is held.
func (s *memStore) dueLocked(groups []string) []*pulsetype.Attempt {
	var due []*pulsetype.Attempt
	for _, a := range s.attempts {
		if groups == nil || slices.Contains(groups, a.ConsumerGroup) {
			due = append(due, a)
		}
	}
	slices.SortFunc(due, func(a, b *pulsetype.Attempt) int {
		return cmp.Or(a.NextAttemptAt.Compare(b.NextAttemptAt), cmp.Compare(a.ID, b.ID))
	})
	return due
}

// ClaimBatch leases up to limit due attempts of groups (nil: any group), most overdue first: a helper of
// the tests (the dispatcher claims through DueAttempts and ClaimAttempts).
func (s *memStore) ClaimBatch(_ context.Context, owner string, groups []string, limit int) ([]*pulsetype.Attempt, error) {
	s.called("ClaimBatch")
	s.mu.Lock()
	defer s.mu.Unlock()
	due := s.dueLocked(groups)
	token := s.tokenLocked()
	var out []*pulsetype.Attempt
	for _, a := range due {
		if len(out) == limit {
			break
		}
		if c := s.leaseLocked(a, owner, token); c != nil {
			out = append(out, c)
		}
	}
	return out, nil
}

func (s *memStore) ClaimHeads(_ context.Context, p pulsetype.ClaimHeadsParams) (pulsetype.HeadClaims, error) {
	s.called("ClaimHeads")
	s.mu.Lock()
	defer s.mu.Unlock()
	heads := map[string]*memDelivery{} // by ordering key: the oldest pending delivery of the line
	for _, d := range s.deliveries {
		if d.ConsumerGroup != p.ConsumerGroup || d.Topic != p.Topic || d.status != pulsetype.StatusPending {
			continue
		}
		if h := heads[d.orderingKey]; h == nil || cmp.Or(d.created.Compare(h.created), cmp.Compare(d.EventID, h.EventID)) < 0 {
			heads[d.orderingKey] = d
		}
	}
	var out pulsetype.HeadClaims
	token := s.tokenLocked()
	for _, key := range slices.Sorted(maps.Keys(heads)) {
		if len(out.Attempts) == p.Limit {
			break
		}
		var current *pulsetype.Attempt
		for _, a := range s.attempts {
			if a.DeliveryID == heads[key].DeliveryID && (current == nil || a.Number > current.Number) {
				current = a
			}
		}
		if current == nil {
			continue
		}
		if a := s.leaseLocked(current, p.Owner, token); a != nil {
			out.Attempts = append(out.Attempts, a)
		}
	}
	return out, nil
}

func (s *memStore) ReleaseAttempt(_ context.Context, a *pulsetype.Attempt) error {
	s.called("ReleaseAttempt")
	s.mu.Lock()
	defer s.mu.Unlock()
	stored, ok := s.attempts[a.ID]
	if !ok || stored.FencingToken != a.FencingToken || stored.Status != pulsetype.StatusPending {
		return pulsetype.ErrLeaseLost
	}
	stored.LeaseOwner, stored.FencingToken, stored.LeasedUntil = "", "", nil
	return nil
}

// renew is a lease.RenewFunc over the store, as mongo's Renew: a lease is lost unless its attempt is
// pending under its token; with fail set, every renewal fails as a database that does not answer.
func (s *memStore) renew(fail error) lease.RenewFunc {
	return func(_ context.Context, ls []pulsetype.LeaseKey) (lost []pulsetype.LeaseKey, err error) {
		s.called("Renew")
		if fail != nil {
			return nil, fail
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, l := range ls {
			if a, ok := s.attempts[l.AttemptID]; !ok || a.FencingToken != l.Token || a.Status != pulsetype.StatusPending {
				lost = append(lost, l)
			}
		}
		return lost, nil
	}
}

func (s *memStore) FinishAttempts(_ context.Context, cs []pulsetype.Completion) ([]bool, error) {
	s.called("FinishAttempts")
	if s.finishing != nil {
		s.finishing <- len(cs)
	}
	if s.finishGate != nil {
		<-s.finishGate
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ok := make([]bool, len(cs))
	ids := make([]string, len(cs))
	for i, c := range cs {
		ids[i] = c.Attempt.ID
		stored, found := s.attempts[c.Attempt.ID]
		if !found || stored.Status != pulsetype.StatusPending || stored.FencingToken != c.Attempt.FencingToken {
			continue
		}
		stored.Status, stored.Error, stored.HTTPStatus, stored.Terminal = c.Result.Status, c.Result.Error, c.Result.HTTPStatus, c.Result.Terminal
		stored.LeasedUntil = nil
		ok[i] = true
	}
	s.finished = append(s.finished, ids)
	return ok, nil
}

func (s *memStore) FollowUps(_ context.Context, cs []pulsetype.Completion) error {
	s.called("FollowUps")
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range cs {
		d := s.deliveries[c.Attempt.DeliveryID]
		if d == nil {
			continue
		}
		if c.Next.Retry {
			s.createLocked(d.DeliveryRef, c.Attempt.Number+1, c.Next.Delay)
			continue
		}
		d.status = c.Next.EndStatus
	}
	return nil
}

// lookup counts call and returns m[key] (m is one of s's maps, read under s.mu), or ErrNotFound.
func lookup[T any](s *memStore, call string, m map[string]T, key string) (T, error) {
	s.called(call)
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := m[key]
	if !ok {
		return v, pulsetype.ErrNotFound
	}
	return v, nil
}

func (s *memStore) GetEvent(_ context.Context, id string) (*pulsetype.Event, error) {
	return lookup(s, "GetEvent", s.events, id)
}

func (s *memStore) GetEvents(_ context.Context, ids []string) (map[string]*pulsetype.Event, error) {
	s.called("GetEvents")
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]*pulsetype.Event{}
	for _, id := range ids {
		if e, ok := s.events[id]; ok {
			out[id] = e
		}
	}
	return out, nil
}

func (s *memStore) ListEndpoints(context.Context) ([]*pulsetype.Endpoint, error) {
	s.called("ListEndpoints")
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*pulsetype.Endpoint
	for _, ep := range s.endpoints {
		out = append(out, ep)
	}
	return out, nil
}

func (s *memStore) GetEndpoint(_ context.Context, group string) (*pulsetype.Endpoint, error) {
	return lookup(s, "GetEndpoint", s.endpoints, group)
}

func (s *memStore) InactiveGroups(_ context.Context, groups []string) (map[string]bool, error) {
	s.called("InactiveGroups")
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]bool{}
	for _, g := range groups {
		if ep, ok := s.endpoints[g]; ok && !ep.Active() {
			out[g] = true
		}
	}
	return out, nil
}

// setState replaces group's endpoint by a copy in state (the cache may hold the old one).
func (s *memStore) setState(group string, state pulsetype.EndpointState, reason pulsetype.StateReason) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := *s.endpoints[group]
	c.State, c.StateReason = state, reason
	s.endpoints[group] = &c
}

func (s *memStore) DisableEndpoint(_ context.Context, group string, reason pulsetype.StateReason, _ time.Time) (bool, error) {
	s.called("DisableEndpoint")
	s.mu.Lock()
	ep, ok := s.endpoints[group]
	s.mu.Unlock()
	if !ok || !ep.Active() {
		return false, nil
	}
	s.setState(group, pulsetype.EndpointDisabled, reason)
	return true, nil
}

func (s *memStore) RecordHealth(_ context.Context, failed map[string]time.Duration, _ []string) ([]string, error) {
	s.called("RecordHealth")
	return nil, nil
}

// delivery returns the status of a delivery and how many attempts it has.
func (s *memStore) delivery(id string) (pulsetype.Status, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, a := range s.attempts {
		if a.DeliveryID == id {
			n++
		}
	}
	if d, ok := s.deliveries[id]; ok {
		return d.status, n
	}
	return "", n
}

func (s *memStore) times() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.polls...)
}

// noReconciler is a Reconciler with nothing to reap or repair.
type noReconciler struct{}

func (noReconciler) Reap(context.Context) (bool, error)  { return false, nil }
func (noReconciler) Repair(context.Context) (int, error) { return 0, nil }

// idleKeeper returns a lease keeper that is never started: attempts are held and released, never renewed.
func idleKeeper() *lease.Keeper {
	return lease.NewKeeper(func(context.Context, []pulsetype.LeaseKey) ([]pulsetype.LeaseKey, error) { return nil, nil },
		time.Minute, nil, zerolog.Nop())
}

// sender is a Sender that answers with answer (success when nil), records each request, and, when gate is
// set, holds every POST until a value is received from gate or the request's context ends.
type sender struct {
	answer func(webhook.Request) webhook.Result
	gate   chan struct{}

	mu       sync.Mutex
	requests []webhook.Request
	inflight map[string]int // POSTs running, by consumer group
	peak     map[string]int // most POSTs running at once, by consumer group
	running  int
	peakAll  int
}

func (s *sender) Send(ctx context.Context, r webhook.Request) webhook.Result {
	s.mu.Lock()
	if s.inflight == nil {
		s.inflight, s.peak = map[string]int{}, map[string]int{}
	}
	s.requests = append(s.requests, r)
	s.inflight[r.ConsumerGroup]++
	s.running++
	s.peak[r.ConsumerGroup] = max(s.peak[r.ConsumerGroup], s.inflight[r.ConsumerGroup])
	s.peakAll = max(s.peakAll, s.running)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.inflight[r.ConsumerGroup]--
		s.running--
		s.mu.Unlock()
	}()
	if s.gate != nil {
		select {
		case <-s.gate:
		case <-ctx.Done():
			return webhook.Result{Outcome: webhook.OutcomeRetry, Message: "cancelled"}
		}
	}
	if s.answer != nil {
		return s.answer(r)
	}
	return webhook.Result{Outcome: webhook.OutcomeSuccess, HTTPStatus: 200}
}

// peaks returns the most POSTs that ran at once, in all and by consumer group.
func (s *sender) peaks() (int, map[string]int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peakAll, maps.Clone(s.peak)
}

// posts returns how many POSTs started, and how many run now.
func (s *sender) posts() (started, running int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.requests), s.running
}
