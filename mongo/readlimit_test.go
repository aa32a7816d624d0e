package mongo

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	mevent "go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// readCommands are the commands that read documents, each of which must carry a server-side time limit.
var readCommands = map[string]bool{"find": true, "aggregate": true, "count": true, "distinct": true}

// Every read command the store sends (find, aggregate, count, distinct) carries a server-side time limit,
// maxTimeMS, derived from its deadline: on a client with the sidecar's operation timeout, the whole hot-path
// workload (every path of the store) sends none without it. The driver leaves it off finds and aggregations
// (their cursors are the caller's), so a poll, a replay or GET /v1/activity ran on in the server after the
// client gave up.
func testReadsCarryAServerSideLimit(t *testing.T, e *env) {
	b := e.setup(t)
	var (
		mu      sync.Mutex
		reads   = map[string]int{}
		without = map[string]int{}
	)
	monitor := &mevent.CommandMonitor{Started: func(_ context.Context, ev *mevent.CommandStartedEvent) {
		if !readCommands[ev.CommandName] {
			return
		}
		if first, err := ev.Command.LookupErr("pipeline", "0", "$changeStream"); err == nil && first.Type != 0 {
			return // a change stream: its getMores wait for events, it has no end to bound
		}
		coll, _ := ev.Command.Lookup(ev.CommandName).StringValueOK()
		what := fmt.Sprintf("%s %s", ev.CommandName, coll)
		ms, ok := ev.Command.Lookup("maxTimeMS").AsInt64OK()
		mu.Lock()
		defer mu.Unlock()
		reads[what]++
		if !ok || ms <= 0 {
			without[what]++
		}
	}}
	caps, err := New(b.client, b.options(nil)).DetectCapabilities(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	caps.ScansFilters = false
	// As the sidecar's client: every operation without a deadline of its own gets one (OperationTimeout).
	client := b.srv.Connect(options.Client().SetMonitor(monitor).SetTimeout(time.Minute))
	s := b.store(client, func(o *Options) {
		o.Capabilities = &caps
		o.HistoryRetention = 48 * time.Hour
		o.EventRetention = 48 * time.Hour
	})
	hotPathWorkload(t, b, s)
	// A context without a deadline: the client's operation timeout gives one.
	if _, err := s.ListEndpoints(context.WithoutCancel(b.ctx)); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(reads) == 0 {
		t.Fatal("the workload sent no read command")
	}
	for what, n := range without {
		t.Errorf("%d of %d %s commands carried no maxTimeMS", n, reads[what], what)
	}
	t.Logf("read commands with a server-side limit: %v", reads)
}
