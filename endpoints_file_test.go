package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// putRecorder is an endpointPutter that records the URLs put; with block set, PutEndpoint waits until its
// context ends.
type putRecorder struct {
	mu        sync.Mutex
	urls      []string
	block     bool
	blocked   chan struct{} // closed when a put starts blocking
	cancelled bool          // a blocked put saw its context end
}

func (p *putRecorder) GetEndpoint(context.Context, string) (*pulsetype.Endpoint, error) {
	return nil, pulsetype.ErrNotFound
}

func (p *putRecorder) PutEndpoint(ctx context.Context, e *pulsetype.Endpoint) (*pulsetype.Endpoint, bool, error) {
	p.mu.Lock()
	block := p.block
	p.mu.Unlock()
	if block {
		close(p.blocked)
		<-ctx.Done()
		p.mu.Lock()
		p.cancelled = true
		p.mu.Unlock()
		return nil, false, ctx.Err()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.urls = append(p.urls, e.URL)
	return e, true, nil
}

func (p *putRecorder) put(url string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Contains(p.urls, url)
}

// The endpoints-file watcher re-applies a changed file, and Stop cancels an apply under way and waits for it.
func TestEndpointsWatcherReappliesAndStops(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "endpoints.yaml")
	write := func(url string) {
		t.Helper()
		if err := os.WriteFile(file, []byte("- consumerGroup: billing\n  url: "+url+"\n  topics: [payment.captured]\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("http://127.0.0.1:1/v1")
	store := &putRecorder{blocked: make(chan struct{})}
	applied, err := applyEndpointsFile(t.Context(), file, store, func(string) {}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	w := newEndpointsWatcher(file, applied, store, func(string) {}, zerolog.Nop())
	w.poll = 5 * time.Millisecond
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	write("http://127.0.0.1:1/v2")
	waitFor(t, 10*time.Second, "the changed file to be re-applied", func() bool { return store.put("http://127.0.0.1:1/v2") })

	store.mu.Lock()
	store.block = true
	store.mu.Unlock()
	write("http://127.0.0.1:1/v3")
	select {
	case <-store.blocked:
	case <-time.After(10 * time.Second):
		t.Fatal("the third version was not applied within 10s")
	}
	w.Stop()
	store.mu.Lock()
	cancelled := store.cancelled
	store.mu.Unlock()
	if !cancelled {
		t.Fatal("Stop returned before the apply under way returned")
	}
	w.Stop() // safe twice
}
