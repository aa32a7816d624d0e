package startstop

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain fails the package when a goroutine outlives its test (the point of this package).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// blocker is a goroutine body that reports when its context ends and returns only once released.
type blocker struct {
	cancelled chan struct{}
	release   chan struct{}
	exited    atomic.Bool
}

func newBlocker() *blocker {
	return &blocker{cancelled: make(chan struct{}), release: make(chan struct{})}
}

func (b *blocker) run(ctx context.Context) {
	<-ctx.Done()
	close(b.cancelled)
	<-b.release
	b.exited.Store(true)
}

func TestStopBeforeStartAndTwice(t *testing.T) {
	t.Parallel()
	var b Base
	b.Stop() // before start: returns at once
	b.Stop()
}

// Stop cancels the goroutines' context and, in every concurrent caller, blocks until they returned.
func TestStopWaitsForEveryGoroutine(t *testing.T) {
	t.Parallel()
	var b Base
	g1, g2 := newBlocker(), newBlocker()
	if err := b.StartGo(context.Background(), g1.run, g2.run); err != nil {
		t.Fatal(err)
	}
	stopped := make(chan bool, 2)
	for range 2 {
		go func() { b.Stop(); stopped <- g1.exited.Load() && g2.exited.Load() }()
	}
	<-g1.cancelled
	<-g2.cancelled
	close(g1.release)
	select {
	case <-stopped:
		t.Fatal("Stop returned while a goroutine was still running")
	case <-time.After(50 * time.Millisecond): // a Stop that does not wait returns well within this
	}
	close(g2.release)
	for range 2 {
		if !<-stopped {
			t.Fatal("Stop returned before both goroutines exited")
		}
	}
	b.Stop() // after a stop: returns at once
}

// A running Base refuses a second start; a stopped one starts again.
func TestStartWhileRunningAndRestart(t *testing.T) {
	t.Parallel()
	var b Base
	wait := func(ctx context.Context) { <-ctx.Done() }
	if err := b.StartGo(context.Background(), wait); err != nil {
		t.Fatal(err)
	}
	if err := b.StartGo(context.Background(), wait); !errors.Is(err, ErrStarted) {
		t.Fatalf("second StartGo = %v, want ErrStarted", err)
	}
	b.Stop()
	ran := make(chan struct{})
	if err := b.StartGo(context.Background(), func(ctx context.Context) { close(ran); <-ctx.Done() }); err != nil {
		t.Fatalf("StartGo after Stop = %v", err)
	}
	<-ran
	b.Stop()
}

// The parent context ends the goroutines too; Stop then returns at once.
func TestParentContextEndsTheRun(t *testing.T) {
	t.Parallel()
	var b Base
	ctx, cancel := context.WithCancel(context.Background())
	g := newBlocker()
	close(g.release)
	if err := b.StartGo(ctx, g.run); err != nil {
		t.Fatal(err)
	}
	cancel()
	<-g.cancelled
	b.Stop()
	if !g.exited.Load() {
		t.Fatal("Stop returned before the goroutine exited")
	}
}

// fakeService records its calls in a shared log; a non-nil err makes its Start fail.
type fakeService struct {
	name string
	err  error
	log  *[]string
	mu   *sync.Mutex
}

func (f fakeService) Start(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	*f.log = append(*f.log, "start "+f.name)
	return f.err
}

func (f fakeService) Stop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	*f.log = append(*f.log, "stop "+f.name)
}

// StartAll starts in order and, when one fails, stops the ones it started, last first; StopAll keeps the
// given order.
func TestStartAllRollsBackAndStopAllKeepsOrder(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var log []string
	svc := func(name string, err error) Service { return fakeService{name: name, err: err, log: &log, mu: &mu} }
	boom := errors.New("boom")
	err := StartAll(context.Background(), svc("a", nil), svc("b", nil), svc("c", boom), svc("d", nil))
	if !errors.Is(err, boom) {
		t.Fatalf("StartAll = %v, want boom", err)
	}
	want := []string{"start a", "start b", "start c", "stop b", "stop a"}
	if !slices.Equal(log, want) {
		t.Fatalf("calls = %q, want %q", log, want)
	}
	log = nil
	if err := StartAll(context.Background(), svc("a", nil), svc("b", nil)); err != nil {
		t.Fatal(err)
	}
	StopAll(svc("b", nil), svc("a", nil))
	if want := []string{"start a", "start b", "stop b", "stop a"}; !slices.Equal(log, want) {
		t.Fatalf("calls = %q, want %q", log, want)
	}
}

// Every ticks after the first delay, then after each next delay, and returns when its context ends.
func TestEveryTicksUntilCancelled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	var nexts atomic.Int64
	ticks := make(chan struct{}, 10)
	done := make(chan struct{})
	go func() {
		defer close(done)
		Every(ctx, time.Millisecond, func() time.Duration { nexts.Add(1); return time.Millisecond },
			func(tctx context.Context) {
				if tctx != ctx {
					t.Error("tick got another context than Every's")
				}
				select {
				case ticks <- struct{}{}:
				default: // the test has seen enough
				}
			})
	}()
	for range 3 {
		select {
		case <-ticks:
		case <-time.After(10 * time.Second):
			t.Fatal("Every did not tick three times")
		}
	}
	cancel()
	<-done
	if n := nexts.Load(); n < 2 {
		t.Fatalf("next was asked %d times after 3 ticks, want at least 2", n)
	}
	// A first delay longer than the test never ticks.
	ctx2, cancel2 := context.WithCancel(context.Background())
	cancel2()
	Every(ctx2, time.Hour, func() time.Duration { return time.Hour }, func(context.Context) { t.Error("ticked before the first delay") })
}
