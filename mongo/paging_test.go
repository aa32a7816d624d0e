package mongo

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.mongodb.org/mongo-driver/v2/bson"
	drvevent "go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/pulse-sidecar/pulse/internal/testdb"
	"github.com/pulse-sidecar/pulse/mongo/storetest"
	"github.com/pulse-sidecar/pulse/pulsetype"
	"github.com/pulse-sidecar/pulse/reconciler"
)

// longestIn returns the length of the longest $in list anywhere in doc.
func longestIn(doc bson.Raw) int {
	elems, err := doc.Elements()
	if err != nil {
		return 0
	}
	longest := 0
	for _, e := range elems {
		v := e.Value()
		if arr, ok := v.ArrayOK(); ok {
			vals, _ := arr.Values()
			if e.Key() == "$in" {
				longest = max(longest, len(vals))
			}
			for _, x := range vals {
				if d, ok := x.DocumentOK(); ok {
					longest = max(longest, longestIn(d))
				}
			}
			continue
		}
		if d, ok := v.DocumentOK(); ok {
			longest = max(longest, longestIn(d))
		}
	}
	return longest
}

// longestSent returns the longest $in list of the commands log recorded (of the named commands only, when
// names are given), and the command holding it.
func (l *commandLog) longestSent(names ...string) (int, string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	longest, which := 0, ""
	for i, c := range l.commands {
		if len(names) > 0 && !slices.Contains(names, l.names[i]) {
			continue
		}
		if n := longestIn(c); n > longest {
			longest, which = n, l.names[i]
		}
	}
	return longest, which
}

// Deleting a group whose backlog is larger than one page ends its first page before answering, and the
// repair scan ends the rest, in pages: no command names more ids than a page (and the few queue documents
// that finish its last delivery), a POST in flight is left to its worker, and another group's pending work
// is untouched.
func testEndPendingWorksInPages(t *testing.T, e *env) {
	b := e.setup(t)
	const page, backlog = 7, 40
	log := &commandLog{}
	s := b.store(b.monitoredClient(log), func(o *Options) { o.PageSize = page })
	b.putEndpoint(s, "g", "t")
	b.putEndpoint(s, "h", "t")
	created := storetest.FanOutN(t, b.ctx, s, backlog, "t")
	var inFlight *pulsetype.Attempt
	for _, a := range created {
		if a.ConsumerGroup == "g" {
			inFlight = a
			break
		}
	}
	leased, err := s.ClaimAttempts(b.ctx, "w", []*pulsetype.Attempt{inFlight})
	if err != nil || len(leased) != 1 {
		t.Fatalf("ClaimAttempts = %v, %v", leased, err)
	}
	log.reset()
	deleted, err := s.DeleteEndpoint(b.ctx, "g")
	if err != nil {
		t.Fatal(err)
	}
	// The delete ends one page and answers; the repair scan ends the rest of the deleted group's work.
	ended := b.count("deliveries", bson.M{"consumerGroup": "g", "status": pulsetype.StatusError})
	if ended < page-1 || ended > page+1 {
		t.Errorf("the delete ended %d deliveries before answering, want its first page (%d, give or take the delivery in flight)", ended, page)
	}
	// It says so: what it ended, and what it left pending for the repair scan (the delivery in flight among them).
	left := b.count("deliveries", bson.M{"consumerGroup": "g", "status": pulsetype.StatusPending})
	if deleted.Ended != int64(ended) || deleted.Remaining != int64(left) || deleted.Ended+deleted.Remaining != backlog {
		t.Errorf("DeleteEndpoint = %+v, want ended %d and remaining %d of the backlog of %d", deleted, ended, left, backlog)
	}
	if _, err := reconciler.New(s, "r", time.Second, nil, zerolog.Nop()).Repair(b.ctx); err != nil {
		t.Fatal(err)
	}
	// The writes that end the work; the repair scan's own reads are bounded by its batch (reconciler.BatchSize).
	if n, cmd := log.longestSent("update", "delete"); n > page+1 {
		t.Errorf("an %s command of the delete or the repair names %d ids, more than a page of %d", cmd, n, page)
	}
	if n := b.count("deliveries", bson.M{"consumerGroup": "g", "status": pulsetype.StatusPending}); n != 1 {
		t.Errorf("%d deliveries of the deleted group stay pending, want 1 (its POST in flight)", n)
	}
	if n := b.count("deliveries", bson.M{"consumerGroup": "g", "status": pulsetype.StatusError, "error.code": pulsetype.CodeEndpointDeleted}); n != backlog-1 {
		t.Errorf("%d deliveries of the deleted group ended as endpoint_deleted, want %d", n, backlog-1)
	}
	if n := b.count("queue", bson.M{"consumerGroup": "g"}); n != 1 {
		t.Errorf("%d queue documents of the deleted group stay, want 1 (the attempt in flight)", n)
	}
	if n := b.count("deliveries", bson.M{"consumerGroup": "h", "status": pulsetype.StatusPending}); n != backlog {
		t.Errorf("%d deliveries of the other group stay pending, want %d", n, backlog)
	}
	if t.Failed() {
		t.Log(fmt.Sprint(log.sent()))
	}
}

