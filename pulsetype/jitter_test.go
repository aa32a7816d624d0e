package pulsetype_test

import (
	"testing"
	"time"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

func TestJitterSpreadsPeriods(t *testing.T) {
	t.Parallel()
	const d = time.Second
	seen := map[time.Duration]bool{}
	for range 1000 {
		j := pulsetype.Jittered(d)
		if j < d*4/5 || j > d*6/5 {
			t.Fatalf("pulsetype.Jittered(%s) = %s, want within ±20%%", d, j)
		}
		seen[j] = true
	}
	if len(seen) < 900 {
		t.Fatalf("Jitter gave %d distinct periods in 1000 calls", len(seen))
	}
	if pulsetype.Jittered(0) != 0 {
		t.Fatal("pulsetype.Jittered(0) != 0")
	}
}
