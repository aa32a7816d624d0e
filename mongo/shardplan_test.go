package mongo

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	mevent "go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/pulse-sidecar/pulse/mongo/storetest"
	"github.com/pulse-sidecar/pulse/pulsetype"
)

// shardPlan is the sharding plan of docs/mongodb-production.md ("Sharding"): the shard key of each sharded
// collection (subscriptions stays unsharded: one small document per consumer group).
var shardPlan = map[string][]string{
	"events":     {"_id"},                      // hashed: UUIDv7 ids are monotonic
	"deliveries": {"consumerGroup", "eventId"}, // ranged, the unique index pulse_deliveries_group_event_unique
	"history":    {"deliveryId", "attempt"},    // ranged, the unique index pulse_history_delivery_attempt_unique
}

// scatterPlan lists the hot queries the plan accepts as scatter-gather (their filter lacks the shard key's
// first field), as "<collection> <command> <filter fields>"; docs/mongodb-production.md says why for each.
var scatterPlan = map[string]bool{
	"events find createdAt,fanout":                          true, // repair: stale fan-out marks (index pulse_events_fanout)
	"events find createdAt,fanout,orderingKey,topic":        true, // ordered head check: earlier unfinished fan-outs of its line
	"events find createdAt,fanout,topic":                    true, // the same for a line of events without ordering key
	"events find _id,staged,topic":                          true, // backfill walk by topic from a cursor (_id range, not equality)
	"events update _id,fanout":                              true, // clearing fan-out marks, _id $in: targeted to the shards holding them
	"deliveries find _id,status":                            true, // repair scan: pending deliveries in _id order
	"deliveries update _id,status":                          true, // ending deliveries by _id
	"history find lockedUntil,status":                       true, // reaper: expired leases
	"history find lockedUntil,nextAttemptAt,status":         true, // claim window: due, unleased attempts
	"history update _id,lockedUntil,status":                 true, // claim by id (no lease yet)
	"history update _id,lockToken,status":                   true, // fenced result and renewal writes
	"history find lockToken":                                true, // read back what a claim leased
	"history find _id,lockToken,status":                     true, // read back renewed leases
	"history find _id":                                      true, // read back finished attempts
	"history update consumerGroup,lockedUntil,status":       true, // ending a deleted group's unleased attempts
	"history find consumerGroup,lockedUntil,status":         true, // finding a deleted group's leased attempts
	"history update consumerGroup,lockedUntil,status,topic": true, // the same for dropped topics
	"history find consumerGroup,lockedUntil,status,topic":   true,
	"deliveries find _id":                                   true, // deliveries by _id: of queued work (repair scan, a line's head, lines of retries), of an ordered head's earlier events
	"deliveries find status":                                true, // the one-time queue migration: pending deliveries
	"events find fanout":                                    true, // the one-time queue migration: events marked for fan-out
}