// The queue migration works in pages and records how far it got after each: a start stopped after its first
// page (here by its context, as by the start's bound or a crash) leaves that page queued and its progress
// recorded, and the next start resumes after it, reading no delivery of the first page again, until every
// pending delivery is queued and the migration is recorded done.
func testQueueMigrationResumes(t *testing.T, e *env) {
	b := e.setup(t)
	const page, pending = 3, 8
	b.store(nil, nil)
	past := b.clock.Now().Add(-time.Minute)
	for i := range pending {
		id := fmt.Sprintf("d-%02d", i)
		if _, err := b.coll("deliveries").InsertOne(b.ctx, bson.M{"_id": id, "eventId": "e-" + id, "consumerGroup": "g", "topic": "t",
			"status": "pending", "eventCreatedAt": past, "createdAt": past, "updatedAt": past}); err != nil {
			t.Fatal(err)
		}
		if _, err := b.coll("history").InsertOne(b.ctx, bson.M{"_id": "a-" + id, "deliveryId": id, "eventId": "e-" + id, "consumerGroup": "g",
			"topic": "t", "attempt": 1, "status": "pending", "createdAt": past, "nextAttemptAt": past}); err != nil {
			t.Fatal(err)
		}
	}
	readiness := b.client.Database(b.dbName).Collection(testPrefix + ".readiness")
	if _, err := readiness.DeleteOne(b.ctx, bson.M{"_id": queueMigration}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.coll("queue").DeleteMany(b.ctx, bson.M{}); err != nil {
		t.Fatal(err)
	}

	// The first start ends as soon as its first record of progress is acknowledged.
	ctx, stop := context.WithCancel(b.ctx)
	defer stop()
	var recorded atomic.Bool
	cut := &drvevent.CommandMonitor{Succeeded: func(_ context.Context, ev *drvevent.CommandSucceededEvent) {
		if ev.CommandName == "update" && recorded.CompareAndSwap(false, true) {
			stop()
		}
	}}
	first := New(b.srv.Connect(options.Client().SetMonitor(cut)), b.options(func(o *Options) { o.PageSize = page }))
	if _, err := first.EnsureSchema(ctx); err == nil {
		t.Fatal("the first start finished the migration; want it stopped after its first page")
	}
	var prog migrationProgress
	if err := readiness.FindOne(b.ctx, bson.M{"_id": queueMigration}).Decode(&prog); err != nil {
		t.Fatalf("no progress recorded after the first page: %v", err)
	}
	if prog.At != nil || prog.DeliveriesAfter != "d-02" || prog.Queued != page {
		t.Fatalf("progress after the first page = %+v; want deliveries after d-02, %d queued, not done", prog, page)
	}
	if n := b.count("queue", bson.M{}); n != page {
		t.Fatalf("%d queued after the first page, want %d", n, page)
	}

	log := &commandLog{}
	second := New(b.monitoredClient(log), b.options(func(o *Options) { o.PageSize = page }))
	if _, err := second.EnsureSchema(b.ctx); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range log.named("find") {
		if coll, _ := cmd.Lookup("find").StringValueOK(); coll != testPrefix+".deliveries" {
			continue
		}
		after, _ := cmd.Lookup("filter", "_id", "$gt").StringValueOK()
		if after < "d-02" {
			t.Errorf("the second start read pending deliveries after %q: want it to resume after d-02 (%s)", after, cmd)
		}
	}
	if n := b.count("queue", bson.M{}); n != pending {
		t.Errorf("%d queued after the second start, want %d", n, pending)
	}
	if err := readiness.FindOne(b.ctx, bson.M{"_id": queueMigration}).Decode(&prog); err != nil || prog.At == nil {
		t.Errorf("the migration is not recorded done after the second start: %+v, %v", prog, err)
	}
}

// Where the server takes a commitQuorum (a replica set member or a mongos), every index EnsureSchema builds
// asks for a majority of the voting members, not all of them (the default); where it does not (a standalone,
// FerretDB), none does, since a standalone refuses the field.
func testIndexesBuildWithMajorityCommitQuorum(t *testing.T, e *env) {
	for _, given := range []bool{false, true} {
		t.Run(fmt.Sprintf("given=%v", given), func(t *testing.T) { checkCommitQuorum(t, e, given) })
	}
}

// checkCommitQuorum is testIndexesBuildWithMajorityCommitQuorum on a store whose capabilities are detected,
// or, with given, taken as the server's detected ones with CommitQuorum set (so the embedded database,
// which ignores the field, shows what a replica set is sent).
func checkCommitQuorum(t *testing.T, e *env, given bool) {
	b := e.setup(t)
	var mod func(o *Options)
	if given {
		caps, err := New(b.client, b.options(nil)).DetectCapabilities(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !caps.CommitQuorum && !testdb.Embedded() {
			t.Skip("only the embedded database is known to ignore a commitQuorum it cannot take")
		}
		caps.CommitQuorum = true
		mod = func(o *Options) { o.Capabilities = &caps }
	}
	log := &commandLog{}
	s := b.store(b.monitoredClient(log), mod)
	builds := 0
	for _, cmd := range log.named("createIndexes") {
		coll, _ := cmd.Lookup("createIndexes").StringValueOK()
		if !strings.HasPrefix(coll, testPrefix+".") || strings.Contains(coll, "schema_probe_") {
			continue
		}
		builds++
		quorum, _ := cmd.Lookup("commitQuorum").StringValueOK()
		switch {
		case s.Capabilities().CommitQuorum && quorum != "majority":
			t.Errorf("createIndexes on %s asks commitQuorum %q, want \"majority\": %s", coll, quorum, cmd)
		case !s.Capabilities().CommitQuorum && cmd.Lookup("commitQuorum").Type != 0:
			t.Errorf("createIndexes on %s sends a commitQuorum the server does not take: %s", coll, cmd)
		}
	}
	if builds != len(indexSpecs) {
		t.Fatalf("EnsureSchema built %d indexes on a fresh database, want %d", builds, len(indexSpecs))
	}
	t.Logf("commit quorum taken by the server: %v", s.Capabilities().CommitQuorum)
}

// A hello that fails at start is asked again: after two failures detection still finds the change streams
// the server has, and a hello that keeps failing is an error of the start, never "no change streams" for
// the rest of the process.
func testChangeStreamDetectionSurvivesFailedHello(t *testing.T, e *env) {
	b := e.setup(t)
	real := New(b.client, b.options(nil))
	want, err := real.supportsChangeStreams(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	failing := errors.New("connection reset (test)")
	var calls atomic.Int32
	s := New(b.client, b.options(nil))
	s.hello = func(ctx context.Context) (helloReply, error) {
		if calls.Add(1) <= 2 {
			return helloReply{}, failing
		}
		var r helloReply
		err := b.client.Database(b.dbName).RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&r)
		return r, err
	}
	caps, err := s.DetectCapabilities(b.ctx)
	if err != nil {
		t.Fatalf("DetectCapabilities after two failed hellos: %v", err)
	}
	if caps.ChangeStreams != want || caps.ChangeStreams != e.features.ChangeStreams {
		t.Errorf("ChangeStreams = %v after two failed hellos, want %v (the server's)", caps.ChangeStreams, want)
	}
	if n := calls.Load(); n != 3 {
		t.Errorf("hello asked %d times, want 3 (two failures, one answer)", n)
	}
	s.hello = func(context.Context) (helloReply, error) { return helloReply{}, failing }
	if _, err := s.DetectCapabilities(b.ctx); !errors.Is(err, failing) {
		t.Errorf("DetectCapabilities with hello failing every time = %v, want its error", err)
	}
}
