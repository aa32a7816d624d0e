package dispatcher

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/pulse-sidecar/pulse/internal/startstop"
	"github.com/pulse-sidecar/pulse/internal/testwait"
)

// TestMain fails the package when a goroutine of a Dispatcher or one of its pieces (loop, executor,
// completer) outlives the tests: every test stops what it started.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Stop is safe before Start and twice, and returns once the loop and the completer have exited (the leak
// check of TestMain fails otherwise).
func TestStopBeforeStartAndTwice(t *testing.T) {
	t.Parallel()
	s := newMemStore()
	opts := Options{Owner: "o", Workers: 1, PollInterval: 10 * time.Millisecond, LeaseTimeout: time.Second, ShutdownTimeout: time.Second, Logger: zerolog.Nop()}
	New(s, &sender{}, noReconciler{}, idleKeeper(), opts).Stop()
	d := New(s, &sender{}, noReconciler{}, idleKeeper(), opts)
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 10*time.Second, "the loop to poll", func() bool { return len(s.times()) > 0 })
	d.Stop()
	d.Stop()
}

// Start while running returns startstop.ErrStarted; a stopped Dispatcher starts again.
func TestStartWhileRunning(t *testing.T) {
	t.Parallel()
	store := newMemStore(endpoint(t, "g", []string{"t"}))
	d := startDispatcher(t, store, &sender{}, 2)
	if err := d.Start(t.Context()); !errors.Is(err, startstop.ErrStarted) {
		t.Fatalf("Start while running = %v, want startstop.ErrStarted", err)
	}
	d.Stop()
	if err := d.Start(t.Context()); err != nil {
		t.Fatalf("Start after Stop = %v", err)
	}
	d.Published(events("e", "t", 1))
	testwait.Eventually(t, 10*time.Second, "the delivery to succeed after a restart", func() bool { return store.succeeded("g") == 1 })
}
