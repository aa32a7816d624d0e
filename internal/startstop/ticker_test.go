package startstop_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pulse-sidecar/pulse/internal/startstop"
	"github.com/pulse-sidecar/pulse/internal/testwait"
)

// StartTicking ticks again and again, reading the period after each tick; Stop ends the ticks, and a
// second StartTicking before Stop is ErrStarted.
func TestStartTickingTicksUntilStopped(t *testing.T) {
	t.Parallel()
	var b startstop.Base
	var ticks, periods atomic.Int32
	period := func() time.Duration { periods.Add(1); return time.Millisecond }
	tick := func(context.Context) { ticks.Add(1) }
	if err := b.StartTicking(context.Background(), 0, period, tick); err != nil {
		t.Fatal(err)
	}
	if err := b.StartTicking(context.Background(), 0, period, tick); err != startstop.ErrStarted {
		t.Fatalf("second StartTicking = %v, want ErrStarted", err)
	}
	testwait.Eventually(t, 10*time.Second, "three ticks", func() bool { return ticks.Load() >= 3 })
	b.Stop()
	n := ticks.Load()
	if p := periods.Load(); p < n {
		t.Fatalf("%d ticks read the period %d times, want once before the first and after each tick", n, p)
	}
	if err := b.StartTicking(context.Background(), time.Hour, period, tick); err != nil { // first tick in an hour
		t.Fatalf("StartTicking after Stop = %v", err)
	}
	b.Stop()
	if got := ticks.Load(); got != n {
		t.Fatalf("ticks went from %d to %d after Stop, or before the first wait ended", n, got)
	}
}
