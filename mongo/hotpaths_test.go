package mongo

import (
	"context"
	"fmt"
	"slices"
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

// sentQuery is one query a command sent to a collection of the store: a find, count, distinct or
// aggregate's first $match, or one statement of an update or delete, or a findAndModify.
type sentQuery struct {
	Coll   string   // collection suffix, as in "history"
	Cmd    string   // the command's name
	Filter bson.Raw // the query filter (nil: none)
	Sort   bson.Raw // the sort, when the command has one
	Hint   string   // the index named by hint, when given
	Multi  bool     // an update or delete statement of many documents (updateMany, deleteMany)
	Upsert bool     // an update or findAndModify statement that inserts when nothing matches
}

// queryCapture records the queries a client sends to the collections <prefix>.*, through the driver's
// command monitor. It is safe for concurrent use.
type queryCapture struct {
	prefix string
	mu     sync.Mutex
	sent   []sentQuery
}

func (c *queryCapture) monitor() *mevent.CommandMonitor {
	return &mevent.CommandMonitor{Started: func(_ context.Context, e *mevent.CommandStartedEvent) {
		qs := queriesOf(e.CommandName, e.Command)
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, q := range qs {
			if !strings.HasPrefix(q.Coll, c.prefix) || strings.Contains(q.Coll, "schema_probe_") {
				continue
			}
			q.Coll = strings.TrimPrefix(q.Coll, c.prefix)
			c.sent = append(c.sent, q)
		}
	}}
}

// queries returns what was recorded so far.
func (c *queryCapture) queries() []sentQuery {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.sent)
}

// queriesOf returns the queries of one command (none for a command that carries no filter: insert, the
// index and admin commands).
func queriesOf(name string, cmd bson.Raw) []sentQuery {
	coll, ok := cmd.Lookup(name).StringValueOK()
	if !ok {
		return nil
	}
	doc := func(d bson.Raw, key string) bson.Raw {
		v, _ := d.Lookup(key).DocumentOK()
		return bson.Raw(slices.Clone(v))
	}
	hint := func(d bson.Raw) string { h, _ := d.Lookup("hint").StringValueOK(); return h }
	switch name {
	case "find":
		return []sentQuery{{Coll: coll, Cmd: name, Filter: doc(cmd, "filter"), Sort: doc(cmd, "sort"), Hint: hint(cmd)}}
	case "count", "distinct":
		return []sentQuery{{Coll: coll, Cmd: name, Filter: doc(cmd, "query"), Hint: hint(cmd)}}
	case "findAndModify":
		up, _ := cmd.Lookup("upsert").BooleanOK()
		return []sentQuery{{Coll: coll, Cmd: name, Filter: doc(cmd, "query"), Sort: doc(cmd, "sort"), Hint: hint(cmd), Upsert: up}}
	case "aggregate":
		arr, _ := cmd.Lookup("pipeline").ArrayOK()
		vals, _ := arr.Values()
		q := sentQuery{Coll: coll, Cmd: name, Hint: hint(cmd)}
		for i, v := range vals {
			st, _ := v.DocumentOK()
			switch {
			case i == 0 && st.Lookup("$match").Type != 0:
				q.Filter = doc(st, "$match")
			case i <= 1 && st.Lookup("$sort").Type != 0:
				q.Sort = doc(st, "$sort")
			}
		}
		return []sentQuery{q}
	case "update", "delete":
		key := map[string]string{"update": "updates", "delete": "deletes"}[name]
		arr, _ := cmd.Lookup(key).ArrayOK()
		vals, _ := arr.Values()
		var out []sentQuery
		for _, v := range vals {
			st, _ := v.DocumentOK()
			multi, _ := st.Lookup("multi").BooleanOK()
			if limit, ok := st.Lookup("limit").AsInt64OK(); ok && name == "delete" {
				multi = limit == 0
			}
			up, _ := st.Lookup("upsert").BooleanOK()
			out = append(out, sentQuery{Coll: coll, Cmd: name, Filter: doc(st, "q"), Hint: hint(st), Multi: multi, Upsert: up})
		}
		return out
	}
	return nil
}

