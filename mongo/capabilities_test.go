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
	drvevent "go.mongodb.org/mongo-driver/v2/event"
	mongodrv "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// commandLog records the commands a client sends, in order, through the driver's command monitor. It is safe
// for concurrent use.
type commandLog struct {
	mu       sync.Mutex
	names    []string
	commands []bson.Raw // a copy of each command, in the order of names
}

// monitor returns a command monitor that records into l.
func (l *commandLog) monitor() *drvevent.CommandMonitor {
	return &drvevent.CommandMonitor{Started: func(_ context.Context, e *drvevent.CommandStartedEvent) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.names = append(l.names, e.CommandName)
		l.commands = append(l.commands, slices.Clone(e.Command))
	}}
}

// monitoredClient returns a client on the test server whose commands log records, disconnected in cleanup.
func (b *bundle) monitoredClient(log *commandLog) *mongodrv.Client {
	b.t.Helper()
	return b.srv.Connect(options.Client().SetMonitor(log.monitor()))
}

// monitoredStore returns a store, its schema ensured, on a client of its own whose commands the returned log
// records.
func (b *bundle) monitoredStore() (*Store, *commandLog) {
	b.t.Helper()
	log := &commandLog{}
	return b.store(b.monitoredClient(log), nil), log
}

// sent returns the names of the commands recorded so far.
func (l *commandLog) sent() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.names)
}

// named returns the recorded commands called name, in order.
func (l *commandLog) named(name string) []bson.Raw {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []bson.Raw
	for i, n := range l.names {
		if n == name {
			out = append(out, l.commands[i])
		}
	}
	return out
}

// reset forgets what log recorded so far.
func (l *commandLog) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.names, l.commands = nil, nil
}

// DetectCapabilities reports what the server is, as the suite's own probe of the server found it
// (storetest.ProbeFeatures), leaves no scratch collection behind and does not change the store; on a server
// whose explain shows no index scan it bounds update commands to 16 statements and says that filters scan,
// elsewhere neither.
func testDetectCapabilities(t *testing.T, e *env) {
	b := e.setup(t)
	s := New(b.client, b.options(nil))
	caps, err := s.DetectCapabilities(b.ctx)
	if err != nil {
		t.Fatalf("DetectCapabilities: %v", err)
	}
	if want := e.features.TTLIndexes; caps.TTLIndexes != want {
		t.Errorf("TTLIndexes = %v, want %v", caps.TTLIndexes, want)
	}
	if want := e.features.PartialIndexes; caps.PartialIndexes != want {
		t.Errorf("PartialIndexes = %v, want %v", caps.PartialIndexes, want)
	}
	// A server whose explain shows no index scan evaluates filters by reading (ScansFilters), and is the
	// FerretDB v1 whose update commands the store bounds; one that shows index scans is neither.
	// A server that shows index scans is a MongoDB, whose $group has $first (FirstOfGroups); FerretDB v1's
	// has not.
	want := Capabilities{TTLIndexes: e.features.TTLIndexes, PartialIndexes: e.features.PartialIndexes,
		ChangeStreams: e.features.ChangeStreams, ScansFilters: !e.features.IndexPlans, FirstOfGroups: e.features.IndexPlans}
	if want.ScansFilters {
		want.MaxUpdateStatements = ferretDBMaxUpdateStatements
	}
	if caps != want {
		t.Errorf("capabilities = %+v, want %+v (from the server's probed features %+v)", caps, want, e.features)
	}
	if got := s.Capabilities(); got != (Capabilities{}) {
		t.Errorf("Capabilities() after DetectCapabilities = %+v, want the zero value until EnsureSchema", got)
	}
	for _, name := range b.collectionNames() {
		if strings.Contains(name, "schema_probe") {
			t.Errorf("the probe left its scratch collection %s behind", name)
		}
	}
}

// Capabilities given in Options are taken as given: EnsureSchema neither probes (no scratch collection, no
// buildInfo) nor asks, and returns them.
func testGivenCapabilitiesAreNotDetected(t *testing.T, e *env) {
	b := e.setup(t)
	var log commandLog
	given := Capabilities{ChangeStreams: true, PartialIndexes: true, MaxUpdateStatements: 3}
	s := New(b.monitoredClient(&log), b.options(func(o *Options) { o.Capabilities = &given }))
	caps, err := s.EnsureSchema(b.ctx)
	if err != nil || caps != given || s.Capabilities() != given {
		t.Fatalf("EnsureSchema = %+v, %v (Capabilities() %+v); want %+v", caps, err, s.Capabilities(), given)
	}
	sent := log.sent()
	for _, name := range sent {
		if name == "buildInfo" || name == "hello" || name == "drop" {
			t.Errorf("EnsureSchema with given capabilities sent %s (commands: %v)", name, sent)
		}
	}
}

// A store built with MaxUpdateStatements n sends no update command of more than n statements, and splits a
// larger batch into full commands; with 0 it sends each batch whole, beyond FerretDB's 16 (20 statements
// stay below FerretDB's 50 backend connections on PostgreSQL).
func testUpdateCommandsHonourMaxUpdateStatements(t *testing.T, e *env) {
	for _, bound := range []int{4, 0} {
		t.Run(fmt.Sprintf("max=%d", bound), func(t *testing.T) {
			b := e.setup(t)
			var log commandLog
			s := New(b.monitoredClient(&log), b.options(func(o *Options) { o.Capabilities = &Capabilities{MaxUpdateStatements: bound} }))
			if _, err := s.EnsureSchema(b.ctx); err != nil {
				t.Fatalf("EnsureSchema: %v", err)
			}
			b.putEndpoint(s, "billing", "t")
			b.putEndpoint(s, "audit", "t")
			leased, err := s.ClaimAttempts(b.ctx, "worker-a", b.fanOutN(s, 10, "t"))
			if err != nil || len(leased) != 20 {
				t.Fatalf("ClaimAttempts = %d, %v; want 20", len(leased), err)
			}
			cs := make([]pulsetype.Completion, len(leased))
			for i, a := range leased { // distinct outcomes: one end each
				e := &pulsetype.ErrorInfo{Code: pulsetype.CodeHandlerError, Message: fmt.Sprintf("HTTP 410 #%d", i)}
				cs[i] = pulsetype.Completion{Attempt: a,
					Result: pulsetype.AttemptResult{Status: pulsetype.StatusError, HTTPStatus: 410, Terminal: true, Duration: time.Millisecond, Error: e},
					Next:   pulsetype.NextStep{EndStatus: pulsetype.StatusError, EndError: e}}
			}
			log.reset()
			if recorded, err := s.FinishAttempts(b.ctx, cs); err != nil || !slices.Equal(recorded, slices.Repeat([]bool{true}, 20)) {
				t.Fatalf("FinishAttempts = %v, %v", recorded, err)
			}
			if err := s.FollowUps(b.ctx, cs); err != nil {
				t.Fatalf("FollowUps: %v", err)
			}
			var updates []int // statements per update command, in order
			for _, c := range log.named("update") {
				stmts, _ := c.Lookup("updates").Array().Values()
				updates = append(updates, len(stmts))
			}
			// Two bulk updates of 20 statements each: the fenced results, the delivery ends.
			want := []int{20, 20}
			if bound > 0 {
				want = slices.Repeat([]int{bound}, 2*20/bound)
			}
			if fmt.Sprint(updates) != fmt.Sprint(want) {
				t.Errorf("update commands carried %v statements, want %v", updates, want)
			}
		})
	}
}
