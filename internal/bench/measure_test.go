package bench

import (
	"os"
	"strings"
	"testing"
	"time"
)

// processCPU reads the same CPU time from /proc/<pid>/stat that getrusage reports for this process.
func TestProcessCPUFollowsRusage(t *testing.T) {
	before, err := processCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	start := cpuTime()
	for x := 0; cpuTime()-start < 300*time.Millisecond; x++ {
	}
	after, err := processCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if d := after - before; d < 250*time.Millisecond {
		t.Fatalf("processCPU grew by %s while the process spent 300ms of CPU", d)
	}
}

// The log counter counts warnings and errors only while counting, and groups them by component and message.
func TestLogCounter(t *testing.T) {
	l := newLogCounter()
	_, _ = l.Write([]byte(`{"level":"warn","component":"dispatcher","message":"before"}` + "\n"))
	l.counting.Store(true)
	_, _ = l.Write([]byte(`{"level":"info","message":"fine"}` + "\n" + `{"level":"error","component":"reconciler","error":"boom","mess`))
	_, _ = l.Write([]byte(`age":"repair failed"}` + "\n" + `{"level":"warn","component":"store","message":"slow"}` + "\n"))
	warnings, errors, kinds := l.counts()
	if warnings != 1 || errors != 1 || len(kinds) != 2 {
		t.Fatalf("counts = %d warnings, %d errors, %q; want 1, 1 and two kinds", warnings, errors, kinds)
	}
	if !strings.Contains(strings.Join(kinds, "\n"), "1× error reconciler: repair failed (boom)") {
		t.Fatalf("kinds = %q", kinds)
	}
}
