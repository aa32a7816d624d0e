package mongo

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/pulse-sidecar/pulse/internal/testwait"
	"github.com/pulse-sidecar/pulse/mongo/storetest"
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

	schema := len(log.named("aggregate")) // EnsureSchema's (the capability probe of $group's $first)
	watcher := func() []bson.Raw { return log.named("aggregate")[schema:] }
	count := func() int { return len(watcher()) }
	if caps.ChangeStreams {
		testwait.Eventually(t, storetest.WaitBound(t), "the watcher opens its change stream", func() bool { return count() > 0 })
		ev := &pulsetype.Event{ID: "e1", Topic: "t", Data: []byte("1")}
		if _, err := s.Publish(context.Background(), []*pulsetype.Event{ev}); err != nil {
			t.Fatal(err)
		}
		testwait.Eventually(t, storetest.WaitBound(t), "a publish wakes the change stream watcher", func() bool { return woken.Load() > 0 })
	} else {
		testwait.Eventually(t, storetest.WaitBound(t), "the failed stream is reopened (opened twice)", func() bool { return count() >= 2 })
	}
	first := watcher()[0]
	if coll, _ := first.Lookup("aggregate").StringValueOK(); coll != "pulse.events" {
		t.Fatalf("aggregate on %q, want pulse.events: %s", coll, first)
	}
	stage, err := first.Lookup("pipeline").Array().IndexErr(0)
	if err != nil || stage.Document().Lookup("$changeStream").Type != bson.TypeEmbeddedDocument {
		t.Fatalf("first stage is not $changeStream: %s", first)
	}
	// Changes reach the watcher without the events' bodies: only the resume token and the kind.
	stages, err := first.Lookup("pipeline").Array().Values()
	var project bson.Raw
	if err == nil && len(stages) == 3 {
		project, _ = stages[2].DocumentOK()
	}
	kept, _ := project.Lookup("$project").DocumentOK()
	if one, ok := kept.Lookup("operationType").AsInt64OK(); !ok || one != 1 || len(mustElements(t, kept)) != 1 {
		t.Errorf("the pipeline does not end by projecting each change to its operationType: %s", first)
	}
	w.Stop()
}

// mustElements returns the elements of doc, failing t when it is not a document.
func mustElements(t *testing.T, doc bson.Raw) []bson.RawElement {
	t.Helper()
	elems, err := doc.Elements()
	if err != nil {
		t.Fatalf("not a document: %v", err)
	}
	return elems
}