// predicates are a filter's top-level conditions by kind: equality (a value, $eq, $in, null), range ($gt,
// $gte, $lt, $lte) and negation ($ne, $nin, $exists false, $not), and the branches of a top-level $or.
type predicates struct {
	eq, rng, neg map[string]bool
	exact        map[string]bool // the equalities that name one value (not $in)
	or           []predicates
}

func predicatesOf(filter bson.Raw) predicates {
	p := predicates{eq: map[string]bool{}, exact: map[string]bool{}, rng: map[string]bool{}, neg: map[string]bool{}}
	elems, _ := filter.Elements()
	for _, e := range elems {
		k, v := e.Key(), e.Value()
		switch k {
		case "$and":
			arr, _ := v.ArrayOK()
			vals, _ := arr.Values()
			for _, x := range vals {
				d, _ := x.DocumentOK()
				sub := predicatesOf(d)
				p.merge(sub)
				p.or = append(p.or, sub.or...)
			}
			continue
		case "$or":
			arr, _ := v.ArrayOK()
			vals, _ := arr.Values()
			for _, x := range vals {
				d, _ := x.DocumentOK()
				p.or = append(p.or, predicatesOf(d))
			}
			continue
		}
		d, isDoc := v.DocumentOK()
		first := ""
		if isDoc {
			if ops, _ := d.Elements(); len(ops) > 0 {
				first = ops[0].Key()
			}
		}
		switch {
		case !strings.HasPrefix(first, "$"), first == "$eq":
			p.eq[k], p.exact[k] = true, true
		case first == "$in":
			p.eq[k] = true
		case first == "$gt", first == "$gte", first == "$lt", first == "$lte":
			p.rng[k] = true
		default:
			p.neg[k] = true
		}
	}
	return p
}

func (p *predicates) merge(q predicates) {
	for k := range q.eq {
		p.eq[k] = true
	}
	for k := range q.exact {
		p.exact[k] = true
	}
	for k := range q.rng {
		p.rng[k] = true
	}
	for k := range q.neg {
		p.neg[k] = true
	}
}

// shape names a query's kind as "<collection> <command> eq=… range=… not=… sort=…", fields sorted, the form
// the exceptions list.
func (q sentQuery) shape(p predicates) string {
	keys := func(m map[string]bool) string {
		ks := make([]string, 0, len(m))
		for k := range m {
			ks = append(ks, k)
		}
		slices.Sort(ks)
		return strings.Join(ks, ",")
	}
	var sort []string
	elems, _ := q.Sort.Elements()
	for _, e := range elems {
		sort = append(sort, e.Key())
	}
	return fmt.Sprintf("%s %s eq=%s range=%s not=%s sort=%s", q.Coll, q.Cmd, keys(p.eq), keys(p.rng), keys(p.neg), strings.Join(sort, ","))
}

// servedBy reports whether index keys serve the conditions p with sort: its leading keys are equality
// fields of p (any number, in any order), followed by the sort's fields that are not equality fields, in
// order and all in the index's direction or all reversed; without a sort, the index's first key after that
// prefix may be a range or negation field instead, and at least one of its keys must be used.
func servedBy(keys bson.D, p predicates, sort bson.Raw) bool {
	i := 0
	for i < len(keys) && p.eq[keys[i].Key] {
		i++
	}
	elems, _ := sort.Elements()
	var rest []bson.RawElement
	for _, e := range elems {
		if !p.eq[e.Key()] {
			rest = append(rest, e)
		}
	}
	if len(rest) > 0 {
		if i == 0 && len(p.eq) > 0 {
			return false // an index scan of every value for the sort, filtering the equalities: a full scan
		}
		if i+len(rest) > len(keys) {
			return false
		}
		flip := 0
		for j, e := range rest {
			k := keys[i+j]
			dir, _ := e.Value().AsInt64OK()
			if k.Key != e.Key() {
				return false
			}
			same := toInt(k.Value) == dir
			switch {
			case flip == 0 && same:
				flip = 1
			case flip == 0:
				flip = -1
			case (flip == 1) != same:
				return false
			}
		}
		return true
	}
	if i > 0 {
		return true
	}
	return len(keys) > 0 && (p.rng[keys[0].Key] || p.neg[keys[0].Key])
}

