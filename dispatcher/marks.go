package dispatcher

import (
	"sync"
	"time"
)

// fanOutMarks holds the ids of events fanned out here whose fanout mark is still set, until one write clears
// them: once batch of them wait or the oldest waited maxAge. It is safe for concurrent use.
type fanOutMarks struct {
	batch  int
	maxAge time.Duration

	mu    sync.Mutex
	ids   []string
	since time.Time // when the oldest of ids was added
}

// add records events fanned out at now.
func (m *fanOutMarks) add(ids []string, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ids = append(m.ids, ids...)
	if m.since.IsZero() {
		m.since = now
	}
}

// due removes and returns the ids to clear now: all of them when force is set, batch of them are waiting
// or the oldest waited maxAge; none otherwise.
func (m *fanOutMarks) due(now time.Time, force bool) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.ids) == 0 || !force && len(m.ids) < m.batch && now.Sub(m.since) < m.maxAge {
		return nil
	}
	ids := m.ids
	m.ids, m.since = nil, time.Time{}
	return ids
}
