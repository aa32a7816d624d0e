package reconciler_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pulse-sidecar/pulse/reconciler"
)

// The Sweeper sweeps every interval, goes on after a failed sweep, and Stop cancels a sweep under way and
// waits for it.
func TestSweeperSweepsUntilStopped(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	blocked := make(chan struct{})
	var cancelled atomic.Bool
	sweep := func(ctx context.Context) (int64, error) {
		switch calls.Add(1) {
		case 1:
			return 0, errors.New("database unavailable")
		case 2:
			return 3, nil
		case 3:
			close(blocked)
			<-ctx.Done()
			cancelled.Store(true)
			return 0, ctx.Err()
		}
		t.Error("swept again after the blocked sweep")
		return 0, nil
	}
	s := reconciler.NewSweeper(sweep, 10*time.Millisecond, zerolog.Nop())
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-blocked:
	case <-time.After(10 * time.Second):
		t.Fatalf("%d sweeps within 10s, want 3", calls.Load())
	}
	s.Stop()
	if !cancelled.Load() {
		t.Fatal("Stop returned before the sweep under way returned")
	}
	s.Stop() // safe twice
}
