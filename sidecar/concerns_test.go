package sidecar

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"

	"github.com/pulse-sidecar/pulse/internal/testdb"
	"github.com/pulse-sidecar/pulse/internal/testwait"
)

// writeCommands are the names of the database commands that write.
var writeCommands = []string{"insert", "update", "delete", "findAndModify", "bulkWrite", "create", "createIndexes", "drop", "dropIndexes", "collMod"}

// commandLog keeps a copy of every command a client sends (the driver's command monitor). It is safe for
// concurrent use.
type commandLog struct {
	mu       sync.Mutex
	commands []bson.Raw
}

func (l *commandLog) monitor() *event.CommandMonitor {
	return &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.commands = append(l.commands, slices.Clone(e.Command))
	}}
}

func (l *commandLog) all() []bson.Raw {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.commands)
}

// Every write command of a sidecar's start, registration, publish, fan-out, claim and delivery carries
// writeConcern {w: "majority", j: true}, and every find and aggregate readConcern majority, whatever the URI
// says (it says nothing here), as the driver's command monitor sees them.
func TestEveryWriteIsMajorityJournaled(t *testing.T) {
	t.Parallel()
	_, dbName := testdb.Database(t)
	var posts sync.WaitGroup
	posts.Add(1)
	var once sync.Once
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		once.Do(posts.Done)
	}))
	defer rcv.Close()
	cfg := load(t, map[string]string{"PULSE_MONGODB_URI": testdb.URI(t), "PULSE_DATABASE": dbName, "PULSE_LISTEN": "127.0.0.1:0", "PULSE_POLL_INTERVAL": "100ms"})
	var log commandLog
	s := New(cfg, Options{Monitor: log.monitor()})
	if err := s.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	api := "http://" + s.Addr()
	if code := do(t, "PUT", api+"/v1/endpoints/g", `{"url":"`+rcv.URL+`","topics":["t"]}`, nil); code != http.StatusCreated {
		t.Fatalf("PUT endpoint answered %d", code)
	}
	if code := do(t, "POST", api+"/v1/events", `{"topic":"t","data":1}`, nil); code != http.StatusAccepted {
		t.Fatalf("POST event answered %d", code)
	}
	posts.Wait()
	testwait.Eventually(t, time.Minute, "the delivery ends as success", func() bool {
		var page struct{ Deliveries []json.RawMessage }
		return do(t, "GET", api+"/v1/deliveries?consumerGroup=g&status=success", "", &page) == http.StatusOK && len(page.Deliveries) == 1
	})
	s.Stop()

	seen := map[string]int{}
	for _, cmd := range log.all() {
		name := cmd.Index(0).Key()
		switch {
		case slices.Contains(writeCommands, name):
			seen[name]++
			wc, ok := cmd.Lookup("writeConcern").DocumentOK()
			w, _ := wc.Lookup("w").StringValueOK()
			j, _ := wc.Lookup("j").BooleanOK()
			if !ok || w != "majority" || !j {
				t.Errorf("%s sent writeConcern %v, want {w: \"majority\", j: true}: %s", name, wc, cmd)
			}
		case name == "find" || name == "aggregate" || name == "count" || name == "distinct":
			seen[name]++
			rc, _ := cmd.Lookup("readConcern").DocumentOK()
			if level, _ := rc.Lookup("level").StringValueOK(); level != "majority" {
				t.Errorf("%s sent readConcern %v, want {level: \"majority\"}: %s", name, rc, cmd)
			}
		}
	}
	// The run wrote the way every path writes: each kind of write was seen.
	for _, name := range []string{"insert", "update", "findAndModify", "createIndexes", "find"} {
		if seen[name] == 0 {
			t.Errorf("no %s command was sent (saw %v): the run did not cover that path", name, seen)
		}
	}
}

// do sends method url with body (JSON, or none when empty) and decodes the answer into out when not nil;
// it returns the status code.
func do(t *testing.T, method, url, body string, out any) int {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if out != nil {
		_ = json.NewDecoder(resp.Body).Decode(out)
	}
	return resp.StatusCode
}

// A URI that asks for a weaker write concern stops Start with one line naming PULSE_MONGODB_URI and the option,
// before anything is written.
func TestStartRefusesAURIAskingForW1(t *testing.T) {
	t.Parallel()
	cfg := load(t, map[string]string{"PULSE_MONGODB_URI": "mongodb://127.0.0.1:1/pulse?w=1", "PULSE_LISTEN": "127.0.0.1:0"})
	var logs bytes.Buffer
	err := New(cfg, Options{Logs: &logs}).Start(t.Context())
	if err == nil || !strings.Contains(err.Error(), "PULSE_MONGODB_URI") || !strings.Contains(err.Error(), "URI option w=1") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("Start with w=1 = %v, want one line naming PULSE_MONGODB_URI and w=1", err)
	}
	// The refusal is the process's only line: nothing is bound or logged before it (a "starting" line would
	// announce probes that never answer).
	if logs.Len() != 0 {
		t.Errorf("Start with w=1 logged before it refused:\n%s", logs.String())
	}
}
