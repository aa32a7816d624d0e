package testwait_test

import (
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pulse-sidecar/pulse/internal/testwait"
)

// Eventually returns as soon as the condition holds, checking it again until then.
func TestEventuallyReturnsOnceTheConditionHolds(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	testwait.Eventually(t, time.Minute, "the third check", func() bool { return calls.Add(1) == 3 })
	if n := calls.Load(); n != 3 {
		t.Fatalf("the condition was checked %d times, want 3 (it held on the third)", n)
	}
}

// Eventually fails the test, naming what it waited for, once the deadline passes.
func TestEventuallyFailsAtTheDeadline(t *testing.T) {
	t.Parallel()
	rec := &recorder{TB: t}
	done := make(chan struct{})
	go func() { // Fatalf ends the goroutine it runs on, as it ends a test
		defer close(done)
		testwait.Eventually(rec, 10*time.Millisecond, "nothing", func() bool { return false })
	}()
	<-done
	if !strings.Contains(rec.msg, "timed out after 10ms waiting for nothing") {
		t.Fatalf("Eventually failed with %q, want the deadline and what it waited for", rec.msg)
	}
}

// recorder keeps the message of Fatalf instead of failing the test.
type recorder struct {
	testing.TB
	msg string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
