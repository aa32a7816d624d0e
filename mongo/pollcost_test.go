package mongo

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.mongodb.org/mongo-driver/v2/bson"
	driverevent "go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/pulse-sidecar/pulse/internal/testdb"
	"github.com/pulse-sidecar/pulse/mongo/storetest"
	"github.com/pulse-sidecar/pulse/pulsetype"
	"github.com/pulse-sidecar/pulse/reconciler"
)

// BenchmarkPollCost measures what one poll of an idle replica costs the database as retained history grows:
// the dispatcher's claim query (ClaimBatch), the reaper's (ReapOne) and one repair pass of the reconciler
// (Repair). It reports per poll the database commands and the documents they examine, at 0, 5,000 and
// 20,000 retained events (delivered to two consumer groups and finished), each without and with 100
// pending deliveries (a retry due in an hour, so the poll leaves them as they are). The retention sweep,
// which runs once a minute, is reported apart (sweep-docs/run).
//
// Documents examined come from explain: executionStats.totalDocsExamined where the server reports it
// (MongoDB). FerretDB's explain reports only whether it pushed the filter down to its storage
// (filterPushdown); where it did, the documents the query matches are counted; where it did not, a filter
// anchored on _id counts one document per id (the embedded database's proxy reads them one id at a time, by
// index: internal/devdb, pushdown.go), and any other the whole collection, which is what FerretDB reads.
//
// Run: go test -run '^$' -bench PollCost -benchtime 5x -timeout 60m ./mongo/
func BenchmarkPollCost(b *testing.B) {
	pc := newPollCost(b)
	for _, retained := range []int{0, 5000, 20000} {
		for _, pending := range []int{0, 100} {
			b.Run(fmt.Sprintf("retained=%d/pending=%d", retained, pending), func(b *testing.B) {
				pc.retain(b, retained)
				keys := pc.makePending(b, pending)
				defer pc.finishPending(b, keys)
				var cmds, docs, claim, reap, repair int64
				var took time.Duration
				polls := 0
				for b.Loop() {
					for i, call := range []func(context.Context) error{
						func(ctx context.Context) error {
							_, err := pc.store.ClaimBatch(ctx, "poller", nil, maxPollClaim)
							return err
						},
						func(ctx context.Context) error { _, err := pc.store.ReapOne(ctx); return err },
						func(ctx context.Context) error { _, err := pc.recon.Repair(ctx); return err },
					} {
						c, d, t := pc.measure(b, call)
						cmds, docs, took = cmds+c, docs+d, took+t
						*[]*int64{&claim, &reap, &repair}[i] += d
					}
					polls++
				}
				_, sweep, _ := pc.measure(b, func(ctx context.Context) error { _, err := pc.store.Sweep(ctx); return err })
				n := float64(polls)
				b.ReportMetric(float64(took.Microseconds())/1000/n, "ms/poll")
				b.ReportMetric(float64(cmds)/n, "cmds/poll")
				b.ReportMetric(float64(docs)/n, "docs/poll")
				b.ReportMetric(float64(claim)/n, "claim-docs/poll")
				b.ReportMetric(float64(reap)/n, "reap-docs/poll")
				b.ReportMetric(float64(repair)/n, "repair-docs/poll")
				b.ReportMetric(float64(sweep), "sweep-docs/run")
			})
		}
	}
}

// maxPollClaim is the claim limit of a poll measured here: ClaimBatch's, whose read is three times it (48),
// as the dispatcher claimed before its due window; its claims from the window now take up to 64.
const maxPollClaim = 16

// drainWindow is the largest due window the dispatcher reads to drain a backlog (its maxDueWindow).
const drainWindow = 16384

