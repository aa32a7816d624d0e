package mongo

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// The EventWatcher sends a $changeStream aggregate on the events collection (checked with the driver's command
// monitor). Where the server has no change streams (FerretDB) the failure is reported and the stream
// reopened after the retry interval; on a replica set (PULSE_TEST_MONGODB_URI) a publish wakes the watcher.
func testWatchEventsSendsChangeStreamAndReopens(t *testing.T, e *env) {
	b := e.setup(t)
	s, log := b.monitoredStore()
	caps := s.Capabilities()
	var woken atomic.Int64
	w := NewEventWatcher(s, 50*time.Millisecond, func() { woken.Add(1) }, zerolog.Nop())
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer w.Stop()

	count := func() int { return len(log.named("aggregate")) }
	deadline := time.Now().Add(10 * time.Second)
	if caps.ChangeStreams {
		for count() == 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond) // poll
		}
		ev := &pulsetype.Event{ID: "e1", Topic: "t", Data: []byte("1")}
		if _, err := s.Publish(context.Background(), []*pulsetype.Event{ev}); err != nil {
			t.Fatal(err)
		}
		for woken.Load() == 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond) // poll
		}
		if woken.Load() == 0 {
			t.Fatal("a publish did not wake the change stream watcher")
		}
	} else {
		for count() < 2 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond) // poll
		}
		if n := count(); n < 2 {
			t.Fatalf("the failed stream was opened %d times, want it reopened", n)
		}
	}
	first := log.named("aggregate")[0]
	if coll, _ := first.Lookup("aggregate").StringValueOK(); coll != "pulse.events" {
		t.Fatalf("aggregate on %q, want pulse.events: %s", coll, first)
	}
	stage, err := first.Lookup("pipeline").Array().IndexErr(0)
	if err != nil || stage.Document().Lookup("$changeStream").Type != bson.TypeEmbeddedDocument {
		t.Fatalf("first stage is not $changeStream: %s", first)
	}
	w.Stop()
}
