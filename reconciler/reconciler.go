package reconciler

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// Store is the storage the reconciler needs; package mongo implements it.
type Store interface {
	FollowUpStore
	ReapOne(ctx context.Context) (*pulsetype.Attempt, error)
	// QueuedDeliveries reads one page of the queue of pending work after afterID (by delivery id), at most
	// limit deliveries; it only reads: the corrections it finds due are in the page's Repairs.
	QueuedDeliveries(ctx context.Context, afterID string, limit int) (pulsetype.QueuedPage, error)
	// RepairQueue makes the corrections a QueuedDeliveries read found due.
	RepairQueue(ctx context.Context, r pulsetype.QueueRepairs) error
	FanOutStale(ctx context.Context, age time.Duration, limit int) (int, error)
	Backfill(ctx context.Context, owner string, batch int) (int, error)
	GetEndpoint(ctx context.Context, group string) (*pulsetype.Endpoint, error)
	EndPending(ctx context.Context, p pulsetype.EndPendingParams) error
}

// Observer is told about each recovery; metrics and tests hook in here. Nil methods are fine to skip.
type Observer interface {
	WorkerLost(group string)
	Reconciled(kind string)
}

// FailureObserver is an Observer that is also told of each delivery the reconciler ended in error for a
// reason of the receiver's (not an Ended code): a reaped attempt (worker_lost) with no retry left or past
// its retry window, or an errored attempt whose delivery a crash left pending. It is told once, by the
// replica whose write ended the delivery: attempt a ended with res, and end is the delivery's error. The
// sidecar's observer publishes pulse.delivery.failed with it, as the dispatcher's does for the deliveries
// it ends (dispatcher.FailureObserver).
type FailureObserver interface {
	DeliveryFailed(a *pulsetype.Attempt, res pulsetype.AttemptResult, end *pulsetype.ErrorInfo)
}

// Kinds of repairs, as reported to Observer.Reconciled and in logs.
const (
	KindMissingFirstAttempt = "missing_first_attempt"
	KindUnfinishedSuccess   = "unfinished_success"
	KindMissingRetry        = "missing_retry"
	KindUnfinishedError     = "unfinished_error"
	KindInterruptedFanOut   = "interrupted_fanout"
	KindDeletedGroup        = "deleted_group" // pending deliveries of a group whose delete did not finish
)

// BatchSize is how many pending deliveries one repair pass examines.
const BatchSize = 100

// Reconciler reaps expired leases and repairs partial states. It is safe for concurrent use; each method
// does a bounded amount of work and returns.
type Reconciler struct {
	store        Store
	owner        string
	leaseTimeout time.Duration
	observer     Observer
	log          zerolog.Logger

	mu     sync.Mutex
	cursor string // last delivery id examined by the repair scan; wraps to "" at the end
}

// New returns a Reconciler. owner is this process's lease owner id (for discovery leases); leaseTimeout is also
// the age after which a still-marked event counts as an interrupted fan-out. observer may be nil.
func New(store Store, owner string, leaseTimeout time.Duration, observer Observer, log zerolog.Logger) *Reconciler {
	return &Reconciler{store: store, owner: owner, leaseTimeout: leaseTimeout, observer: observer, log: log.With().Str("component", "reconciler").Logger()}
}

// policy returns the consumer group's retry policy; a group without endpoint gets no retries.
func (r *Reconciler) policy(ctx context.Context, group string) (pulsetype.RetryPolicy, error) {
	ep, err := r.store.GetEndpoint(ctx, group)
	if errors.Is(err, pulsetype.ErrNotFound) {
		return pulsetype.RetryPolicy{}, nil
	}
	if err != nil {
		return pulsetype.RetryPolicy{}, err
	}
	return ep.Policy(), nil
}