// servedIn reports which index of the collection coll (indexSpecs, and _id) serves p with sort: the hinted
// one when hint is given, else any; "" when none does.
func servedIn(coll string, p predicates, sort bson.Raw, hint string) string {
	specs := append([]indexSpec{{coll: coll, name: "_id_", keys: bson.D{{Key: "_id", Value: 1}}}}, indexSpecs...)
	for _, spec := range specs {
		if spec.coll != coll || hint != "" && spec.name != hint {
			continue
		}
		if servedBy(spec.keys, p, sort) {
			return spec.name
		}
	}
	return ""
}

// unindexedByDesign are the hot query shapes that no index serves, by shape (sentQuery.shape), with why
// that is accepted. A shape not served and not listed fails TestHotQueriesUseAnIndex.
var unindexedByDesign = map[string]string{
	// GET /v1/deliveries filtered by status or topic alone: a page (limit ≤ 500) read newest first through
	// pulse_deliveries_created, the filter applied on the way; a rare status or topic reads further. Another
	// index per filter would cost every delivery's writes for a console read.
	"deliveries find eq=status range= not= sort=createdAt,_id": "list by status: pulse_deliveries_created, filtered",
	"deliveries find eq=topic range= not= sort=createdAt,_id":  "list by topic: pulse_deliveries_created, filtered",
	// The one-time queue migration: the marked events (unfinished fan-outs, few) are found through
	// pulse_events_fanout and sorted by createdAt and _id in memory, so that a stopped migration resumes
	// after the last one it put in the outbox.
	"events find eq=fanout range= not= sort=fanout,createdAt,_id": "queue migration: few marked events, sorted in memory",
	// GET /v1/activity: every group's attempts ended in the hour, read through pulse_history_group_status_ended
	// by its hint, with no equality on its leading consumerGroup: the server seeks the status and endedAt
	// bounds within each group's keys, so it reads the hour's keys plus a few seeks per group, never older
	// history (an index on status and endedAt alone would cost every attempt's writes for a console read).
	"history find eq=status range=endedAt not= sort=endedAt": "activity of every group: pulse_history_group_status_ended, seeked per group",
	// subscriptions holds one small document per consumer group: reading all of it (ListEndpoints,
	// EndpointStates, the pending counts' groups) or finding the backfill to run among them needs no index.
	"subscriptions find eq= range= not= sort=":                                             "all consumer groups: one document each",
	"subscriptions findAndModify eq=backfill.lockedUntil range= not=backfill sort= $or[0]": "backfill lease: among the consumer groups",
	"subscriptions findAndModify eq= range=backfill.lockedUntil not=backfill sort= $or[1]": "backfill lease: among the consumer groups",
}

