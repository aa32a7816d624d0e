// Package testwait is the tests' one way to wait for an outcome that has no signal to wait on: poll a
// condition until it holds or a deadline passes. Tests never sleep to wait for an outcome (they wait on a
// signal, or use Eventually); the deadline is a bound on a stuck test, far above what the condition takes
// on a busy machine, never a measure of speed.
package testwait

import (
	"testing"
	"time"
)

// maxPoll is the longest pause between two checks of a condition: the first checks come 1 ms apart and
// the pause doubles up to this, so a fast condition is seen at once and a slow one costs little CPU.
const maxPoll = 20 * time.Millisecond

// Eventually checks cond until it returns true and then returns; if timeout passes first, it fails t
// (t.Fatalf) with "timed out after <timeout> waiting for <what>". It blocks, and must be called from the
// test's goroutine; cond runs on that goroutine too.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	pause := time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(pause) // the pause between two checks, not a wait for an outcome
		pause = min(2*pause, maxPoll)
	}
}