// Reap turns one expired attempt into error/worker_lost and follows up: at-least-once creates exactly the
// next numbered attempt, at-most-once (or no retries left) ends the delivery. It returns whether it reaped
// one.
func (r *Reconciler) Reap(ctx context.Context) (bool, error) {
	a, err := r.store.ReapOne(ctx)
	if err != nil || a == nil {
		return false, err
	}
	policy, err := r.policy(ctx, a.ConsumerGroup)
	if err != nil {
		return true, err
	}
	res := pulsetype.AttemptResult{Status: pulsetype.StatusError, Error: a.Error}
	step, err := FollowUp(ctx, r.store, a, res, policy)
	if err != nil {
		return true, fmt.Errorf("follow up reaped attempt: %w", err)
	}
	if r.observer != nil {
		r.observer.WorkerLost(a.ConsumerGroup)
	}
	r.failed(a, res, step)
	r.log.Error().Str("consumer_group", a.ConsumerGroup).Str("event_id", a.EventID).Str("delivery_id", a.DeliveryID).
		Int("attempt", a.Number).Str("error_code", string(pulsetype.CodeWorkerLost)).Str("lease_owner", a.LeaseOwner).
		Bool("retry", step.Retry).Msg("lease expired: attempt recorded as worker_lost")
	return true, nil
}

// Repair examines the pending deliveries among the next BatchSize queued ones (the store's queue of pending
// work, with the attempts it holds of each) and repairs each partial state it finds, fans out events whose
// fan-out was interrupted more than one lease timeout ago, and advances the backfill of an earliest-offset
// consumer group. It returns how many repairs and backfilled deliveries it made. Repeated calls walk all
// pending deliveries and start over; none reads the retained history.
//
// The three steps are independent: one that fails (say, an endpoint this replica cannot decrypt) does not
// keep the others from running; their errors are joined.
func (r *Reconciler) Repair(ctx context.Context) (int, error) {
	repaired, errRepair := r.repairDeliveries(ctx)
	n, err := r.store.FanOutStale(ctx, r.leaseTimeout, BatchSize)
	var errFanOut error
	if err != nil {
		errFanOut = fmt.Errorf("fan out stale events: %w", err)
	}
	if n > 0 {
		r.report(KindInterruptedFanOut, nil, n)
	}
	backfilled, err := r.store.Backfill(ctx, r.owner, BatchSize)
	var errBackfill error
	if err != nil && !errors.Is(err, pulsetype.ErrLeaseLost) {
		errBackfill = fmt.Errorf("backfill: %w", err)
	}
	return repaired + n + backfilled, errors.Join(errRepair, errFanOut, errBackfill)
}

func (r *Reconciler) repairDeliveries(ctx context.Context) (int, error) {
	r.mu.Lock()
	after := r.cursor
	r.mu.Unlock()
	page, err := r.store.QueuedDeliveries(ctx, after, BatchSize)
	if err != nil {
		return 0, err
	}
	// The queue's own leftovers first (documents that stand for nothing, stale lease copies), so that claims
	// and the reaper see the queue as the history says.
	if err := r.store.RepairQueue(ctx, page.Repairs); err != nil {
		return 0, err
	}
	deliveries, attempts := page.Deliveries, page.Attempts
	r.mu.Lock()
	r.cursor = page.Next
	r.mu.Unlock()
	if len(deliveries) == 0 {
		return 0, nil
	}
	// Each group's endpoint is read once per pass: its retry policy serves every repair below, and a group
	// deleted by a delete that failed or crashed before ending its pending deliveries has them ended now.
	policies, gone, ended := map[string]pulsetype.RetryPolicy{}, map[string]bool{}, 0
	for _, d := range deliveries {
		if _, seen := gone[d.ConsumerGroup]; seen {
			continue
		}
		ep, err := r.store.GetEndpoint(ctx, d.ConsumerGroup)
		gone[d.ConsumerGroup] = errors.Is(err, pulsetype.ErrNotFound)
		if err != nil && !errors.Is(err, pulsetype.ErrNotFound) {
			return 0, err
		}
		if ep != nil {
			policies[d.ConsumerGroup] = ep.Policy()
		}
		if gone[d.ConsumerGroup] {
			if err := r.store.EndPending(ctx, pulsetype.EndPendingParams{ConsumerGroup: d.ConsumerGroup,
				Error: pulsetype.ErrorInfo{Code: pulsetype.CodeEndpointDeleted, Message: "the consumer group was deleted"}}); err != nil {
				return 0, err
			}
			r.report(KindDeletedGroup, d, 1)
			ended++
		}
	}
	deliveries = slices.DeleteFunc(deliveries, func(d *pulsetype.Delivery) bool { return gone[d.ConsumerGroup] })
	if len(deliveries) == 0 {
		return ended, nil
	}
	repaired := ended
	for _, d := range deliveries {
		did, err := r.repairOne(ctx, d, attempts[d.ID], policies[d.ConsumerGroup])
		if err != nil {
			return repaired, err
		}
		if did {
			repaired++
		}
	}
	return repaired, nil
}

