package dispatcher

import (
	"context"
	"maps"
	"slices"
	"sync"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// stateStore is the part of Store the state gate reads.
type stateStore interface {
	InactiveGroups(ctx context.Context, groups []string) (map[string]bool, error)
}

// stateGate tells the executor, right before a POST, whether the attempt's consumer group is paused or
// disabled, with a read that began after the question was asked: so no attempt leased after a pause
// answered is POSTed by any replica. Questions asked while a read runs share the next read (group commit,
// as the completer does), so a batch of launches costs one or two queries. It is safe for concurrent use.
type stateGate struct {
	store stateStore

	mu      sync.Mutex
	asked   map[string][]chan gateAnswer // questions for the next read, by group
	reading bool
}

type gateAnswer struct {
	inactive bool
	err      error
}

func newStateGate(store stateStore) *stateGate {
	return &stateGate{store: store, asked: map[string][]chan gateAnswer{}}
}

// inactive reports whether group is paused or disabled, read after the call began. It blocks until that read
// returned or ctx ended, and returns the read's error.
func (g *stateGate) inactive(ctx context.Context, group string) (bool, error) {
	answer := make(chan gateAnswer, 1)
	g.mu.Lock()
	g.asked[group] = append(g.asked[group], answer)
	start := !g.reading
	g.reading = true
	g.mu.Unlock()
	if start {
		go g.read(context.WithoutCancel(ctx))
	}
	select {
	case a := <-answer:
		return a.inactive, a.err
	case <-ctx.Done():
		return false, context.Cause(ctx)
	}
}

// read answers the questions asked so far with one query, then those asked meanwhile, until none is left.
func (g *stateGate) read(ctx context.Context) {
	for {
		g.mu.Lock()
		asked := g.asked
		if len(asked) == 0 {
			g.reading = false
			g.mu.Unlock()
			return
		}
		g.asked = map[string][]chan gateAnswer{}
		g.mu.Unlock()
		rctx, cancel := context.WithTimeout(ctx, writeTimeout)
		off, err := g.store.InactiveGroups(rctx, slices.Collect(maps.Keys(asked)))
		cancel()
		for group, answers := range asked {
			for _, a := range answers {
				a <- gateAnswer{inactive: off[group], err: err}
			}
		}
	}
}

// active is the gate's check for one leased attempt of ep's group: false when it is paused or disabled,
// by the cached ep or by a fresh read. A failed read leaves the cached answer.
func (e *executor) active(ctx context.Context, ep *pulsetype.Endpoint, group string) bool {
	if !ep.Active() {
		return false
	}
	if e.gate == nil {
		return true
	}
	off, err := e.gate.inactive(ctx, group)
	if err != nil {
		e.log.Warn().Err(err).Str("consumer_group", group).Msg("reading the endpoint state before a POST failed: the cached state counts")
		return true
	}
	return !off
}
