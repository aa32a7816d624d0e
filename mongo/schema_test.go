package mongo

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"

	"github.com/rs/zerolog"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/pulse-sidecar/pulse/mongo/storetest"
	"github.com/pulse-sidecar/pulse/pulsetype"
)

// listedIndex is an index as the server lists it, read independently of the code under test.
type listedIndex struct {
	keys   string // "a:1,b:-1"
	unique bool
}

// indexesOf lists the indexes of <prefix>.<suffix> by name.
func (b *bundle) indexesOf(suffix string) map[string]listedIndex {
	b.t.Helper()
	cur, err := b.coll(suffix).Indexes().List(b.ctx)
	if err != nil {
		b.t.Fatalf("list indexes of %s: %v", suffix, err)
	}
	var raw []bson.M
	if err := cur.All(b.ctx, &raw); err != nil {
		b.t.Fatalf("list indexes of %s: %v", suffix, err)
	}
	out := map[string]listedIndex{}
	for _, ix := range raw {
		name, _ := ix["name"].(string)
		var keys bson.D
		switch k := ix["key"].(type) {
		case bson.D:
			keys = k
		case bson.M:
			b.t.Fatalf("index %s: key decoded unordered", name)
		}
		unique, _ := ix["unique"].(bool)
		out[name] = listedIndex{keys: keyString(keys), unique: unique}
	}
	return out
}

// keyString renders index keys as "a:1,b:-1", whatever numeric type the server used.
func keyString(keys bson.D) string {
	parts := make([]string, len(keys))
	for i, e := range keys {
		var v any = e.Value
		switch n := e.Value.(type) {
		case int32:
			v = int64(n)
		case int64:
			v = n
		case float64:
			v = int64(n)
		case int:
			v = int64(n)
		}
		parts[i] = fmt.Sprintf("%s:%v", e.Key, v)
	}
	return strings.Join(parts, ",")
}

// createIndex creates an index on <prefix>.<suffix> directly, as an operator or an older version would have.
func (b *bundle) createIndex(suffix, name string, keys bson.D, unique bool) {
	b.t.Helper()
	opts := options.Index().SetName(name)
	if unique {
		opts.SetUnique(true)
	}
	if _, err := b.coll(suffix).Indexes().CreateOne(b.ctx, mongo.IndexModel{Keys: keys, Options: opts}); err != nil {
		b.t.Fatalf("create index %s: %v", name, err)
	}
}

// assertSchema checks that every index of indexSpecs exists with its keys and uniqueness.
func (b *bundle) assertSchema() {
	b.t.Helper()
	if len(indexSpecs) == 0 {
		b.t.Fatal("indexSpecs is empty")
	}
	listed := map[string]map[string]listedIndex{}
	for _, spec := range indexSpecs {
		if listed[spec.coll] == nil {
			listed[spec.coll] = b.indexesOf(spec.coll)
		}
		got, ok := listed[spec.coll][spec.name]
		if !ok {
			b.t.Errorf("index %s missing on %s.%s", spec.name, testPrefix, spec.coll)
			continue
		}
		if want := keyString(spec.keys); got.keys != want || got.unique != spec.unique {
			b.t.Errorf("index %s = keys %s unique %v, want keys %s unique %v", spec.name, got.keys, got.unique, want, spec.unique)
		}
	}
}

// EnsureSchema detects what the server can do as the suite's probes found it, independently of the store.
func testCapabilitiesMatchTheServer(t *testing.T, e *env) {
	b := e.setup(t)
	caps, err := New(b.client, b.options(nil)).EnsureSchema(b.ctx)
	if err != nil {
		t.Fatalf("EnsureSchema: %v", err)
	}
	if caps.TTLIndexes != e.features.TTLIndexes || caps.ChangeStreams != e.features.ChangeStreams || caps.ScansFilters == e.features.IndexPlans {
		t.Errorf("EnsureSchema detected %+v; the server has TTL indexes: %v, change streams: %v, index plans: %v",
			caps, e.features.TTLIndexes, e.features.ChangeStreams, e.features.IndexPlans)
	}
}

