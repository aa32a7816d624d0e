package dispatcher

import (
	"sync"
	"time"
)

// Fairness between consumer groups (docs/delivery.md, "Fairness between consumer groups"): a POST running
// past slowAfter moves to an overflow of overflowShare × Workers, and the last Workers/reserveShare free
// slots go only to groups with nothing in flight and no slow POST within slowMemory.
const (
	reserveShare  = 4
	overflowShare = 16
	slowAfter     = time.Second
	slowMemory    = time.Minute
)

// slots counts the POSTs in flight, by consumer group and in all, and admits new ones by the fairness
// rules above. It is safe for concurrent use. limit (a group's maxConcurrency) is called with the lock
// held, so it must not call back into slots.
type slots struct {
	workers   int
	limit     func(group string) int
	slowAfter time.Duration // a POST running longer gives its slot back (slowAfter; tests shorten or lengthen it)
	freed     func()        // called when a slot was given back

	mu        sync.Mutex
	inflight  map[string]int       // POSTs in flight by consumer group (maxConcurrency counts these)
	total     int                  // worker slots in use (PULSE_WORKERS counts these)
	overflow  int                  // POSTs that outlasted slowAfter and gave their slot back
	slowUntil map[string]time.Time // groups with a POST that outlasted slowAfter: no reserve slot until then
}

func newSlots(workers int, limit func(string) int, freed func()) *slots {
	return &slots{workers: workers, limit: limit, slowAfter: slowAfter, freed: freed,
		inflight: map[string]int{}, slowUntil: map[string]time.Time{}}
}

// reserve returns how many of the worker slots are kept for groups with nothing in flight.
func (s *slots) reserve() int { return max(1, s.workers/reserveShare) }

// free returns the worker slots not in use.
func (s *slots) free() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.workers - s.total
}

// admit reports whether group may take one more worker slot now, with takenGroup slots already promised to
// it and takenAll to every group in the batch being built.
func (s *slots) admit(group string, takenGroup, takenAll int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.admitLocked(group, takenGroup, s.workers-s.total-takenAll)
}

// admitLocked is admit with free slots left before this one; s.mu is held.
func (s *slots) admitLocked(group string, taken, free int) bool {
	busy := s.inflight[group] + taken
	if free <= 0 || busy >= s.limit(group) {
		return false
	}
	return free > s.reserve() || busy == 0 && !time.Now().Before(s.slowUntil[group])
}

// running returns how many POSTs of group are in flight.
func (s *slots) running(group string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inflight[group]
}

// full reports whether group has its maxConcurrency of POSTs in flight.
func (s *slots) full(group string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inflight[group] >= s.limit(group)
}

// capacity returns the consumer groups (of known, plus those with POSTs in flight) that may not take a
// worker slot now and how many attempts the next claim may lease. Above the reserve a batch takes up to
// the free slots above it (never a group past its maxConcurrency), at most maxClaimBatch; within the
// reserve it takes one attempt of a group with nothing in flight (see admitLocked).
func (s *slots) capacity(known []string) (exclude []string, free int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	left := s.workers - s.total
	if left <= 0 {
		return nil, 0
	}
	free = min(max(left-s.reserve(), 1), maxClaimBatch)
	groups := map[string]bool{}
	for _, group := range known {
		groups[group] = true
	}
	for group := range s.inflight {
		groups[group] = true
	}
	for group := range groups {
		if !s.admitLocked(group, 0, left) {
			exclude = append(exclude, group)
		} else {
			free = min(free, s.limit(group)-s.inflight[group]) // a batch never takes a group past its limit
		}
	}
	return exclude, free
}

// acquire takes a worker slot for a POST of group and returns the func that gives it back (call it once,
// when the POST is over). A POST still running after slowAfter gives its slot back early while the
// overflow has room (see fairness) and keeps the group out of the reserve for slowMemory.
func (s *slots) acquire(group string) (release func()) {
	s.mu.Lock()
	s.inflight[group]++
	s.total++
	s.mu.Unlock()
	var done, overflowed bool // guarded by s.mu
	slow := time.AfterFunc(s.slowAfter, func() {
		s.mu.Lock()
		if done {
			s.mu.Unlock()
			return
		}
		s.slowUntil[group] = time.Now().Add(slowMemory)
		if s.overflow < overflowShare*s.workers {
			overflowed = true
			s.overflow++
			s.total-- // the slot goes back to the pool
		}
		s.mu.Unlock()
		s.freed()
	})
	return func() {
		slow.Stop()
		s.mu.Lock()
		defer s.mu.Unlock()
		done = true
		if s.inflight[group]--; s.inflight[group] <= 0 {
			delete(s.inflight, group)
		}
		if overflowed {
			s.overflow--
		} else {
			s.total--
		}
	}
}
