package dispatcher

import (
	"context"
	"maps"
	"sync"
	"time"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

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
		if wait := l.roundGap(group); !poll && wait > 0 {
			l.kickAfter(group, wait)
			continue
		}
		start := time.Now()
		for _, topic := range topics {
			if !l.claimLines(ctx, group, topic) {
				break
			}
		}
		if l.lastRound == nil {
			l.lastRound = map[string]round{}
		}
		l.lastRound[group] = round{ended: time.Now(), took: time.Since(start)}
	}
	return groups
}

// round is when an ordered group's latest round of head claims ended and how long it took.
type round struct {
	ended time.Time
	took  time.Duration
}

// roundGap returns how long an ordered group's next round of head claims waits, without a poll: while
// heads this process leased in the group's latest round still run, until as long after that round as it
// took (at most maxRoundGap). A round that starts at once after another finds only the lines that finished
// during it; waiting lets the lines the last round leased finish and join the next, so a round claims the
// heads of most lines rather than rounds alternating between two shares of them. A group with nothing in
// flight here (a single line, or every head done) starts at once.
func (l *loop) roundGap(group string) time.Duration {
	last, ok := l.lastRound[group]
	if !ok || l.slots.running(group) == 0 {
		return 0
	}
	return time.Until(last.ended.Add(min(last.took, maxRoundGap)))
}

// maxRoundGap bounds roundGap.
const maxRoundGap = 250 * time.Millisecond

// kickAfter marks group moved and wakes the loop after d.
func (l *loop) kickAfter(group string, d time.Duration) {
	time.AfterFunc(d, func() {
		l.moved.add(group)
		signal(l.kick)
	})
}

// claimLines claims, in one round of the store's (ClaimHeads), the heads of the lines (ordering keys) of an
// ordered group's topic that the group's free worker slots and rate-limit tokens admit, and runs them with
// the events the round read. A group with more lines than one round reads is read on from where the
// round stopped, in the next turn. It reports false when the group has no free slot left (or ctx ended).
func (l *loop) claimLines(ctx context.Context, group, topic string) bool {
	limit := 0
	for limit < maxLineClaim && l.slots.admit(group, limit, limit) && l.limits.allows(group, limit) {
		limit++
	}
	if limit == 0 || ctx.Err() != nil {
		return false
	}
	at := [2]string{group, topic}
	claimed, err := l.store.ClaimHeads(ctx, pulsetype.ClaimHeadsParams{Owner: l.owner, ConsumerGroup: group, Topic: topic,
		Limit: limit, After: l.lineAfter[at]})
	if err != nil {
		l.logErr(ctx, err, "claim heads of lines")
	}
	if claimed.Next != nil {
		if l.lineAfter == nil {
			l.lineAfter = map[[2]string]*string{}
		}
		l.lineAfter[at] = claimed.Next
		l.moved.add(group) // the lines after it: next turn
		signal(l.kick)
	} else {
		delete(l.lineAfter, at)
	}
	if claimed.Wait > 0 { // a head settles by itself: look again then
		l.kickAfter(group, l.lookAgain(claimed))
	}
	jobs := make([]job, 0, len(claimed.Attempts))
	for _, a := range claimed.Attempts {
		if !l.limits.take(group) { // its token went to another claim meanwhile
			if err := l.store.ReleaseAttempt(ctx, a); err != nil {
				l.logErr(ctx, err, "release head of a rate-limited line")
			}
			continue
		}
		ev, known := claimed.Events[a.EventID] // one the claim did not read, the executor reads
		jobs = append(jobs, job{a: a, ev: ev, evKnown: known, token: true, release: l.exec.slots.acquire(group)})
	}
	l.exec.launchBatch(ctx, jobs)
	return l.slots.admit(group, 0, 0)
}

// foreignSettleGrace is how much later than its settle a head published through another replica is looked
// at again (lookAgain).
const foreignSettleGrace = 100 * time.Millisecond

// lookAgain returns how long after a round that found c (c.Wait > 0) the group's lines are looked at again:
// c.Wait, except that a head still settling whose event was published through another replica (not fanned
// out here lately, see fannedOut) counts foreignSettleGrace after its settle. Every replica whose round saw
// a head settling would otherwise look again at the same moment and all but one lose the claim, each at the
// cost of a whole round; the replica that published the event looks at its settle, so it claims the head
// alone, and the others find it running, or claim it themselves a grace later when that replica did not
// (it stopped, or its loop is busy). A wait for anything else (a line that moved during the look, a head
// of an earlier registration) is kept as it is.
func (l *loop) lookAgain(c pulsetype.HeadClaims) time.Duration {
	if len(c.Settling) == 0 {
		return c.Wait
	}
	var settle, wait time.Duration // the earliest settle; the wait chosen (0: none yet)
	for id, d := range c.Settling {
		settle = pulsetype.MinWait(settle, d)
		if _, here := l.settlingHere[id]; !here {
			d += foreignSettleGrace
		}
		wait = pulsetype.MinWait(wait, d)
	}
	if c.Wait < settle {
		wait = c.Wait // another kind of wait comes first
	}
	return wait
}

// fannedOut notes that an attempt of an ordered group was fanned out here at now for event id (lookAgain),
// and forgets the events noted more than settleMemory ago, at most once a settleMemory.
func (l *loop) fannedOut(id string, now time.Time) {
	if l.settlingHere == nil {
		l.settlingHere = map[string]time.Time{}
	}
	l.settlingHere[id] = now
	if now.Sub(l.prunedAt) < settleMemory {
		return
	}
	l.prunedAt = now
	maps.DeleteFunc(l.settlingHere, func(_ string, at time.Time) bool { return now.Sub(at) > settleMemory })
}

// settleMemory is how long fannedOut remembers an event: well past its settle window (an event is fanned out
// within it, unless its publisher's loop or the database stalled).
const settleMemory = 10 * time.Second