func testEnsureSchemaCreatesEveryIndexAndIsIdempotent(t *testing.T, e *env) {
	b := e.setup(t)
	s := New(b.client, b.options(nil))
	caps, err := s.EnsureSchema(b.ctx)
	if err != nil {
		t.Fatalf("EnsureSchema on an empty database: %v", err)
	}
	b.assertSchema()
	if s.Capabilities() != caps {
		t.Errorf("Capabilities() = %+v, EnsureSchema returned %+v", s.Capabilities(), caps)
	}
	if caps.TTLIndexes != e.features.TTLIndexes || caps.ChangeStreams != e.features.ChangeStreams {
		t.Errorf("capabilities = %+v, want TTL=%v ChangeStreams=%v as the server's probed features", caps, e.features.TTLIndexes, e.features.ChangeStreams)
	}
	before := map[string]int{}
	for _, c := range []string{"events", "subscriptions", "deliveries", "history"} {
		before[c] = len(b.indexesOf(c))
	}

	for i := range 2 {
		again, err := New(b.client, b.options(nil)).EnsureSchema(b.ctx)
		if err != nil {
			t.Fatalf("EnsureSchema run %d on an ensured database: %v", i+2, err)
		}
		if again != caps {
			t.Errorf("EnsureSchema run %d capabilities = %+v, first run %+v", i+2, again, caps)
		}
	}
	b.assertSchema()
	for c, n := range before {
		if got := len(b.indexesOf(c)); got != n {
			t.Errorf("%s has %d indexes after re-running EnsureSchema, had %d", c, got, n)
		}
	}
}

// A database ensured by a version without the indexes added since (here: pulse_events_staged and
// pulse_deliveries_event dropped again) gets them at the next start, its other indexes kept as they are.
func testEnsureSchemaAddsNewIndexes(t *testing.T, e *env) {
	b := e.setup(t)
	b.store(nil, nil)
	for _, ix := range []struct{ suffix, name string }{{"events", "pulse_events_staged"}, {"deliveries", "pulse_deliveries_event"}} {
		if err := b.coll(ix.suffix).Indexes().DropOne(b.ctx, ix.name); err != nil {
			t.Fatalf("drop %s: %v", ix.name, err)
		}
		if _, ok := b.indexesOf(ix.suffix)[ix.name]; ok {
			t.Fatalf("%s still there after its drop", ix.name)
		}
	}
	if _, err := New(b.client, b.options(nil)).EnsureSchema(b.ctx); err != nil {
		t.Fatalf("EnsureSchema on a database without the new indexes: %v", err)
	}
	b.assertSchema()
}

func testEnsureSchemaConcurrentStores(t *testing.T, e *env) {
	b := e.setup(t)
	const n = 4
	stores := make([]*Store, n)
	for i := range stores {
		client := b.client
		if i%2 == 1 {
			client = b.connect()
		}
		stores[i] = New(client, b.options(nil))
	}
	errs := make([]error, n)
	caps := make([]Capabilities, n)
	storetest.Concurrently(n, func(i int) { caps[i], errs[i] = stores[i].EnsureSchema(b.ctx) })
	for i, err := range errs {
		if err != nil {
			t.Errorf("concurrent EnsureSchema #%d: %v", i, err)
		}
		if caps[i] != caps[0] {
			t.Errorf("concurrent EnsureSchema #%d capabilities %+v, #0 %+v", i, caps[i], caps[0])
		}
	}
	b.assertSchema()
}

