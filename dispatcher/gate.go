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
	asked   map[string][]gateQuestion // questions for the next read, by group
	reading bool
}

type gateAnswer struct {
	inactive bool
	err      error
}

func newStateGate(store stateStore) *stateGate {
	return &stateGate{store: store, asked: map[string][]gateQuestion{}}
}

// ask asks about each of groups at once, so that one read answers them all (a batch of launches asks before
// it starts its POSTs), and returns the pending answers in the order of groups: each is read after this call
// began.
func (g *stateGate) ask(ctx context.Context, groups []string) []gateQuestion {
	out := make([]gateQuestion, len(groups))
	g.mu.Lock()
	for i, group := range groups {
		out[i] = make(gateQuestion, 1)
		g.asked[group] = append(g.asked[group], out[i])
	}
	start := !g.reading
	g.reading = true
	g.mu.Unlock()
	if start {
		go g.read(context.WithoutCancel(ctx))
	}
	return out
}

// gateQuestion is a question asked of the state gate; its answer arrives once.
type gateQuestion chan gateAnswer

// wait blocks until the answer arrived or ctx ended, and returns whether the group is paused or disabled and
// the read's error.
func (q gateQuestion) wait(ctx context.Context) (bool, error) {
	select {
	case a := <-q:
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
		g.asked = map[string][]gateQuestion{}
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
// by the cached ep or by a fresh read (the answer to asked when the launch asked already, else to a question
// asked now). A failed read leaves the cached answer.
func (e *executor) active(ctx context.Context, ep *pulsetype.Endpoint, group string, asked gateQuestion) bool {
	if !ep.Active() {
		return false
	}
	if e.gate == nil {
		return true
	}
	if asked == nil {
		asked = e.gate.ask(ctx, []string{group})[0]
	}
	off, err := asked.wait(ctx)
	if err != nil {
		e.log.Warn().Err(err).Str("consumer_group", group).Msg("reading the endpoint state before a POST failed: the cached state counts")
		return true
	}
	return !off
}
