// Package startstop gives the sidecar's background services one lifecycle, after River's
// rivershared/startstop: Start(ctx) returns once the service runs (an error when it cannot start), and Stop
// blocks until every goroutine the service started has exited. Stop is safe to call twice, concurrently, and
// before Start.
package startstop

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"
)

// Service is a background part of the sidecar with the shared lifecycle.
type Service interface {
	// Start launches the service and returns once it runs; ctx bounds its whole run.
	Start(ctx context.Context) error
	// Stop blocks until every goroutine the service started has exited.
	Stop()
}

// ErrStarted is returned by Base.StartGo while a previous run has not been stopped.
var ErrStarted = errors.New("service already started")

// Base runs the goroutines of a service: the service calls StartGo from its Start and gets Stop by
// embedding Base. The zero value is ready to use; it is safe for concurrent use. A stopped Base may be
// started again.
type Base struct {
	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{} // closed once every goroutine of the current run returned
}

// StartGo runs each of fns in its own goroutine with a context derived from ctx that Stop cancels, and
// returns at once. It returns ErrStarted while a previous run has not been stopped.
func (b *Base) StartGo(ctx context.Context, fns ...func(ctx context.Context)) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done != nil {
		return ErrStarted
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	var wg sync.WaitGroup
	for _, fn := range fns {
		wg.Go(func() { fn(ctx) })
	}
	go func() {
		wg.Wait()
		cancel()
		close(done)
	}()
	b.cancel, b.done = cancel, done
	return nil
}

// Stop cancels the context of the running goroutines and blocks until all of them returned. It is safe
// twice, concurrently, and before StartGo.
func (b *Base) Stop() {
	b.mu.Lock()
	cancel, done := b.cancel, b.done
	b.mu.Unlock()
	if done == nil {
		return
	}
	cancel()
	<-done
	b.mu.Lock()
	if b.done == done {
		b.cancel, b.done = nil, nil
	}
	b.mu.Unlock()
}

// StartAll starts services in order. When one fails, it stops the ones already started, last first, and
// returns that error.
func StartAll(ctx context.Context, services ...Service) error {
	for i, s := range services {
		if err := s.Start(ctx); err != nil {
			started := slices.Clone(services[:i])
			slices.Reverse(started)
			StopAll(started...)
			return err
		}
	}
	return nil
}

// StopAll stops services one after another in the order given, each once the previous one has returned.
func StopAll(services ...Service) {
	for _, s := range services {
		s.Stop()
	}
}

// Every calls tick after first and then after each duration next returns, until ctx is done; it blocks.
// A tick that runs when ctx ends finishes before Every returns. Services run it under StartGo, with next
// adding jitter so that replicas started together drift apart.
func Every(ctx context.Context, first time.Duration, next func() time.Duration, tick func(ctx context.Context)) {
	t := time.NewTimer(first)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			tick(ctx)
			t.Reset(next())
		}
	}
}
