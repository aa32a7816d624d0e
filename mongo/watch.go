package mongo

import (
	"context"
	"errors"
	"time"

	"github.com/rs/zerolog"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/pulse-sidecar/pulse/internal/startstop"
	"github.com/pulse-sidecar/pulse/pulsetype"
)

// ChangeStreamState is what the EventWatcher's stream is doing, as it reports it (EventWatcher.Report): the
// values of pulse_change_stream_state's state label.
type ChangeStreamState string

const (
	ChangeStreamOpen         ChangeStreamState = "open"         // the stream is open: publishes wake the dispatcher
	ChangeStreamFailed       ChangeStreamState = "failed"       // it failed or did not open: polling only, reopened after the retry interval
	ChangeStreamUnauthorized ChangeStreamState = "unauthorized" // the user lacks the changeStream action: polling only, retried every UnauthorizedRetry
)

// ChangeStreamStates lists the ChangeStreamState values.
var ChangeStreamStates = []ChangeStreamState{ChangeStreamOpen, ChangeStreamFailed, ChangeStreamUnauthorized}

// UnauthorizedRetry is how often the EventWatcher retries a stream the server refused with Unauthorized
// (code 13: the user's roles lack the changeStream action, or find, on the events collection): a role granted
// later takes effect within it, without a restart.
const UnauthorizedRetry = time.Minute

// codeUnauthorized is the server's error code of a command the user's roles do not allow (MongoDB's
// error codes, Unauthorized).
const codeUnauthorized = 13

// EventWatcher is the change-stream watcher: it runs a change stream on the events collection and calls
// wake for each change that makes an event deliverable: an insert of a visible event (not staged) and the
// commit of a staged one (the update that removes its staged mark); the fan-out's clear of an event's fanout
// mark, which wakes nothing, is not matched. Change streams only wake sleeping dispatchers
// (docs/delivery.md): polling and reconciliation still guarantee progress, so a missed notification loses
// nothing. When the stream fails (or cannot be opened) the error is logged and the stream reopened after the
// retry interval (jittered); when the server refuses it as Unauthorized (the user lacks the changeStream
// action) one warning is logged and the stream is retried quietly every UnauthorizedRetry, the sidecar
// polling meanwhile. Report, when set before Start, sees each state change.
type EventWatcher struct {
	store  *Store
	retry  time.Duration
	wake   func()
	log    zerolog.Logger
	run    startstop.Base
	report func(ChangeStreamState)
	denied time.Duration // the retry after an Unauthorized refusal: UnauthorizedRetry (tests shorten it)
}

// NewEventWatcher returns an EventWatcher of s's events collection; wake must not block.
func NewEventWatcher(s *Store, retry time.Duration, wake func(), log zerolog.Logger) *EventWatcher {
	return &EventWatcher{store: s, retry: retry, wake: wake, log: log.With().Str("component", "change-stream").Logger(),
		report: func(ChangeStreamState) {}, denied: UnauthorizedRetry}
}

// Report makes the watcher call f with its stream's state each time it changes (f must not block); call it
// before Start.
func (w *EventWatcher) Report(f func(ChangeStreamState)) { w.report = f }

// Start runs the watcher in a goroutine and returns at once; it returns startstop.ErrStarted when the
// watcher runs already.
func (w *EventWatcher) Start(ctx context.Context) error { return w.run.StartGo(ctx, w.watch) }

// Stop closes the stream and blocks until the watcher's goroutine returned. It is safe twice and before
// Start.
func (w *EventWatcher) Stop() { w.run.Stop() }

// watchPipeline is the change stream's pipeline after $changeStream: the changes that make an event
// deliverable, each projected to its resume token (_id) and kind, so that no event's body (fullDocument of an
// insert, up to 16 MiB) is shipped to every replica, and an event near the 16 MiB limit cannot make its change
// event too large for the stream. An insert of a staged event (an array's, invisible until its commit) and
// the fan-out's $unset of fanout (ClearFanOut) wake nothing; the commit ($unset of staged, commitEvents) does.
func watchPipeline() mongo.Pipeline {
	return mongo.Pipeline{
		{{Key: "$match", Value: bson.M{"$or": bson.A{
			bson.M{"operationType": "insert", "fullDocument.staged": bson.M{"$ne": true}},
			bson.M{"operationType": "update", "updateDescription.removedFields": "staged"},
		}}}},
		{{Key: "$project", Value: bson.M{"operationType": 1}}},
	}
}

func (w *EventWatcher) watch(ctx context.Context) {
	pipeline := watchPipeline()
	var state ChangeStreamState
	set := func(s ChangeStreamState) {
		if s != state {
			state = s
			w.report(s)
		}
	}
	warned := false
	for ctx.Err() == nil {
		stream, err := w.store.events.Watch(ctx, pipeline)
		if err == nil {
			if warned {
				w.log.Info().Msg("change stream opened: publishes wake the dispatcher again")
				warned = false
			}
			set(ChangeStreamOpen)
			for stream.Next(ctx) {
				w.wake()
			}
			err = stream.Err()
			_ = stream.Close(context.WithoutCancel(ctx))
		}
		if ctx.Err() != nil {
			return
		}
		retry := w.retry
		var se mongo.ServerError
		if errors.As(err, &se) && se.HasErrorCode(codeUnauthorized) {
			set(ChangeStreamUnauthorized)
			retry = w.denied
			if !warned {
				warned = true
				w.log.Warn().Err(err).Dur("retry_in", retry).Msg("the database user may not open a change stream on the events collection (it lacks the changeStream action): polling only, every PULSE_POLL_INTERVAL; grant the action (docs/mongodb-production.md) to have publishes wake the dispatcher")
			}
		} else {
			set(ChangeStreamFailed)
			w.log.Error().Err(err).Dur("retry_in", retry).Msg("change stream failed; polling continues and the stream is reopened")
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(pulsetype.Jittered(retry)):
		}
	}
}
