package mongo

import (
	"context"
	"time"

	"github.com/rs/zerolog"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/pulse-sidecar/pulse/internal/startstop"
	"github.com/pulse-sidecar/pulse/pulsetype"
)

// EventWatcher is the change-stream watcher: it runs a change stream on the events collection and calls
// wake for every inserted or committed event. Change streams only wake sleeping dispatchers
// (docs/delivery.md): polling and reconciliation still guarantee progress, so a missed notification loses
// nothing. When the stream fails (or cannot be opened) the error is logged and the stream reopened after the
// retry interval (jittered).
type EventWatcher struct {
	store *Store
	retry time.Duration
	wake  func()
	log   zerolog.Logger
	run   startstop.Base
}

// NewEventWatcher returns an EventWatcher of s's events collection; wake must not block.
func NewEventWatcher(s *Store, retry time.Duration, wake func(), log zerolog.Logger) *EventWatcher {
	return &EventWatcher{store: s, retry: retry, wake: wake, log: log.With().Str("component", "change-stream").Logger()}
}

// Start runs the watcher in a goroutine and returns at once; it returns startstop.ErrStarted when the
// watcher runs already.
func (w *EventWatcher) Start(ctx context.Context) error { return w.run.StartGo(ctx, w.watch) }

// Stop closes the stream and blocks until the watcher's goroutine returned. It is safe twice and before
// Start.
func (w *EventWatcher) Stop() { w.run.Stop() }

func (w *EventWatcher) watch(ctx context.Context) {
	// The watcher only wakes the dispatcher: each change is projected to its resume token (_id) and kind, so
	// no event's body (fullDocument of an insert, up to 16 MiB) is shipped to every replica, and an event near
	// the 16 MiB limit cannot make its change event too large for the stream.
	pipeline := mongo.Pipeline{
		{{Key: "$match", Value: bson.M{"operationType": bson.M{"$in": bson.A{"insert", "update"}}}}},
		{{Key: "$project", Value: bson.M{"operationType": 1}}},
	}
	for ctx.Err() == nil {
		stream, err := w.store.events.Watch(ctx, pipeline)
		if err == nil {
			for stream.Next(ctx) {
				w.wake()
			}
			err = stream.Err()
			_ = stream.Close(context.WithoutCancel(ctx))
		}
		if ctx.Err() != nil {
			return
		}
		w.log.Error().Err(err).Dur("retry_in", w.retry).Msg("change stream failed; polling continues and the stream is reopened")
		select {
		case <-ctx.Done():
			return
		case <-time.After(pulsetype.Jittered(w.retry)):
		}
	}
}