// TestHotQueriesUseAnIndex (in TestStoreInternals) runs every path of the store (hotPathWorkload) with a
// command monitor, and checks each query it sends (filter, sort, hint) against the indexes EnsureSchema
// creates: an index whose leading keys are the query's equality fields, then its sort (or, without a sort,
// a range), or a shape listed in unindexedByDesign with its reason. No query may leave consumer groups out
// with a negation ($nin, $ne): it names the groups it wants. The embedded database scans for most
// filters, so explain cannot show this there; the rule is checked on the shapes themselves.
func testHotQueriesUseAnIndex(t *testing.T, e *env) {
	b := e.setup(t)
	capture := &queryCapture{prefix: testPrefix + "."}
	s := hotPathStore(t, b, capture.monitor())
	hotPathWorkload(t, b, s)
	queries := capture.queries()
	shapes := map[string]string{} // shape: the index serving it, or "" when none does
	for _, q := range queries {
		p := predicatesOf(q.Filter)
		if p.neg["consumerGroup"] {
			// An index range cannot skip what a negation leaves out: the server walks the keys of the groups
			// left out (ordered, paused, saturated: maybe most of the due work) before it finds the others.
			t.Errorf("%s: the filter %s leaves consumer groups out with a negation; name the groups wanted ($in)", q.shape(p), q.Filter)
		}
		if len(p.or) > 0 {
			for i, branch := range p.or {
				branch.merge(predicates{eq: p.eq, exact: p.exact, rng: p.rng, neg: p.neg})
				shape := fmt.Sprintf("%s $or[%d]", q.shape(branch), i)
				shapes[shape] = servedIn(q.Coll, branch, q.Sort, q.Hint)
			}
			continue
		}
		shapes[q.shape(p)] = servedIn(q.Coll, p, q.Sort, q.Hint)
	}
	names := slices.Sorted(func(yield func(string) bool) {
		for k := range shapes {
			if !yield(k) {
				return
			}
		}
	})
	served := 0
	for _, shape := range names {
		index := shapes[shape]
		_, excepted := unindexedByDesign[shape]
		switch {
		case index != "" && excepted:
			t.Errorf("%q is served by %s but listed in unindexedByDesign: remove it there", shape, index)
		case index != "":
			served++
			t.Logf("%s: %s", shape, index)
		case !excepted:
			t.Errorf("hot query %q is served by no index of indexSpecs and not listed in unindexedByDesign", shape)
		}
	}
	for shape := range unindexedByDesign {
		if _, seen := shapes[shape]; !seen {
			t.Errorf("unindexedByDesign lists %q, which the workload never sent", shape)
		}
	}
	t.Logf("%d query shapes: %d served by an index, %d accepted without", len(shapes), served, len(shapes)-served)
	if served == 0 {
		t.Fatal("the workload sent no query")
	}
}

