package dispatcher

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pulse-sidecar/pulse/internal/testwait"
)

// heldReap is a Reconciler whose Reap blocks until release is closed (a database call stuck on a connection
// that never answers); entered is closed when the first call began.
type heldReap struct {
	entered, release chan struct{}
}

func (r *heldReap) Reap(context.Context) (bool, error) {
	select {
	case <-r.entered:
	default:
		close(r.entered)
	}
	<-r.release
	return false, nil
}

func (r *heldReap) Repair(context.Context) (int, error) { return 0, nil }

// Stalled names a reconciliation pass that has run for longer than the bound without completing, while the
// loop's turns go on, and says nothing once the pass completed: /readyz fails on the sidecar's own stuck
// work, not only on a failed ping.
func TestStalledNamesWorkThatDoesNotComplete(t *testing.T) {
	t.Parallel()
	rec := &heldReap{entered: make(chan struct{}), release: make(chan struct{})}
	d := startReconciling(t, newMemStore(), rec, time.Minute)
	closedWithin(t, rec.entered, "the first reap")
	if err := d.Stalled(time.Hour); err != nil {
		t.Fatalf("Stalled(1h) = %v while the pass ran for less, want nil", err)
	}
	const bound = 20 * time.Millisecond
	var err error
	testwait.Eventually(t, 10*time.Second, "the held pass to outlast the bound", func() bool { err = d.Stalled(bound); return err != nil })
	if !strings.Contains(err.Error(), "reconciliation pass") {
		t.Errorf("Stalled = %v, want it to name the reconciliation pass", err)
	}
	close(rec.release)
	testwait.Eventually(t, 10*time.Second, "Stalled to clear once the pass completed", func() bool { return d.Stalled(bound) == nil })
}
