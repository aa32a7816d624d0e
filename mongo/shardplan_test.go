package mongo

import (
	"fmt"
	"maps"
	"slices"
	"testing"
)

// shardPlan is the sharding plan of docs/mongodb-production.md ("Sharding"): the shard key of each sharded
// collection (subscriptions stays unsharded: one small document per consumer group).
var shardPlan = map[string][]string{
	"events":     {"_id"},                      // hashed: UUIDv7 ids are monotonic
	"deliveries": {"consumerGroup", "eventId"}, // ranged, the unique index pulse_deliveries_group_event_unique
	"history":    {"deliveryId", "attempt"},    // ranged, the unique index pulse_history_delivery_attempt_unique
}

// scatterPlan lists the hot query shapes (sentQuery.shape) the plan accepts as scatter-gather: reads and
// multi-document writes whose filter lacks the shard key's first field; docs/mongodb-production.md
// ("Sharding") says why for each kind. Filled from what the workload sends.
var scatterPlan = map[string]string{
	// By _id where the shard key is not _id: deliveries and attempts are read and ended by the ids the queue
	// holds; each such command names at most a page of ids (or one) and reaches every shard once.
	"deliveries find eq=_id range= not= sort=":                            "deliveries by id: of queued work, of a line, of earlier events",
	"deliveries update eq=_id,status range= not= sort=":                   "ending deliveries by id (one, or a page by $in)",
	"history find eq=_id range= not= sort=":                               "attempts by id: read back after claims, results, the repair scan",
	"history update eq=_id,lockToken,status range= not= sort=":            "fenced results and renewals by id and token",
	"history update eq=_id,lockToken,status range=lockedUntil not= sort=": "fenced lease writes by id and token",
	"history update eq=_id,lockedUntil,status range= not= sort=":          "claims by id (no lease yet) and ending waiting attempts",
	// Pollers and repairs: one per replica per poll, repair or sweep interval, bounded by an index.
	"deliveries find eq=status range=_id not= sort=status,_id":    "repair walk of pending deliveries (pulse_deliveries_status_id)",
	"deliveries delete eq= range=expiresAt not= sort=":            "the sweep of expired deliveries (servers without TTL indexes)",
	"history delete eq= range=expiresAt not= sort=":               "the sweep of expired attempts (servers without TTL indexes)",
	"events delete eq= range= not= sort=":                         "the sweep of expired and staged events ($or: expiresAt, staged)",
	"events find eq=topic range=_id not=staged sort=_id":          "backfill walk by topic from a cursor (_id range on a hashed key)",
	"events find eq=staged range=createdAt not=batch sort=":       "the sweep's read of the staged events of arrays, to roll partly committed ones forward (pulse_events_staged)",
	"events find eq=fanout range= not= sort=fanout,createdAt,_id": "the one-time queue migration: events marked for fan-out",
	// The API's reads across groups, and GET /v1/stats's attempt figures (history is keyed by delivery).
	"deliveries find eq= range= not= sort=createdAt,_id":                                                   "GET /v1/deliveries newest first, every group",
	"deliveries find eq=status range= not= sort=createdAt,_id":                                             "GET /v1/deliveries?status=",
	"deliveries find eq=topic range= not= sort=createdAt,_id":                                              "GET /v1/deliveries?topic=",
	"deliveries find eq=eventId range= not= sort=consumerGroup":                                            "GET /v1/events/{id}: the deliveries of one event, one per group",
	"history aggregate eq=consumerGroup,status range=endedAt not= sort=":                                   "GET /v1/stats: a group's attempts ended in the window",
	"history aggregate eq=consumerGroup,status range=endedAt not=error.code sort=":                         "GET /v1/stats: the same, by error code",
	"history find eq=consumerGroup,status range=endedAt,httpStatus not=durationMs,error.code sort=endedAt": "GET /v1/stats: latencies of the window",
	"history find eq=consumerGroup,status range=endedAt not= sort=endedAt":                                 "GET /v1/endpoints/{group}/activity: the hour's attempts",
	"history find eq=status range=endedAt not= sort=endedAt":                                               "GET /v1/activity: every group's attempts of the hour",
}