// hotPathStore returns a store on a client of its own with monitor, its schema ensured, with the
// capabilities detected on the server but the queries of MongoDB (ScansFilters false), so that the query
// shapes are the ones a MongoDB receives.
func hotPathStore(t *testing.T, b *bundle, monitor *mevent.CommandMonitor) *Store {
	t.Helper()
	caps, err := New(b.client, b.options(nil)).DetectCapabilities(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	caps.ScansFilters = false
	return b.store(b.srv.Connect(options.Client().SetMonitor(monitor)), func(o *Options) {
		o.Capabilities = &caps
		o.HistoryRetention = 48 * time.Hour
		o.EventRetention = 48 * time.Hour
	})
}

// hotPathWorkload runs every path of the store once or more: registration and its changes, publish (one and
// many), fan-out, claims (of given attempts, by batch, one, the heads of an ordered group's lines), renewal, release, results and
// follow-ups, reaping, the repair scans, backfill, reads of the API (events, deliveries, lists, stats,
// pending counts), cancel, retry, replay, endpoint states and health, secret rotation, the sweep, ending a
// group's work on a PUT that drops a topic and on delete.
func hotPathWorkload(t *testing.T, b *bundle, s *Store) {
	t.Helper()
	ctx := b.ctx
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	b.putEndpoint(s, "g", "t", "u")
	ordered := b.endpoint("o", "t")
	ordered.Ordered = true
	_, _, err := s.PutEndpoint(ctx, ordered)
	must("PutEndpoint ordered", err)
	earliest := b.endpoint("e", "t")
	earliest.OffsetReset = pulsetype.OffsetEarliest
	_, _, err = s.PutEndpoint(ctx, earliest)
	must("PutEndpoint earliest", err)
	_, err = s.Publish(ctx, []*pulsetype.Event{storetest.Event("ev-1", "t", "1")})
	must("Publish one", err)
	keyed := storetest.Event("ev-k", "t", "k")
	keyed.OrderingKey = "k"
	evs := []*pulsetype.Event{storetest.Event("ev-2", "t", "2"), storetest.Event("ev-3", "t", "3"), keyed, storetest.Event("ev-u", "u", "u")}
	_, err = s.Publish(ctx, evs)
	must("Publish many", err)
	first, err := s.FanOut(ctx, append(evs, storetest.Event("ev-1", "t", "1")))
	must("FanOut", err)
	var mine []*pulsetype.Attempt
	for _, a := range first {
		if a.ConsumerGroup == "g" {
			mine = append(mine, a)
		}
	}
	leased, err := s.ClaimAttempts(ctx, "w", mine[:2])
	if err != nil || len(leased) != 2 {
		t.Fatalf("ClaimAttempts = %v, %v", leased, err)
	}
	_, err = s.Renew(ctx, []pulsetype.LeaseKey{leased[0].Key(), leased[1].Key()})
	must("Renew", err)
	must("ReleaseAttempt", s.ReleaseAttempt(ctx, leased[1]))
	res := pulsetype.AttemptResult{Status: pulsetype.StatusError, HTTPStatus: 500, Duration: time.Millisecond,
		Error: &pulsetype.ErrorInfo{Code: pulsetype.CodeHandlerError, Message: "HTTP 500"}}
	cs := []pulsetype.Completion{{Attempt: leased[0], Result: res, Next: pulsetype.NextStep{Retry: true, Delay: time.Second}}}
	_, err = s.FinishAttempts(ctx, cs)
	must("FinishAttempts", err)
	must("FollowUps", s.FollowUps(ctx, cs))
	one, err := s.Claim(ctx, "w", []string{"g", "e"})
	must("Claim", err)
	if one != nil {
		must("FinishAttempt", s.FinishAttempt(ctx, one, pulsetype.AttemptResult{Status: pulsetype.StatusSuccess, HTTPStatus: 200, Duration: time.Millisecond}))
		_, err = s.EndDelivery(ctx, pulsetype.EndDeliveryParams{DeliveryID: one.DeliveryID, Status: pulsetype.StatusSuccess, FinalAttempt: one.Number})
		must("EndDelivery", err)
	}
	b.clock.Advance(time.Minute)
	_, err = s.ClaimBatch(ctx, "w", []string{"g", "e"}, 4)
	must("ClaimBatch", err)
	_, err = s.DueAttempts(ctx, nil, 64)
	must("DueAttempts of every group", err)
	_, err = s.ClaimHeads(ctx, pulsetype.ClaimHeadsParams{Owner: "w", ConsumerGroup: "o", Topic: "t", Limit: 8})
	must("ClaimHeads", err)
	_, err = s.ClaimHeads(ctx, pulsetype.ClaimHeadsParams{Owner: "w", ConsumerGroup: "o", Topic: "t", Limit: 8, After: new("a")})
	must("ClaimHeads after a key", err)
	b.clock.Advance(time.Hour)
	_, err = s.ReapOne(ctx)
	must("ReapOne", err)
	must("ClearFanOut", s.ClearFanOut(ctx, []string{"ev-1", "ev-2"}))
	_, err = s.FanOutStale(ctx, time.Second, 10)
	must("FanOutStale", err)
	_, err = s.Backfill(ctx, "w", 10)
	must("Backfill", err)
	page, err := s.QueuedDeliveries(ctx, "", 10)
	must("QueuedDeliveries", err)
	must("RepairQueue", s.RepairQueue(ctx, page.Repairs))
	ids := make([]string, len(page.Deliveries))
	for i, d := range page.Deliveries {
		ids[i] = d.ID
	}
	_, err = s.AttemptsOf(ctx, ids)
	must("AttemptsOf", err)
	if len(ids) > 0 {
		_, err = s.CreateAttempt(ctx, page.Deliveries[0].Ref(), 9, time.Second)
		must("CreateAttempt", err)
	}

	// The API's reads and operations.
	_, err = s.GetEvent(ctx, "ev-1")
	must("GetEvent", err)
	_, err = s.GetEvents(ctx, []string{"ev-1", "ev-3"})
	must("GetEvents", err)
	_, err = s.DeliveriesOfEvent(ctx, "ev-2")
	must("DeliveriesOfEvent", err)
	gd := DeliveryID("g", "ev-3")
	_, _, err = s.GetDelivery(ctx, gd)
	must("GetDelivery", err)
	for _, f := range []pulsetype.DeliveryFilter{{Limit: 10}, {ConsumerGroup: "g", Limit: 10}, {ConsumerGroup: "g", Status: pulsetype.StatusPending, Limit: 10},
		{Topic: "t", Limit: 10}, {ConsumerGroup: "g", Topic: "t", Limit: 10}, {Status: pulsetype.StatusPending, Limit: 10}} {
		_, next, err := s.ListDeliveries(ctx, f)
		must("ListDeliveries", err)
		if next != "" {
			f.After = next
			_, _, err = s.ListDeliveries(ctx, f)
			must("ListDeliveries after", err)
		}
	}
	_, err = s.Stats(ctx, []string{"g", "o"})
	must("Stats", err)
	_, err = s.Activity(ctx, "g")
	must("Activity", err)
	_, err = s.ActivityAll(ctx)
	must("ActivityAll", err)
	_, err = s.LineHead(ctx, pulsetype.Line{ConsumerGroup: "o", Topic: "t"})
	must("LineHead", err)
	_, err = s.PendingByGroup(ctx)
	must("PendingByGroup", err)
	_, err = s.OldestPending(ctx)
	must("OldestPending", err)
	waiting, _, err := s.ListDeliveries(ctx, pulsetype.DeliveryFilter{ConsumerGroup: "g", Status: pulsetype.StatusPending, Limit: 10})
	must("ListDeliveries of g's pending", err)
	gd = ""
	for _, d := range waiting { // one without a POST in flight, so that its retry follows at once
		res, err := s.CancelDelivery(ctx, d.ID)
		must("CancelDelivery", err)
		if !res.InFlight {
			gd = d.ID
			break
		}
	}
	if gd == "" {
		t.Fatalf("every pending delivery of g (%d) has a POST in flight: nothing to retry", len(waiting))
	}
	_, err = s.RetryDelivery(ctx, gd)
	must("RetryDelivery", err)
	_, err = s.ReplayDeliveries(ctx, pulsetype.ReplayParams{ConsumerGroup: "g", Status: pulsetype.StatusCancelled,
		From: b.clock.Now().Add(-24 * time.Hour), To: b.clock.Now().Add(time.Hour)})
	must("ReplayDeliveries", err)
	_, err = s.ListEndpoints(ctx)
	must("ListEndpoints", err)
	_, err = s.GetEndpoint(ctx, "g")
	must("GetEndpoint", err)
	_, err = s.SetEndpointState(ctx, "e", pulsetype.EndpointPaused)
	must("SetEndpointState", err)
	_, err = s.InactiveGroups(ctx, []string{"e", "g"})
	must("InactiveGroups", err)
	_, err = s.EndpointStates(ctx)
	must("EndpointStates", err)
	_, err = s.RecordHealth(ctx, map[string]time.Duration{"g": time.Second}, []string{"o"})
	must("RecordHealth", err)
	_, err = s.DisableEndpoint(ctx, "o", pulsetype.ReasonGone, time.Time{})
	must("DisableEndpoint", err)
	_, err = s.RotateSecret(ctx, "g", "0123456789abcdef0123456789abcdef", time.Minute)
	must("RotateSecret", err)
	_, err = s.CheckSecrets(ctx)
	must("CheckSecrets", err)
	_, err = s.ServerTime(ctx)
	must("ServerTime", err)
	_, err = s.Sweep(ctx)
	must("Sweep", err)

	// Ending a group's work: a PUT that drops a topic, a delete.
	_, _, err = s.PutEndpoint(ctx, b.endpoint("g", "t"))
	must("PutEndpoint dropping a topic", err)
	_, err = s.DeleteEndpoint(ctx, "g")
	must("DeleteEndpoint", err)
}