// BenchmarkDrainCost measures what claiming costs the database per claimed attempt while a backlog of due
// attempts waits, at 0 (live traffic: a poll that finds nothing), 5,000, 20,000 and 100,000 pending: the
// dispatcher's way (one window read, DueAttempts with the dispatcher's largest window, then claims by id,
// ClaimAttempts of maxPollClaim at a time; window-docs/claimed is the read's documents spread over the
// attempts it found, plus the claims' per claimed attempt) against a read per claim (ClaimBatch,
// batch-docs/claimed). Documents examined are counted as in BenchmarkPollCost. With nothing pending, the
// figures are per poll instead (nothing is claimed). The backlog is written directly (a pending delivery,
// its due first attempt and its queue document per event and group), in inserts of 1,000.
//
// Run: go test -run '^$' -bench DrainCost -benchtime 3x -timeout 60m ./mongo/
func BenchmarkDrainCost(b *testing.B) {
	pc := newPollCost(b)
	for _, pending := range []int{0, 5000, 20000, 100000} {
		b.Run(fmt.Sprintf("pending=%d", pending), func(b *testing.B) {
			var windowDocs, windowCmds, windowFound, claimDocs, claimCmds, claimed, batchDocs, batchCmds, batchClaimed int64
			for b.Loop() {
				pc.makeDue(b, pending)
				var window []*pulsetype.Attempt
				c, d, _ := pc.measure(b, func(ctx context.Context) error {
					var err error
					window, err = pc.store.DueAttempts(ctx, nil, drainWindow)
					return err
				})
				windowDocs, windowCmds, windowFound = windowDocs+d, windowCmds+c, windowFound+int64(len(window))
				for chunk := range slices.Chunk(window[:min(len(window), 4*maxPollClaim)], maxPollClaim) {
					var got []*pulsetype.Attempt
					c, d, _ := pc.measure(b, func(ctx context.Context) error {
						var err error
						got, err = pc.store.ClaimAttempts(ctx, "drainer", chunk)
						return err
					})
					claimCmds, claimDocs, claimed = claimCmds+c, claimDocs+d, claimed+int64(len(got))
					pc.due -= len(got)
				}
				for range 4 {
					var got []*pulsetype.Attempt
					c, d, _ := pc.measure(b, func(ctx context.Context) error {
						var err error
						got, err = pc.store.ClaimBatch(ctx, "drainer", nil, maxPollClaim)
						return err
					})
					batchCmds, batchDocs, batchClaimed = batchCmds+c, batchDocs+d, batchClaimed+int64(len(got))
					pc.due -= len(got)
				}
			}
			if claimed == 0 || batchClaimed == 0 {
				n := float64(b.N)
				b.ReportMetric(float64(windowDocs)/n, "window-docs/poll")
				b.ReportMetric(float64(batchDocs)/n/4, "batch-docs/poll")
				return
			}
			// One window serves the min(found, drainWindow) attempts it found: its read is spread over them.
			perWindow := float64(windowDocs) / float64(windowFound)
			b.ReportMetric(perWindow+float64(claimDocs)/float64(claimed), "window-docs/claimed")
			b.ReportMetric(float64(windowCmds)/float64(windowFound)+float64(claimCmds)/float64(claimed), "window-cmds/claimed")
			b.ReportMetric(float64(batchDocs)/float64(batchClaimed), "batch-docs/claimed")
			b.ReportMetric(float64(batchCmds)/float64(batchClaimed), "batch-cmds/claimed")
		})
	}
}