// shardRule checks one query against the shard key of its collection by MongoDB's rules per command
// (manual: "Sharded Collections" of findAndModify, updateOne, deleteOne; the update command's upsert):
// findAndModify and any upsert need an equality on the full shard key (before 7.1 for findAndModify, always
// for an upsert); an update or delete of one document needs the full shard key or an equality on _id
// before 7.1; every other query is targeted when it names the key's first field by equality ($in
// included) or, for a ranged key, by range, and is scatter-gather otherwise. It returns "" when the query
// is legal on 6.0 and 7.0 and targeted, "scatter" when legal but sent to every shard, or the rule broken.
func shardRule(q sentQuery, key []string, hashed bool, p predicates) string {
	full := true
	for _, k := range key {
		full = full && p.exact[k]
	}
	switch {
	case q.Upsert && !full:
		return fmt.Sprintf("an upsert needs an equality on the full shard key %v", key)
	case q.Cmd == "findAndModify" && !full:
		return fmt.Sprintf("findAndModify needs an equality on the full shard key %v before MongoDB 7.1", key)
	case (q.Cmd == "update" || q.Cmd == "delete") && !q.Multi && !full && !p.exact["_id"]:
		return fmt.Sprintf("a single-document %s needs the full shard key %v or an _id equality before MongoDB 7.1", q.Cmd, key)
	}
	if p.eq[key[0]] || !hashed && p.rng[key[0]] {
		return ""
	}
	return "scatter"
}

// Every query of every store path (hotPathWorkload), captured at the driver, is checked against the plan's
// shard keys by the rules of its command kind (shardRule): legal on MongoDB 6.0 and 7.0, and targeted or
// listed in scatterPlan; each shard key is a prefix of every unique index of its collection (a MongoDB rule
// for sharded collections). A new query that is neither fails here until the plan and
// docs/mongodb-production.md classify it.
func testShardPlanCoversHotQueries(t *testing.T, e *env) {
	b := e.setup(t)
	capture := &queryCapture{prefix: testPrefix + "."}
	s := hotPathStore(t, b, capture.monitor())
	hotPathWorkload(t, b, s)

	kinds := map[string]map[string]string{} // command kind: shape: the rule's verdict
	for _, q := range capture.queries() {
		key, sharded := shardPlan[q.Coll]
		if !sharded {
			continue
		}
		kind := q.Cmd
		switch {
		case q.Upsert:
			kind = "upsert"
		case (q.Cmd == "update" || q.Cmd == "delete") && q.Multi:
			kind += " many"
		case q.Cmd == "update" || q.Cmd == "delete":
			kind += " one"
		}
		if kinds[kind] == nil {
			kinds[kind] = map[string]string{}
		}
		p := predicatesOf(q.Filter)
		branches := []predicates{p}
		if len(p.or) > 0 { // targeted only when every branch is
			branches = p.or
		}
		verdict := ""
		for _, br := range branches {
			br.merge(predicates{eq: p.eq, exact: p.exact, rng: p.rng, neg: p.neg})
			if v := shardRule(q, key, q.Coll == "events", br); v != "" && verdict == "" || v != "" && v != "scatter" {
				verdict = v
			}
		}
		kinds[kind][q.shape(p)] = verdict
	}
	targeted, scattered := 0, 0
	for _, kind := range slices.Sorted(maps.Keys(kinds)) {
		shapes := kinds[kind]
		t.Run(kind, func(t *testing.T) {
			for _, shape := range slices.Sorted(maps.Keys(shapes)) {
				switch v := shapes[shape]; {
				case v == "":
					targeted++
				case v == "scatter" && scatterPlan[shape] != "":
					scattered++
				case v == "scatter":
					t.Errorf("hot query %q is neither targeted by its collection's shard key nor listed as scatter in the plan", shape)
				default:
					t.Errorf("hot query %q breaks a rule of sharded collections: %s", shape, v)
				}
			}
		})
	}
	for shape := range scatterPlan {
		found := false
		for _, shapes := range kinds {
			_, seen := shapes[shape]
			found = found || seen
		}
		if !found {
			t.Errorf("scatterPlan lists %q, which the workload never sent", shape)
		}
	}
	t.Logf("%d hot query shapes on sharded collections: %d targeted, %d scatter-gather", targeted+scattered, targeted, scattered)
	if targeted == 0 {
		t.Fatal("the workload did not reach the store's queries")
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