// filterFields returns the top-level field names of a query filter, sorted, operators ($or, $and) left out.
func filterFields(filter bson.Raw) []string {
	elems, err := filter.Elements()
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range elems {
		if k := e.Key(); !strings.HasPrefix(k, "$") {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// commandFilters returns the collection and the filters of a read or write command, or ok=false for a
// command that carries none (insert: the documents carry the full shard key; admin commands).
func commandFilters(name string, cmd bson.Raw) (coll string, filters []bson.Raw, ok bool) {
	c, isStr := cmd.Lookup(name).StringValueOK()
	if !isStr {
		return "", nil, false
	}
	doc := func(key string) (bson.Raw, bool) { return cmd.Lookup(key).DocumentOK() }
	switch name {
	case "find":
		f, _ := doc("filter")
		return c, []bson.Raw{f}, true
	case "count":
		f, _ := doc("query")
		return c, []bson.Raw{f}, true
	case "findAndModify":
		f, _ := doc("query")
		return c, []bson.Raw{f}, true
	case "update", "delete":
		key := map[string]string{"update": "updates", "delete": "deletes"}[name]
		arr, isArr := cmd.Lookup(key).ArrayOK()
		if !isArr {
			return c, nil, true
		}
		vals, _ := arr.Values()
		for _, v := range vals {
			if d, isDoc := v.DocumentOK(); isDoc {
				q, _ := d.Lookup("q").DocumentOK()
				filters = append(filters, q)
			}
		}
		return c, filters, true
	case "aggregate":
		arr, isArr := cmd.Lookup("pipeline").ArrayOK()
		if !isArr {
			return c, nil, true
		}
		vals, _ := arr.Values()
		if len(vals) > 0 {
			if st, isDoc := vals[0].DocumentOK(); isDoc {
				if m, isMatch := st.Lookup("$match").DocumentOK(); isMatch {
					return c, []bson.Raw{m}, true
				}
			}
		}
		return c, []bson.Raw{nil}, true
	}
	return "", nil, false
}

// Every hot query of the delivery path, run for real and captured at the driver, is targeted by the plan's
// shard key (its filter names the key's first field) or listed in scatterPlan; each shard key is a prefix
// of every unique index of its collection (a MongoDB rule for sharded collections). A new query that is
// neither fails here until the plan and docs/mongodb-production.md classify it.
func testShardPlanCoversHotQueries(t *testing.T, e *env) {
	b := e.setup(t)
	var mu sync.Mutex
	seen := map[string]bool{}
	prefix := testPrefix + "."
	monitor := &mevent.CommandMonitor{Started: func(_ context.Context, e *mevent.CommandStartedEvent) {
		coll, filters, ok := commandFilters(e.CommandName, e.Command)
		if !ok || !strings.HasPrefix(coll, prefix) {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		for _, f := range filters {
			seen[fmt.Sprintf("%s %s %s", strings.TrimPrefix(coll, prefix), e.CommandName, strings.Join(filterFields(f), ","))] = true
		}
	}}
	client := b.srv.Connect(options.Client().SetMonitor(monitor))
	s := b.store(client, nil)
	ctx := b.ctx

	// The delivery path: registration, publish (one and many), fan-out, claims, renewal, results,
	// follow-ups, the head of an ordered line, reaping, repair scans and backfill.
	b.putEndpoint(s, "g", "t")
	ordered := b.endpoint("o", "t")
	ordered.Ordered = true
	if _, _, err := s.PutEndpoint(ctx, ordered); err != nil {
		t.Fatal(err)
	}
	earliest := b.endpoint("e", "t")
	earliest.OffsetReset = pulsetype.OffsetEarliest
	if _, _, err := s.PutEndpoint(ctx, earliest); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Publish(ctx, []*pulsetype.Event{storetest.Event("ev-1", "t", "1")}); err != nil {
		t.Fatal(err)
	}
	evs := []*pulsetype.Event{storetest.Event("ev-2", "t", "2"), storetest.Event("ev-3", "t", "3")}
	if _, err := s.Publish(ctx, evs); err != nil {
		t.Fatal(err)
	}
	first, err := s.FanOut(ctx, append(evs, storetest.Event("ev-1", "t", "1")))
	if err != nil {
		t.Fatal(err)
	}
	leased, err := s.ClaimAttempts(ctx, "w", first[:1])
	if err != nil || len(leased) != 1 {
		t.Fatalf("ClaimAttempts = %v, %v", leased, err)
	}
	if _, err := s.Renew(ctx, []pulsetype.LeaseKey{leased[0].Key()}); err != nil {
		t.Fatal(err)
	}
	res := pulsetype.AttemptResult{Status: pulsetype.StatusError, HTTPStatus: 500, Duration: time.Millisecond,
		Error: &pulsetype.ErrorInfo{Code: pulsetype.CodeHandlerError, Message: "HTTP 500"}}
	cs := []pulsetype.Completion{{Attempt: leased[0], Result: res, Next: pulsetype.NextStep{Retry: true, Delay: time.Second}}}
	if _, err := s.FinishAttempts(ctx, cs); err != nil {
		t.Fatal(err)
	}
	if err := s.FollowUps(ctx, cs); err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(time.Minute)
	if _, err := s.ClaimBatch(ctx, "w", nil, 4); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.ClaimHead(ctx, "w", pulsetype.Line{ConsumerGroup: "o", Topic: "t"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ReapOne(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.ClearFanOut(ctx, []string{"ev-1", "ev-2"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.FanOutStale(ctx, time.Second, 10); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Backfill(ctx, "w", 10); err != nil {
		t.Fatal(err)
	}
	page, err := s.QueuedDeliveries(ctx, "", 10)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.RepairQueue(ctx, page.Repairs); err != nil {
		t.Fatal(err)
	}
	ids := make([]string, len(page.Deliveries))
	for i, d := range page.Deliveries {
		ids[i] = d.ID
	}
	if _, err := s.AttemptsOf(ctx, ids); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetEvents(ctx, []string{"ev-1", "ev-3"}); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteEndpoint(ctx, "g"); err != nil {
		t.Fatal(err)
	}

	mu.Lock()
	defer mu.Unlock()
	targeted, scattered := 0, 0
	for q := range seen {
		parts := strings.SplitN(q, " ", 3)
		key, sharded := shardPlan[parts[0]]
		if !sharded {
			continue
		}
		if slices.Contains(strings.Split(parts[2], ","), key[0]) {
			targeted++
			continue
		}
		if !scatterPlan[q] {
			t.Errorf("hot query %q is neither targeted by the shard key %v nor listed as scatter in the plan", q, key)
		}
		scattered++
	}
	t.Logf("%d hot query shapes: %d targeted, %d scatter-gather", targeted+scattered, targeted, scattered)
	if targeted == 0 || scattered == 0 {
		t.Fatalf("captured %v: the workload did not reach the store's queries", seen)
	}
	for _, spec := range indexSpecs {
		key, sharded := shardPlan[spec.coll]
		if !sharded || !spec.unique {
			continue
		}
		for i, k := range key {
			if i >= len(spec.keys) || spec.keys[i].Key != k {
				t.Errorf("unique index %s does not start with the shard key %v of %s", spec.name, key, spec.coll)
				break
			}
		}
	}
}
