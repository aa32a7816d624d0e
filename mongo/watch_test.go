package mongo

import (
	"context"
	"encoding/binary"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/pulse-sidecar/pulse/internal/devdb"
	"github.com/pulse-sidecar/pulse/internal/testdb"
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

// The watcher's $match, run by the test database on documents shaped as the change events of each write to
// the events collection, passes what makes an event deliverable (the insert of a visible event, the commit of
// a staged one) and nothing else: not the insert of a staged event, not the fan-out's clear of the fanout
// mark (one per fanned-out event), not a delete.
func testWatchMatchesOnlyWhatWakesWork(t *testing.T, e *env) {
	b := e.setup(t)
	changes := b.client.Database(b.dbName).Collection("changes")
	docs := []any{
		bson.M{"_id": "insert visible", "operationType": "insert", "fullDocument": bson.M{"_id": "e1", "topic": "t", "fanout": true}},
		bson.M{"_id": "insert staged", "operationType": "insert", "fullDocument": bson.M{"_id": "e2", "topic": "t", "staged": true, "fanout": true}},
		bson.M{"_id": "commit", "operationType": "update", "updateDescription": bson.M{"updatedFields": bson.M{"fanout": true, "createdAt": time.Now()}, "removedFields": bson.A{"staged"}}},
		bson.M{"_id": "fan-out clear", "operationType": "update", "updateDescription": bson.M{"updatedFields": bson.M{}, "removedFields": bson.A{"fanout"}}},
		bson.M{"_id": "delete", "operationType": "delete"},
	}
	if _, err := changes.InsertMany(b.ctx, docs); err != nil {
		t.Fatal(err)
	}
	cur, err := changes.Aggregate(b.ctx, mongo.Pipeline{watchPipeline()[0], {{Key: "$sort", Value: bson.M{"_id": 1}}}})
	if err != nil {
		t.Fatal(err)
	}
	var got []struct {
		ID string `bson:"_id"`
	}
	if err := cur.All(b.ctx, &got); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, g := range got {
		ids = append(ids, g.ID)
	}
	if want := []string{"commit", "insert visible"}; !slices.Equal(ids, want) {
		t.Fatalf("the watcher's $match passes %q, want %q", ids, want)
	}
}

// A database user without the changeStream action: the server refuses each stream with Unauthorized (13),
// as the relay in front of the test database answers here. The watcher logs one warning, no error, however
// often it retries, and reports the state unauthorized once.
func testWatchWithoutTheChangeStreamActionWarnsOnce(t *testing.T, e *env) {
	b := e.setup(t)
	relay := startRefusingRelay(t, b.srv.URI)
	client, err := Connect(relay.uri, ConnectOptions{ServerSelectionTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Disconnect(context.Background()) })
	s := b.store(client, nil)
	var logs testdb.SyncBuffer
	w := NewEventWatcher(s, 10*time.Millisecond, func() {}, zerolog.New(&logs))
	w.denied = 10 * time.Millisecond
	var mu sync.Mutex
	var states []ChangeStreamState
	w.Report(func(st ChangeStreamState) { mu.Lock(); states = append(states, st); mu.Unlock() })
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	testwait.Eventually(t, storetest.WaitBound(t), "five streams refused", func() bool { return relay.refused.Load() >= 5 })
	w.Stop()
	out := logs.String()
	if n := strings.Count(out, `"level":"warn"`); n != 1 || !strings.Contains(out, "changeStream action") {
		t.Errorf("%d warnings after %d refused streams, want 1 naming the changeStream action: %s", n, relay.refused.Load(), out)
	}
	if n := strings.Count(out, `"level":"error"`); n != 0 {
		t.Errorf("%d errors logged for refused streams, want none: %s", n, out)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(states, []ChangeStreamState{ChangeStreamUnauthorized}) {
		t.Errorf("reported states %v, want [unauthorized]", states)
	}
}

// refusingRelay forwards the wire protocol to the test database, and answers each aggregate opening a change
// stream itself with the server's Unauthorized error, as MongoDB answers a user whose roles lack the
// changeStream action.
type refusingRelay struct {
	uri     string
	refused atomic.Int64
	ln      net.Listener
	wg      sync.WaitGroup
	conns   devdb.Conns
}

func startRefusingRelay(t *testing.T, uri string) *refusingRelay {
	t.Helper()
	u, err := url.Parse(uri)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(u.Host, ",") || u.Scheme != "mongodb" {
		t.Skipf("the test database %s has several hosts: a relay in front of one cannot stand for it", uri)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	upstream := u.Host
	u.Host = ln.Addr().String()
	q := u.Query()
	q.Set("directConnection", "true")
	u.RawQuery = q.Encode()
	r := &refusingRelay{uri: u.String(), ln: ln}
	r.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.DialTimeout("tcp", upstream, 10*time.Second)
			if err != nil {
				_ = c.Close()
				continue
			}
			if !r.conns.Track(c, up) {
				return
			}
			r.wg.Go(func() {
				defer r.conns.Untrack(c, up)
				r.relay(c, up)
			})
		}
	})
	t.Cleanup(func() { _ = ln.Close(); r.conns.CloseAll(); r.wg.Wait() })
	return r
}

func (r *refusingRelay) relay(client, upstream net.Conn) {
	for {
		req, err := devdb.ReadMessage(client)
		if err != nil {
			return
		}
		body, moreToCome := devdb.MessageBody(req)
		if devdb.CommandName(body) == "aggregate" && strings.Contains(body.Lookup("pipeline").String(), "$changeStream") {
			r.refused.Add(1)
			reply := opMsg(binary.LittleEndian.Uint32(req[4:8]), bson.D{{Key: "ok", Value: 0.0}, {Key: "errmsg", Value: "not authorized on pulse to execute command { aggregate: \"pulse.events\", pipeline: [ { $changeStream: {} } ] }"},
				{Key: "code", Value: int32(13)}, {Key: "codeName", Value: "Unauthorized"}})
			if _, err := client.Write(reply); err != nil {
				return
			}
			continue
		}
		if _, err := upstream.Write(req); err != nil {
			return
		}
		if moreToCome {
			continue
		}
		reply, err := devdb.ReadMessage(upstream)
		if err != nil {
			return
		}
		if _, err := client.Write(reply); err != nil {
			return
		}
	}
}

// opMsg encodes an OP_MSG reply to the request responseTo whose body is doc.
func opMsg(responseTo uint32, doc bson.D) []byte {
	raw, err := bson.Marshal(doc)
	if err != nil {
		panic(err)
	}
	msg := make([]byte, 21, 21+len(raw))
	binary.LittleEndian.PutUint32(msg[8:], responseTo)
	binary.LittleEndian.PutUint32(msg[12:], 2013) // OP_MSG; flags 0; section kind 0
	msg = append(msg, raw...)
	binary.LittleEndian.PutUint32(msg[0:], uint32(len(msg)))
	return msg
}
