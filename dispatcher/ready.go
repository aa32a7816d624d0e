package dispatcher

import (
	"sync"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// job is an attempt to run and, when known, its event: evKnown with a nil ev means the event is gone
// (retention); without evKnown the executor reads the event itself.
type job struct {
	a       *pulsetype.Attempt
	ev      *pulsetype.Event
	evKnown bool
	token   bool         // a token of the group's rate limiter was taken when the job was admitted (rateLimits.holds)
	gate    gateQuestion // the state gate's question asked at its launch with the others of its batch; nil: none yet
	release func()       // gives back the worker slot taken for it before its launch; nil: launch takes one
}

// readyQueue holds the first attempts this process's fan-out created, with their events, until the loop
// claims them: first in, first out, each attempt once. It is bounded by maxLen attempts and maxBytes of
// event data; beyond them attempts are left to polling. It is safe for concurrent use.
type readyQueue struct {
	maxLen, maxBytes int

	mu    sync.Mutex
	jobs  []job
	ids   map[string]bool // attempt ids in jobs
	bytes int             // event data held by jobs
}

func newReadyQueue(maxLen, maxBytes int) *readyQueue {
	return &readyQueue{maxLen: maxLen, maxBytes: maxBytes, ids: map[string]bool{}}
}

// push appends j (whose event is known) and reports whether the queue kept it: false when it is full, true
// as well when the attempt was queued already.
func (q *readyQueue) push(j job) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.ids[j.a.ID] {
		return true
	}
	if len(q.jobs) >= q.maxLen || q.bytes+len(j.ev.Data) > q.maxBytes {
		return false
	}
	q.jobs = append(q.jobs, j)
	q.ids[j.a.ID] = true
	q.bytes += len(j.ev.Data)
	return true
}

// take removes and returns, in queue order, up to limit jobs that admit accepts; admit is asked with how
// many jobs of the same consumer group, and in all, were taken before. The jobs left keep their order.
func (q *readyQueue) take(limit int, admit func(group string, takenGroup, takenAll int) bool) []job {
	q.mu.Lock()
	defer q.mu.Unlock()
	taken := map[string]int{}
	var take, keep []job
	for _, j := range q.jobs {
		g := j.a.ConsumerGroup
		if len(take) < limit && admit(g, taken[g], len(take)) {
			take = append(take, j)
			delete(q.ids, j.a.ID)
			q.bytes -= len(j.ev.Data)
			taken[g]++
		} else {
			keep = append(keep, j)
		}
	}
	q.jobs = keep
	return take
}

// len returns how many attempts wait in the queue.
func (q *readyQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.jobs)
}
