package dispatcher

import (
	"math/rand/v2"
	"slices"
	"time"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// Bounds of the due window (dueWindow).
const (
	// minDueWindow is the limit of a window read while the reads find few due attempts (live traffic).
	minDueWindow = 64
	// maxDueWindow bounds the attempts a window holds (a few MiB): while reads keep finding a full window
	// the next one is read four times larger, up to it. A server that scans for the read (FerretDB) reads
	// the whole queue for each window, so a backlog of B pending attempts costs about B/maxDueWindow
	// documents examined per claimed attempt once the window has grown.
	maxDueWindow = 16384
	// maxDueWindowAge bounds how long a window is claimed from before it is read again (counted from when
	// the read answered, and at least dueWindowReads times as long as the read took, so that a slow read is
	// not repeated at once): attempts that became due meanwhile are less overdue than those it holds, but
	// attempts given back or reaped may be more, and the ones other replicas claimed in between cost a
	// failed pick each.
	maxDueWindowAge = time.Minute
	dueWindowReads  = 10
)

// dueWindow holds the due attempts that one read of the database found (Store.DueAttempts) and that are not
// claimed yet, most overdue first, so that a backlog is drained with one read of the queue per window and
// claims by id (Store.ClaimAttempts) rather than one read per claim; what a delivery costs then does not
// grow with the backlog on a server that scans its collections for the read. It is read again when it runs
// dry, when it is older than maxDueWindowAge, and when a consumer group it was not read for is wanted now
// (registered, resumed, no longer ordered). It is owned by the loop's goroutine.
type dueWindow struct {
	items  []*pulsetype.Attempt
	groups map[string]bool // the consumer groups it was read for; nil: every group
	readAt time.Time       // when the read answered
	took   time.Duration   // how long the read took
	limit  int             // the next read's limit
}

// covers reports whether the window, not stale at now (see maxDueWindowAge), holds the due attempts of
// every group of wanted (nil: every group) as of its read.
func (w *dueWindow) covers(wanted map[string]bool, now time.Time) bool {
	if len(w.items) == 0 || now.Sub(w.readAt) >= max(maxDueWindowAge, dueWindowReads*w.took) {
		return false
	}
	if w.groups == nil {
		return true
	}
	if wanted == nil {
		return false
	}
	for g := range wanted {
		if !w.groups[g] {
			return false
		}
	}
	return true
}

// fill replaces the window's attempts with those of a read for wanted (nil: every group) that began at
// start and answered at end, and sets the next read's limit: maxDueWindow when the read filled its limit
// (a backlog waits: on a server that scans, a read of the largest window costs what a small one does),
// else twice what it found, within [minDueWindow, the last limit].
func (w *dueWindow) fill(items []*pulsetype.Attempt, wanted map[string]bool, start, end time.Time) {
	limit := w.size()
	w.items, w.groups, w.readAt, w.took = items, wanted, end, end.Sub(start)
	if len(items) >= limit {
		w.limit = maxDueWindow
	} else {
		w.limit = min(max(2*len(items), minDueWindow), limit)
	}
}

// merge adds the attempts of a read for groups the window's attempts did not admit (the window keeps its
// read time and groups), in due order, each once.
func (w *dueWindow) merge(items []*pulsetype.Attempt) {
	have := make(map[string]bool, len(w.items))
	for _, a := range w.items {
		have[a.ID] = true
	}
	for _, a := range items {
		if !have[a.ID] {
			w.items = append(w.items, a)
		}
	}
	slices.SortStableFunc(w.items, func(a, b *pulsetype.Attempt) int { return a.NextAttemptAt.Compare(b.NextAttemptAt) })
}

// size returns the next read's limit.
func (w *dueWindow) size() int { return max(w.limit, minDueWindow) }

// keep drops the attempts of groups not in wanted (nil: every group), and narrows the groups the window
// covers to those it still holds the attempts of: a group left out now (paused, turned ordered) and wanted
// again later (resumed) is read again then, not when the window runs dry or goes stale.
func (w *dueWindow) keep(wanted map[string]bool) {
	if wanted == nil {
		return
	}
	w.items = slices.DeleteFunc(w.items, func(a *pulsetype.Attempt) bool { return !wanted[a.ConsumerGroup] })
	covered := make(map[string]bool, len(wanted))
	for g := range wanted {
		if w.groups == nil || w.groups[g] {
			covered[g] = true
		}
	}
	w.groups = covered
}

// take removes from the window and returns up to n attempts whose consumer group admit accepts, chosen at
// random among the first 4n such attempts (most overdue first): replicas reading the same window then
// spread over it rather than all claiming its first n. An attempt taken is not offered again, whether its
// claim wins or not (a lost claim means another replica leased it, or it ended).
func (w *dueWindow) take(n int, admit func(group string) bool) []*pulsetype.Attempt {
	var idx []int
	for i, a := range w.items {
		if len(idx) == 4*n {
			break
		}
		if admit(a.ConsumerGroup) {
			idx = append(idx, i)
		}
	}
	if len(idx) == 0 {
		return nil
	}
	rand.Shuffle(len(idx), func(i, j int) { idx[i], idx[j] = idx[j], idx[i] })
	idx = idx[:min(n, len(idx))]
	taken := make(map[int]bool, len(idx))
	out := make([]*pulsetype.Attempt, 0, len(idx))
	for _, i := range idx {
		taken[i] = true
		out = append(out, w.items[i])
	}
	kept := w.items[:0]
	for i, a := range w.items {
		if !taken[i] {
			kept = append(kept, a)
		}
	}
	clear(w.items[len(kept):])
	w.items = kept
	return out
}
