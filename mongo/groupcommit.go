package mongo

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// maxGroupCommit bounds the events one group commit writes.
const maxGroupCommit = 256

// groupCommitTimeout bounds one group commit's round of commands: it runs for every caller in it, so no one
// caller's context ends it.
const groupCommitTimeout = time.Minute

// groupCommit writes concurrent publishes of one event each together (Store.Publish). A caller that finds no
// round running starts one, in a goroutine, that writes the events queued so far (its own first) in one round
// (publishRound); calls that arrive meanwhile queue for the next round, which the round before starts in a
// goroutine of its own. Each call returns once its own event's outcome is known or its context ends. Events with an id already queued wait
// for a later round, so a round holds distinct ids. A round that found no server (the driver's server
// selection timeout, PULSE_DATABASE_TIMEOUT, passed) answers the calls queued meanwhile with its error too:
// a round of their own would wait that timeout again, so a call would answer only after up to twice the
// bound the API documents for an unreachable database. It is safe for concurrent use.
type groupCommit struct {
	store *Store

	mu      sync.Mutex
	queued  []*publishCall
	running bool // a round is being written
}

// publishCall is one caller's event and where its outcome goes.
type publishCall struct {
	event *pulsetype.Event
	tries int
	done  chan publishOutcome // buffered: the round never waits for the caller
}

// publish stores e as part of the next round and returns its outcome: the published event (Existing when the
// id was published before with the same content), pulsetype.ErrIDConflict, or the database's error. It
// blocks until the outcome is known or ctx ends; a round already under way completes without the caller.
func (g *groupCommit) publish(ctx context.Context, e *pulsetype.Event) (pulsetype.Published, error) {
	g.store.stamp([]*pulsetype.Event{e})
	c := &publishCall{event: e, done: make(chan publishOutcome, 1)}
	g.mu.Lock()
	g.queued = append(g.queued, c)
	start := !g.running
	g.running = true
	g.mu.Unlock()
	if start {
		// In a goroutine of its own, so that this caller, too, answers when its context ends (a publish
		// bounded by PULSE_DATABASE_TIMEOUT on a connection that never answers); the round goes on for the
		// others within groupCommitTimeout.
		go g.round(context.WithoutCancel(ctx))
	}
	select {
	case o := <-c.done:
		return o.published, o.err
	case <-ctx.Done():
		return pulsetype.Published{}, wrap("publish", ctx.Err())
	}
}

// round writes one round of the queued events and answers their calls, then starts the next round in a
// goroutine when events are queued, or marks that none runs.
func (g *groupCommit) round(ctx context.Context) {
	g.mu.Lock()
	var batch, rest []*publishCall
	ids := map[string]bool{}
	for _, c := range g.queued {
		if len(batch) < maxGroupCommit && !ids[c.event.ID] {
			ids[c.event.ID] = true
			batch = append(batch, c)
		} else {
			rest = append(rest, c)
		}
	}
	g.queued = rest
	g.mu.Unlock()

	events := make([]*pulsetype.Event, len(batch))
	for i, c := range batch {
		events[i] = c.event
	}
	roundCtx, cancel := context.WithTimeout(ctx, groupCommitTimeout)
	outcomes, err := g.store.publishRound(roundCtx, events, false)
	cancel()
	var again []*publishCall
	for i, c := range batch {
		o := publishOutcome{err: err}
		if err == nil {
			o = outcomes[i]
		}
		if c.tries++; errors.Is(o.err, errPublishRace) && c.tries < maxPublishTries {
			again = append(again, c)
			continue
		}
		if errors.Is(o.err, errPublishRace) {
			o.err = errors.New("publish: concurrent publishes of the same id kept colliding")
		}
		c.done <- o
	}

	g.mu.Lock()
	g.queued = append(again, g.queued...)
	if noServer(err) {
		for _, c := range g.queued {
			c.done <- publishOutcome{err: err}
		}
		g.queued = nil
	}
	next := len(g.queued) > 0
	g.running = next
	g.mu.Unlock()
	if next {
		go g.round(ctx)
	}
}