// repairOne repairs one pending delivery given its attempts in order and its group's retry policy.
func (r *Reconciler) repairOne(ctx context.Context, d *pulsetype.Delivery, attempts []*pulsetype.Attempt, policy pulsetype.RetryPolicy) (bool, error) {
	if len(attempts) == 0 { // a reopened delivery's earlier attempts are not queued: its next is reopenedAttempt
		n, kind := 1, KindMissingFirstAttempt
		if d.ReopenedAttempt > 0 {
			n, kind = d.ReopenedAttempt, KindMissingRetry
		}
		created, err := r.store.CreateAttempt(ctx, d.Ref(), n, 0)
		if created {
			r.report(kind, d, 1)
		}
		return created, err
	}
	last := attempts[len(attempts)-1]
	if last.Status == pulsetype.StatusPending {
		return false, nil
	}
	if d.ReopenedAttempt > last.Number { // a retry or replay reopened it and stopped before the attempt
		created, err := r.store.CreateAttempt(ctx, d.Ref(), d.ReopenedAttempt, 0)
		if created {
			r.report(KindMissingRetry, d, 1)
		}
		return created, err
	}
	res := pulsetype.AttemptResult{Status: last.Status, Error: last.Error, Terminal: last.Terminal, RetryAfter: last.RetryAfter}
	step, err := FollowUp(ctx, r.store, last, res, policy)
	if err != nil || !step.Created {
		return false, err
	}
	kind := KindUnfinishedSuccess
	switch {
	case last.Status == pulsetype.StatusError && step.Retry:
		kind = KindMissingRetry
	case last.Status == pulsetype.StatusError:
		kind = KindUnfinishedError
	}
	r.report(kind, d, 1)
	r.failed(last, res, step)
	return true, nil
}

// failed tells the FailureObserver of a delivery that step ended in error, when this call's write ended it
// and not for an Ended code.
func (r *Reconciler) failed(a *pulsetype.Attempt, res pulsetype.AttemptResult, step Step) {
	fo, ok := r.observer.(FailureObserver)
	if !ok || !step.Ended || !step.Created || step.EndStatus != pulsetype.StatusError {
		return
	}
	end := cmp.Or(step.EndError, res.Error)
	if end == nil || end.Code.Ended() {
		return
	}
	fo.DeliveryFailed(a, res, end)
}

func (r *Reconciler) report(kind string, d *pulsetype.Delivery, n int) {
	if r.observer != nil {
		for range n {
			r.observer.Reconciled(kind)
		}
	}
	ev := r.log.Warn().Str("kind", kind)
	if d != nil {
		ev = ev.Str("consumer_group", d.ConsumerGroup).Str("event_id", d.EventID).Str("delivery_id", d.ID)
	} else {
		ev = ev.Int("count", n)
	}
	ev.Msg("recovered partial state")
}