func testEnsureSchemaRefusesIncompatibleIndex(t *testing.T, e *env) {
	tests := []struct {
		name   string
		suffix string
		index  string
		keys   bson.D
		unique bool
	}{
		{name: "other key order", suffix: "deliveries", index: "pulse_deliveries_group_event_unique",
			keys: bson.D{{Key: "eventId", Value: 1}, {Key: "consumerGroup", Value: 1}}, unique: true},
		{name: "not unique", suffix: "deliveries", index: "pulse_deliveries_group_event_unique",
			keys: bson.D{{Key: "consumerGroup", Value: 1}, {Key: "eventId", Value: 1}}},
		{name: "other direction", suffix: "deliveries", index: "pulse_deliveries_group_event_unique",
			keys: bson.D{{Key: "consumerGroup", Value: 1}, {Key: "eventId", Value: -1}}, unique: true},
		{name: "unique where none is wanted", suffix: "history", index: "pulse_history_lock_token",
			keys: bson.D{{Key: fieldFencingToken, Value: 1}}, unique: true},
		{name: "fewer keys", suffix: "history", index: "pulse_history_acquisition",
			keys: bson.D{{Key: "status", Value: 1}, {Key: fieldLeasedUntil, Value: 1}}},
		// The indexes added for the sweep and the deliveries of an event: one of theirs made by hand with
		// other keys is refused like any other.
		{name: "staged events by other keys", suffix: "events", index: "pulse_events_staged",
			keys: bson.D{{Key: "staged", Value: 1}}},
		{name: "deliveries of an event by fewer keys", suffix: "deliveries", index: "pulse_deliveries_event",
			keys: bson.D{{Key: "eventId", Value: 1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := e.setup(t)
			b.createIndex(tt.suffix, tt.index, tt.keys, tt.unique)
			_, err := New(b.client, b.options(nil)).EnsureSchema(b.ctx)
			var mismatch *IndexMismatchError
			if !errors.As(err, &mismatch) {
				t.Fatalf("EnsureSchema = %v, want an *IndexMismatchError", err)
			}
			if want := testPrefix + "." + tt.suffix; mismatch.Collection != want {
				t.Errorf("Collection = %q, want %q", mismatch.Collection, want)
			}
			if mismatch.Index != tt.index {
				t.Errorf("Index = %q, want %q", mismatch.Index, tt.index)
			}
			if mismatch.Expected == "" || mismatch.Found == "" || mismatch.Expected == mismatch.Found {
				t.Errorf("Expected %q and Found %q should be non-empty and differ", mismatch.Expected, mismatch.Found)
			}
			if msg := err.Error(); !strings.Contains(msg, tt.index) || strings.ContainsAny(msg, "\n") {
				t.Errorf("error %q should name the index on one line", msg)
			}
			got, ok := b.indexesOf(tt.suffix)[tt.index]
			if !ok {
				t.Fatalf("EnsureSchema dropped the incompatible index %s", tt.index)
			}
			if got.keys != keyString(tt.keys) || got.unique != tt.unique {
				t.Errorf("incompatible index changed to keys %s unique %v", got.keys, got.unique)
			}
			// The refusal is stable: a restart refuses again rather than "fixing" the index.
			if _, err := New(b.client, b.options(nil)).EnsureSchema(b.ctx); !errors.As(err, &mismatch) {
				t.Errorf("second EnsureSchema = %v, want an *IndexMismatchError", err)
			}
		})
	}
}

func testEnsureSchemaReportsDuplicatesBlockingUniqueIndex(t *testing.T, e *env) {
	tests := []struct {
		name   string
		suffix string
		index  string
		docs   []any
	}{
		{name: "two deliveries of one event to one group", suffix: "deliveries", index: "pulse_deliveries_group_event_unique",
			docs: []any{
				bson.M{"_id": "d1", "consumerGroup": "billing", "eventId": "evt-1", "status": pulsetype.StatusPending},
				bson.M{"_id": "d2", "consumerGroup": "billing", "eventId": "evt-1", "status": pulsetype.StatusPending},
			}},
		{name: "two documents for one attempt number", suffix: "history", index: "pulse_history_delivery_attempt_unique",
			docs: []any{
				bson.M{"_id": "a1", "deliveryId": "d1", "attempt": 1, "status": pulsetype.StatusPending},
				bson.M{"_id": "a2", "deliveryId": "d1", "attempt": 1, "status": pulsetype.StatusPending},
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := e.setup(t)
			if _, err := b.coll(tt.suffix).InsertMany(b.ctx, tt.docs); err != nil {
				t.Fatalf("insert duplicates: %v", err)
			}
			_, err := New(b.client, b.options(nil)).EnsureSchema(b.ctx)
			var uv *UniqueViolationError
			if !errors.As(err, &uv) {
				t.Fatalf("EnsureSchema = %v, want a *UniqueViolationError", err)
			}
			if want := testPrefix + "." + tt.suffix; uv.Collection != want || uv.Index != tt.index {
				t.Errorf("UniqueViolationError names %q on %q, want %q on %q", uv.Index, uv.Collection, tt.index, want)
			}
			if _, ok := b.indexesOf(tt.suffix)[tt.index]; ok {
				t.Errorf("unique index %s exists although its data has duplicates", tt.index)
			}
			if got := b.count(tt.suffix, bson.M{}); got != int64(len(tt.docs)) {
				t.Errorf("%d documents after EnsureSchema, want the %d inserted (nothing deleted)", got, len(tt.docs))
			}
		})
	}
}

// logLines decodes the JSON lines of a zerolog buffer.
func logLines(t *testing.T, b *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for line := range strings.Lines(b.String()) {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

// With SummarizeIndexBuilds (the embedded database) a fresh schema's builds log at debug and one info line
// sums them up, "built N indexes in X s" with N every index; without it (MongoDB) each build keeps its info
// lines, before and after. A schema with nothing to build logs no summary.
func testIndexBuildsSummarized(t *testing.T, e *env) {
	b := e.setup(t)
	for _, summarize := range []bool{true, false} {
		var buf bytes.Buffer
		prefix := fmt.Sprintf("%s_sum%t", testPrefix, summarize)
		s := New(b.client, b.options(func(o *Options) {
			o.CollectionPrefix, o.SummarizeIndexBuilds = prefix, summarize
			o.Logger = zerolog.New(&buf).Level(zerolog.DebugLevel)
		}))
		if _, err := s.EnsureSchema(b.ctx); err != nil {
			t.Fatalf("EnsureSchema: %v", err)
		}
		levels := map[string]int{}
		var summaries []string
		for _, l := range logLines(t, &buf) {
			msg, _ := l["message"].(string)
			switch {
			case msg == "building index" || msg == "index built":
				levels[l["level"].(string)]++
			case strings.HasPrefix(msg, "built "):
				summaries = append(summaries, l["level"].(string)+" "+msg)
				if l["indexes"] != float64(len(indexSpecs)) {
					t.Errorf("summary line %v: indexes, want %d", l, len(indexSpecs))
				}
			}
		}
		want, wantSummaries := map[string]int{"info": 2 * len(indexSpecs)}, 0
		if summarize {
			want, wantSummaries = map[string]int{"debug": 2 * len(indexSpecs)}, 1
		}
		if !maps.Equal(levels, want) || len(summaries) != wantSummaries ||
			summarize && !strings.HasPrefix(summaries[0], fmt.Sprintf("info built %d indexes in ", len(indexSpecs))) {
			t.Errorf("SummarizeIndexBuilds %t: build lines by level %v (want %v), summaries %q", summarize, levels, want, summaries)
		}
		buf.Reset()
		if _, err := s.EnsureSchema(b.ctx); err != nil {
			t.Fatalf("EnsureSchema again: %v", err)
		}
		for _, l := range logLines(t, &buf) {
			if msg, _ := l["message"].(string); strings.Contains(msg, "index") {
				t.Errorf("SummarizeIndexBuilds %t: a schema with nothing to build logged %v", summarize, l)
			}
		}
	}
}
