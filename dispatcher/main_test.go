package dispatcher

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"
)

// TestMain fails the package when a goroutine of a Dispatcher or one of its pieces (loop, executor,
// completer) outlives the tests: every test stops what it started.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Stop is safe before Start and twice, and returns once the loop and the completer have exited (the leak
// check of TestMain fails otherwise).
func TestStopBeforeStartAndTwice(t *testing.T) {
	t.Parallel()
	s := newMemStore()
	opts := Options{Owner: "o", Workers: 1, PollInterval: 10 * time.Millisecond, LockTimeout: time.Second, ShutdownTimeout: time.Second, Logger: zerolog.Nop()}
	New(s, &sender{}, noReconciler{}, idleKeeper(), opts).Stop()
	d := New(s, &sender{}, noReconciler{}, idleKeeper(), opts)
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(s.times()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the loop did not poll within 10s")
		}
		time.Sleep(5 * time.Millisecond) // poll
	}
	d.Stop()
	d.Stop()
}