// makeDue writes due work until n attempts are due and unleased (pc.due counts them): per event and group
// a pending delivery, its first attempt (pending, unleased, due a minute ago) and its queue document.
func (pc *pollCost) makeDue(b *testing.B, n int) {
	ctx := context.Background()
	at := time.Now().UTC().Add(-time.Minute).Truncate(time.Millisecond)
	for pc.due < n {
		var deliveries, attempts, queue []any
		for range min(n-pc.due, 1000) / 2 * 2 {
			id := fmt.Sprintf("due-%07d", pc.next)
			pc.next++
			for _, g := range []string{"ledger", "mailer"} {
				if pc.due >= n {
					break
				}
				did := DeliveryID(g, id)
				deliveries = append(deliveries, bson.M{"_id": did, "eventId": id, "consumerGroup": g, "topic": "t", "eventCreatedAt": at,
					"status": "pending", "createdAt": at, "updatedAt": at})
				attempts = append(attempts, bson.M{"_id": did + "-1", "deliveryId": did, "eventId": id, "consumerGroup": g, "topic": "t",
					"attempt": 1, "status": "pending", "createdAt": at, "nextAttemptAt": at})
				queue = append(queue, bson.M{"_id": did + "-1", "deliveryId": did, "eventId": id, "consumerGroup": g, "topic": "t",
					"eventCreatedAt": at, "attempt": 1, "createdAt": at, "nextAttemptAt": at})
				pc.due++
			}
		}
		if len(queue) == 0 {
			return
		}
		for _, c := range []struct {
			coll string
			docs []any
		}{{"deliveries", deliveries}, {"history", attempts}, {"queue", queue}} {
			if _, err := pc.explain.Collection(testPrefix+"."+c.coll).InsertMany(ctx, c.docs); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// pollCost is BenchmarkPollCost's store, with a command monitor that records the commands of one measured
// call, and the history it grew so far.
type pollCost struct {
	store    *Store
	recon    *reconciler.Reconciler
	explain  *mongo.Database // the same database through a client without the monitor
	mu       sync.Mutex
	record   bool
	commands []bson.Raw
	retained int // events delivered and finished so far
	due      int // attempts written due by makeDue and not claimed yet
	next     int // the next event number
}

func newPollCost(b *testing.B) *pollCost {
	pc := &pollCost{}
	uri := testdb.URI(b)
	client, err := mongo.Connect(options.Client().ApplyURI(uri).SetMonitor(&driverevent.CommandMonitor{
		Started: func(_ context.Context, e *driverevent.CommandStartedEvent) {
			pc.mu.Lock()
			if pc.record {
				pc.commands = append(pc.commands, slices.Clone(e.Command))
			}
			pc.mu.Unlock()
		},
	}))
	if err != nil {
		b.Fatal(err)
	}
	plain, err := mongo.Connect(options.Client().ApplyURI(uri))
	if err != nil {
		b.Fatal(err)
	}
	dbName := fmt.Sprintf("pollcost_%d", time.Now().UnixNano())
	b.Cleanup(func() {
		_ = plain.Database(dbName).Drop(context.Background())
		_ = client.Disconnect(context.Background())
		_ = plain.Disconnect(context.Background())
	})
	pc.explain = plain.Database(dbName)
	pc.store = New(client, Options{Database: dbName, CollectionPrefix: testPrefix, LeaseTimeout: 30 * time.Second, Logger: zerolog.Nop()})
	ctx := context.Background()
	if _, err := pc.store.EnsureSchema(ctx); err != nil {
		b.Fatal(err)
	}
	for _, g := range []string{"ledger", "mailer"} {
		ep := &pulsetype.Endpoint{ConsumerGroup: g, URL: "http://127.0.0.1:9/" + g, Topics: []string{"t"}}
		if err := ep.Normalize(); err != nil {
			b.Fatal(err)
		}
		if _, _, err := pc.store.PutEndpoint(ctx, ep); err != nil {
			b.Fatal(err)
		}
	}
	pc.recon = reconciler.New(pc.store, "poller", 30*time.Second, nil, zerolog.Nop())
	return pc
}

// publish publishes n events in arrays of 1,000, fans them out and claims their first attempts; it returns
// the leased attempts.
func (pc *pollCost) publish(b *testing.B, n int) []*pulsetype.Attempt {
	ctx := context.Background()
	var leased []*pulsetype.Attempt
	for n > 0 {
		batch := min(n, 1000)
		events := make([]*pulsetype.Event, batch)
		ids := make([]string, batch)
		for i := range events {
			events[i] = storetest.Event(fmt.Sprintf("evt-%07d", pc.next), "t", `{"amount":1}`)
			ids[i] = events[i].ID
			pc.next++
		}
		if _, err := pc.store.Publish(ctx, events); err != nil {
			b.Fatal(err)
		}
		created, err := pc.store.FanOut(ctx, events)
		if err != nil {
			b.Fatal(err)
		}
		if err := pc.store.ClearFanOut(ctx, ids); err != nil {
			b.Fatal(err)
		}
		got, err := pc.store.ClaimAttempts(ctx, "poller", created)
		if err != nil || len(got) != len(created) {
			b.Fatalf("ClaimAttempts = %d of %d, %v", len(got), len(created), err)
		}
		leased = append(leased, got...)
		n -= batch
	}
	return leased
}

// finish records results of leased attempts with their next steps, as the dispatcher's recorder does.
func (pc *pollCost) finish(b *testing.B, cs []pulsetype.Completion) {
	ctx := context.Background()
	for chunk := range slices.Chunk(cs, 1000) {
		if _, err := pc.store.FinishAttempts(ctx, chunk); err != nil {
			b.Fatal(err)
		}
		if err := pc.store.FollowUps(ctx, chunk); err != nil {
			b.Fatal(err)
		}
	}
}

// succeeded returns the completions of attempts that succeeded.
func succeeded(attempts []*pulsetype.Attempt) []pulsetype.Completion {
	cs := make([]pulsetype.Completion, len(attempts))
	for i, a := range attempts {
		cs[i] = pulsetype.Completion{Attempt: a, Result: pulsetype.AttemptResult{Status: pulsetype.StatusSuccess, HTTPStatus: 200, Duration: time.Millisecond},
			Next: pulsetype.NextStep{EndStatus: pulsetype.StatusSuccess}}
	}
	return cs
}

// retain adds delivered events until n are retained: each event, its delivery to both groups and their
// successful first attempts, written as the delivery path leaves them once finished (no fanout mark, the
// deliveries ended, the attempts ended with their lease fields), in inserts of 1,000 events. That is the
// state whatever indexes the pending work (nothing of it is pending), and far quicker to write on the
// embedded database than delivering 20,000 events one by one.
func (pc *pollCost) retain(b *testing.B, n int) {
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Millisecond)
	for pc.retained < n {
		batch := min(n-pc.retained, 1000)
		var events, deliveries, attempts []any
		for range batch {
			id := fmt.Sprintf("evt-%07d", pc.next)
			pc.next++
			events = append(events, bson.M{"_id": id, "topic": "t", "data": `{"amount":1}`, "createdAt": now})
			for _, g := range []string{"ledger", "mailer"} {
				did := DeliveryID(g, id)
				deliveries = append(deliveries, bson.M{"_id": did, "eventId": id, "consumerGroup": g, "topic": "t", "eventCreatedAt": now,
					"status": "success", "createdAt": now, "updatedAt": now, "endedAt": now, "finalAttempt": 1})
				attempts = append(attempts, bson.M{"_id": did + "-1", "deliveryId": did, "eventId": id, "consumerGroup": g, "topic": "t",
					"attempt": 1, "status": "success", "createdAt": now, "nextAttemptAt": now, fieldStartedAt: now, fieldLeaseOwner: "poller",
					fieldFencingToken: "t", fieldLeasedAt: now, fieldLeasedUntil: now, fieldHeartbeatAt: now, "endedAt": now, "httpStatus": 200, "durationMs": 1})
			}
		}
		for _, c := range []struct {
			coll string
			docs []any
		}{{"events", events}, {"deliveries", deliveries}, {"history", attempts}} {
			if _, err := pc.explain.Collection(testPrefix+"."+c.coll).InsertMany(ctx, c.docs); err != nil {
				b.Fatal(err)
			}
		}
		pc.retained += batch
	}
}

// makePending publishes n events whose first attempts fail with a retry due in an hour: n pending
// deliveries per group, waiting. It returns their delivery ids.
func (pc *pollCost) makePending(b *testing.B, n int) []string {
	if n == 0 {
		return nil
	}
	leased := pc.publish(b, n)
	cs := make([]pulsetype.Completion, len(leased))
	ids := make([]string, len(leased))
	for i, a := range leased {
		cs[i] = pulsetype.Completion{Attempt: a, Result: pulsetype.AttemptResult{Status: pulsetype.StatusError, HTTPStatus: 500,
			Error: &pulsetype.ErrorInfo{Code: pulsetype.CodeHandlerError, Message: "HTTP 500"}}, Next: pulsetype.NextStep{Retry: true, Delay: time.Hour}}
		ids[i] = a.DeliveryID
	}
	pc.finish(b, cs)
	return ids
}

// finishPending delivers the waiting retries of deliveries: they join the retained history.
func (pc *pollCost) finishPending(b *testing.B, deliveries []string) {
	if len(deliveries) == 0 {
		return
	}
	ctx := context.Background()
	byDelivery, err := pc.store.AttemptsOf(ctx, deliveries)
	if err != nil {
		b.Fatal(err)
	}
	var waiting []*pulsetype.Attempt
	for _, as := range byDelivery {
		if last := as[len(as)-1]; last.Status == pulsetype.StatusPending {
			waiting = append(waiting, last)
		}
	}
	leased, err := pc.store.ClaimAttempts(ctx, "poller", waiting)
	if err != nil || len(leased) != len(deliveries) {
		b.Fatalf("ClaimAttempts = %d of %d, %v", len(leased), len(deliveries), err)
	}
	pc.finish(b, succeeded(leased))
	pc.retained += len(deliveries) / 2
}

// measure runs call and returns how many database commands it sent, how many documents they examined, and
// how long it took (explain runs after it, untimed).
func (pc *pollCost) measure(b *testing.B, call func(context.Context) error) (commands, docs int64, took time.Duration) {
	ctx := context.Background()
	pc.mu.Lock()
	pc.record, pc.commands = true, nil
	pc.mu.Unlock()
	start := time.Now()
	err := call(ctx)
	took = time.Since(start)
	pc.mu.Lock()
	pc.record = false
	sent := pc.commands
	pc.mu.Unlock()
	if err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	defer b.StartTimer()
	for _, cmd := range sent {
		docs += pc.examined(b, cmd)
	}
	return int64(len(sent)), docs, took
}

// examined returns how many documents the command cmd examined, from explain (see BenchmarkPollCost).
// Commands without a query (inserts, getMore, endSessions) examine none.
func (pc *pollCost) examined(b *testing.B, cmd bson.Raw) int64 {
	name := cmd.Index(0).Key()
	coll, _ := cmd.Index(0).Value().StringValueOK()
	type query struct {
		explain bson.D
		filter  bson.RawValue
	}
	var queries []query
	// find returns the explain of a find on coll with the fields of doc named in fields, renamed as given.
	find := func(doc bson.Raw, fields map[string]string) query {
		q := query{explain: bson.D{{Key: "find", Value: coll}}}
		for from, to := range fields {
			if v, err := doc.LookupErr(from); err == nil {
				q.explain = append(q.explain, bson.E{Key: to, Value: v})
				if to == "filter" {
					q.filter = v
				}
			}
		}
		return q
	}
	switch name {
	case "find", "count":
		queries = append(queries, find(cmd, map[string]string{"filter": "filter", "query": "filter", "sort": "sort", "limit": "limit"}))
	case "aggregate":
		queries = append(queries, query{explain: bson.D{{Key: "aggregate", Value: coll}, {Key: "pipeline", Value: cmd.Lookup("pipeline")}, {Key: "cursor", Value: bson.D{}}}})
	case "findAndModify":
		queries = append(queries, find(cmd, map[string]string{"query": "filter", "sort": "sort"}))
	case "update", "delete":
		stmts, _ := cmd.Lookup(map[string]string{"update": "updates", "delete": "deletes"}[name]).ArrayOK()
		vals, _ := stmts.Values()
		for _, v := range vals {
			queries = append(queries, find(v.Document(), map[string]string{"q": "filter"}))
		}
	}
	var total int64
	for _, q := range queries {
		var out bson.Raw
		ctx := context.Background()
		if err := pc.explain.RunCommand(ctx, bson.D{{Key: "explain", Value: q.explain}, {Key: "verbosity", Value: "executionStats"}}).Decode(&out); err != nil {
			b.Fatalf("explain %s: %v", q.explain, err)
		}
		if n, ok := findInt(out, "totalDocsExamined"); ok {
			total += n
			continue
		}
		var filter any = bson.D{} // not pushed down: every document of the collection is read
		if pushed, _ := out.Lookup("filterPushdown").BooleanOK(); pushed && q.filter.Type == bson.TypeEmbeddedDocument {
			filter = q.filter.Document()
		} else if n, ok := idAnchored(q.filter); ok {
			total += n // the embedded database's proxy reads them one id at a time, by index
			continue
		}
		n, err := pc.explain.Collection(coll).CountDocuments(ctx, filter)
		if err != nil {
			b.Fatal(err)
		}
		total += n
	}
	return total
}

// idAnchored reports whether filter is one the embedded database's proxy serves one id at a time
// (internal/devdb, pushdown.go): a top-level _id that is a string, or an $in of at most 512 strings, beside
// any other conditions; it returns how many ids it names.
func idAnchored(filter bson.RawValue) (int64, bool) {
	doc, ok := filter.DocumentOK()
	if !ok {
		return 0, false
	}
	id, err := doc.LookupErr("_id")
	if err != nil {
		return 0, false
	}
	if _, ok := id.StringValueOK(); ok {
		return 1, true
	}
	if id.Type != bson.TypeEmbeddedDocument {
		return 0, false
	}
	in, err := id.Document().LookupErr("$in")
	if err != nil || in.Type != bson.TypeArray {
		return 0, false
	}
	vals, err := in.Array().Values()
	if err != nil || len(vals) > 512 {
		return 0, false
	}
	return int64(len(vals)), true
}

// findInt returns the first integer named key in doc, depth first.
func findInt(doc bson.Raw, key string) (int64, bool) {
	elems, _ := doc.Elements()
	for _, e := range elems {
		if e.Key() == key {
			if n, ok := e.Value().AsInt64OK(); ok {
				return n, true
			}
		}
		var sub bson.Raw
		switch e.Value().Type {
		case bson.TypeEmbeddedDocument:
			sub = e.Value().Document()
		case bson.TypeArray:
			sub = bson.Raw(e.Value().Array())
		default:
			continue
		}
		if n, ok := findInt(sub, key); ok {
			return n, true
		}
	}
	return 0, false
}
