package dispatcher

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// lineClaimers bounds the head-of-line claims of one (group, topic) that run at once: each costs a few
// database round trips, and a group with many ordering keys would otherwise claim its lines one after another.
const lineClaimers = 8

// moved is the set of consumer groups whose head of line may have moved (an attempt ended or was created,
// or a head settles) since the loop last looked. It is safe for concurrent use.
type moved struct {
	mu     sync.Mutex
	groups map[string]bool
}

// add marks group.
func (m *moved) add(group string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.groups == nil {
		m.groups = map[string]bool{}
	}
	m.groups[group] = true
}

// take returns the marked groups and clears the set.
func (m *moved) take() map[string]bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	groups := m.groups
	m.groups = nil
	return groups
}

// claimOrdered claims the head-of-line attempt of every line (topic and ordering key) of every ordered
// consumer group that has a due, unleased head, and returns the ordered groups (the unordered claims must
// skip them). Without poll it looks only at groups whose head may have moved since the last turn.
func (l *loop) claimOrdered(ctx context.Context, poll bool) []string {
	kicked := l.moved.take()
	ordered, err := l.endpoints.orderedGroups(ctx)
	if err != nil {
		l.logErr(ctx, err, "list endpoints")
	}
	groups := make([]string, 0, len(ordered))
	for group, topics := range ordered {
		groups = append(groups, group)
		if !poll && !kicked[group] || l.endpoints.isInactive(group) {
			continue
		}
		for _, topic := range topics {
			if !l.claimLines(ctx, group, topic) {
				break
			}
		}
	}
	return groups
}

// claimLines claims the head of every line (ordering key) of an ordered group's topic that has pending
// deliveries, up to lineClaimers at once, starting at a random key so that lines past the group's free slots
// are not always the same ones. Claims in progress count against the group's slots (a claim that finds a
// head moves to in flight, one that finds none gives its slot back). It blocks until every claim it started
// has returned, and reports false when the group has no free slot left (or ctx ended).
func (l *loop) claimLines(ctx context.Context, group, topic string) bool {
	keys, err := l.store.OrderingKeys(ctx, group, topic)
	if err != nil {
		l.logErr(ctx, err, "list ordering keys")
		return true
	}
	if len(keys) == 0 {
		return true
	}
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		claiming int // claims running; guarded by mu
	)
	defer wg.Wait()
	sem := make(chan struct{}, lineClaimers)
	start := rand.IntN(len(keys))
	for i := range keys {
		sem <- struct{}{}
		for {
			mu.Lock()
			admit := l.slots.admit(group, claiming, claiming) && l.limits.allows(group, claiming)
			if admit {
				claiming++
			}
			busy := claiming
			mu.Unlock()
			if admit {
				break
			}
			if busy == 0 || ctx.Err() != nil {
				<-sem
				return false
			}
			wg.Wait() // the running claims may give their slots back
		}
		line := pulsetype.Line{ConsumerGroup: group, Topic: topic, OrderingKey: keys[(start+i)%len(keys)]}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			a, wait, err := l.store.ClaimHead(ctx, l.owner, line)
			if a != nil {
				if l.limits.take(group) {
					l.exec.launch(job{a: a})
				} else if err := l.store.ReleaseAttempt(ctx, a); err != nil { // its token went to another line
					l.logErr(ctx, err, "release head of a rate-limited line")
				}
			}
			mu.Lock()
			claiming--
			mu.Unlock()
			if err != nil {
				l.logErr(ctx, err, "claim head of line")
			}
			if wait > 0 { // the head settles by itself: look again then
				time.AfterFunc(wait, func() {
					l.moved.add(group)
					signal(l.kick)
				})
			}
		}()
	}
	return true
}
