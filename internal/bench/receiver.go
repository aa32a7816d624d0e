package bench

import (
	"context"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"
)

// receiver counts POSTs per (path, Idempotency-Key) and the latency from publish to first POST.
type receiver struct {
	mu     sync.Mutex
	sentAt map[string]time.Time
	seen   map[string]bool
	lat    []time.Duration
	n      int
	notify chan struct{}
	delay  time.Duration // how long each answer takes (a slow receiver)
}

func newReceiver() *receiver {
	return &receiver{sentAt: map[string]time.Time{}, seen: map[string]bool{}, notify: make(chan struct{}, 1)}
}

// published notes that event id was published at (or due at) t: its POSTs count from then.
func (b *receiver) published(id string, t time.Time) {
	b.mu.Lock()
	b.sentAt[id] = t
	b.mu.Unlock()
}

func (b *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	if b.delay > 0 {
		select {
		case <-time.After(b.delay):
		case <-r.Context().Done():
		}
	}
	key := r.URL.Path + " " + r.Header.Get("Idempotency-Key")
	b.mu.Lock()
	b.n++
	if !b.seen[key] {
		b.seen[key] = true
		if t, ok := b.sentAt[r.Header.Get("Idempotency-Key")]; ok {
			b.lat = append(b.lat, time.Since(t))
		}
	}
	b.mu.Unlock()
	select {
	case b.notify <- struct{}{}:
	default:
	}
}

func (b *receiver) distinct() int { b.mu.Lock(); defer b.mu.Unlock(); return len(b.seen) }
func (b *receiver) total() int    { b.mu.Lock(); defer b.mu.Unlock(); return b.n }

func (b *receiver) latencies() []time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.lat)
}

func (b *receiver) wait(ctx context.Context, want int) error {
	for b.distinct() < want {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-b.notify:
		case <-time.After(time.Second):
		}
	}
	return nil
}
