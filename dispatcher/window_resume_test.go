package dispatcher

import (
	"testing"
	"time"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// A window read for every group drops a paused group's attempts (keep); once the group is resumed the window
// no longer claims to cover it, so its due attempts are read again at once rather than when the window runs
// dry or goes stale (maxDueWindowAge).
func TestWindowReadsAResumedGroupAgain(t *testing.T) {
	t.Parallel()
	now := time.Now()
	var w dueWindow
	w.fill([]*pulsetype.Attempt{{ID: "g1", ConsumerGroup: "g", NextAttemptAt: now}, {ID: "h1", ConsumerGroup: "h", NextAttemptAt: now},
		{ID: "h2", ConsumerGroup: "h", NextAttemptAt: now}}, nil, now, now) // read for every group
	whileGPaused := map[string]bool{"h": true}
	if !w.covers(whileGPaused, now) {
		t.Fatal("a window read for every group does not cover h")
	}
	w.keep(whileGPaused)
	if len(w.items) != 2 {
		t.Fatalf("the window holds %d attempts after g's pause, want h's 2", len(w.items))
	}
	if !w.covers(whileGPaused, now) {
		t.Fatal("the window no longer covers h, whose attempts it still holds")
	}
	if w.covers(nil, now.Add(time.Second)) {
		t.Fatal("after g's resume the window covers every group, holding none of g's attempts: g waits for it to run dry or go stale")
	}
	if w.covers(map[string]bool{"g": true, "h": true}, now.Add(time.Second)) {
		t.Fatal("the window covers g, whose attempts it dropped")
	}
}
