package opsevents

import (
	"cmp"
	"context"
	"math/rand/v2"
	"time"

	"github.com/rs/zerolog"

	"github.com/pulse-sidecar/pulse/internal/startstop"
	"github.com/pulse-sidecar/pulse/pulsetype"
)

// DefaultBacklogInterval is the period of the backlog check.
const DefaultBacklogInterval = 15 * time.Second

// BacklogStore is the storage the BacklogWatcher needs: *mongo.Store implements it.
type BacklogStore interface {
	ListEndpoints(ctx context.Context) ([]*pulsetype.Endpoint, error)
	// OldestPending returns each group's oldest pending createdAt, bounded in cost by the number of groups.
	OldestPending(ctx context.Context) (map[string]time.Time, error)
	// SetBacklogHigh records the alert's state and reports whether this call changed it.
	SetBacklogHigh(ctx context.Context, group string, high bool) (bool, error)
}

// BacklogWatcher publishes pulse.backlog.high for each endpoint with a backlogAlertAfter: {consumerGroup,
// high: true, oldestPendingAt, ageSeconds, threshold, at} when its oldest pending delivery becomes older
// than the threshold, and {high: false, …} when it no longer is (drained, or younger). Every interval
// (jittered) it reads the endpoints and the oldest pending deliveries (one index key per group); the state
// is kept in the database and flipped with a conditional write, so of several replicas one publishes each
// change. A failed check is logged and tried again the next interval.
type BacklogWatcher struct {
	store    BacklogStore
	emit     func(topic, group string, data map[string]any)
	interval time.Duration
	now      func() time.Time
	log      zerolog.Logger
	run      startstop.Base
}

// NewBacklogWatcher returns a watcher that publishes through e; interval 0 is DefaultBacklogInterval and a
// nil now is time.Now (it should be the database's clock: the ages are of the database's createdAt).
func NewBacklogWatcher(store BacklogStore, e *Emitter, interval time.Duration, now func() time.Time, log zerolog.Logger) *BacklogWatcher {
	if now == nil {
		now = time.Now
	}
	w := &BacklogWatcher{store: store, interval: cmp.Or(interval, DefaultBacklogInterval), now: now,
		log: log.With().Str("component", "backlog-watcher").Logger()}
	w.emit = func(topic, group string, data map[string]any) { e.publishNow(topic, group, data) }
	return w
}

// Start runs the checks in a goroutine and returns at once (startstop.ErrStarted when running already).
func (w *BacklogWatcher) Start(ctx context.Context) error {
	return w.run.StartTicking(ctx, rand.N(w.interval), func() time.Duration { return pulsetype.Jittered(w.interval) }, w.once)
}

// Stop ends the checks and blocks until their goroutine returned; safe twice and before Start.
func (w *BacklogWatcher) Stop() { w.run.Stop() }

func (w *BacklogWatcher) once(ctx context.Context) {
	if err := w.Check(ctx); err != nil && ctx.Err() == nil {
		w.log.Warn().Err(err).Msg("checking backlogs failed")
	}
}

// Check runs one check: it raises or clears each alerting endpoint's pulse.backlog.high as its oldest
// pending delivery's age says, publishing the changes this call made.
func (w *BacklogWatcher) Check(ctx context.Context) error {
	eps, err := w.store.ListEndpoints(ctx)
	if err != nil {
		return err
	}
	var alerting []*pulsetype.Endpoint
	for _, ep := range eps {
		if ep.BacklogAlertAfter > 0 {
			alerting = append(alerting, ep)
		}
	}
	if len(alerting) == 0 {
		return nil
	}
	oldest, err := w.store.OldestPending(ctx)
	if err != nil {
		return err
	}
	now := w.now()
	for _, ep := range alerting {
		threshold := time.Duration(ep.BacklogAlertAfter)
		at, pending := oldest[ep.ConsumerGroup]
		high := pending && now.Sub(at) > threshold
		changed, err := w.store.SetBacklogHigh(ctx, ep.ConsumerGroup, high)
		if err != nil {
			return err
		}
		if !changed {
			continue
		}
		data := map[string]any{"consumerGroup": ep.ConsumerGroup, "high": high, "threshold": threshold.String(),
			"at": pulsetype.FormatTime(now), "count": 1}
		if pending {
			data["oldestPendingAt"] = pulsetype.FormatTime(at)
			data["ageSeconds"] = max(0, now.Sub(at).Seconds())
		}
		w.emit(pulsetype.TopicBacklogHigh, ep.ConsumerGroup, data)
	}
	return nil
}
