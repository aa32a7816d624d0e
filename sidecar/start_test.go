package sidecar

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/pulse-sidecar/pulse/internal/devdb"
	"github.com/pulse-sidecar/pulse/internal/testdb"
	"github.com/pulse-sidecar/pulse/internal/testwait"
)

// A schema phase longer than the start's bound does not fail the start: while the test database's proxy
// holds createIndexes (as a server building a large index does) for twice the bound, /healthz answers 200
// and /readyz 503 saying the start is building indexes; once the builds end, the rest of the start gets its
// whole bound, Start returns nil and /readyz answers 200.
func TestStartOutlivesItsIndexBuilds(t *testing.T) {
	if !testdb.Embedded() {
		t.Skip("holding createIndexes needs the embedded test database's proxy (devdb.HoldCommand)")
	}
	t.Parallel()
	client, dbName := testdb.Database(t)
	hold := func(name string) int32 {
		t.Helper()
		var answer struct{ Waiting int32 }
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // also in cleanup, after t.Context ended
		defer cancel()
		if err := client.Database(dbName).RunCommand(ctx, bson.D{{Key: devdb.HoldCommand, Value: name}}).Decode(&answer); err != nil {
			t.Fatalf("%s %q: %v", devdb.HoldCommand, name, err)
		}
		return answer.Waiting
	}
	hold("createIndexes")

	const bound = 2 * time.Second // the start's bound after the schema work (30 s in production)
	cfg := load(t, map[string]string{"PULSE_MONGODB_URI": testdb.URI(t), "PULSE_DATABASE": dbName,
		"PULSE_LISTEN": "127.0.0.1:0", "PULSE_PROBE_LISTEN": "127.0.0.1:0"})
	var logs testdb.SyncBuffer
	s := New(cfg, Options{Logs: &logs, TestHooks: TestHooks{StartTimeout: bound}})
	startErr := make(chan error, 1)
	go func() { startErr <- s.Start(t.Context()) }()
	// Cleanups run last first: the builds are released (Start returns) before Stop waits for Start.
	t.Cleanup(s.Stop)
	t.Cleanup(func() { hold("") })

	// The start logs its addresses before it connects; its probes answer from then on.
	var probe string
	testwait.Eventually(t, time.Minute, "the start logs its probe address", func() bool {
		sc := bufio.NewScanner(strings.NewReader(logs.String()))
		for sc.Scan() {
			var line struct {
				ProbeAddr string `json:"probe_addr"`
			}
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.ProbeAddr != "" {
				probe = "http://" + line.ProbeAddr
				return true
			}
		}
		return false
	})
	testwait.Eventually(t, time.Minute, "the proxy holds a createIndexes", func() bool { return hold("createIndexes") > 0 })
	probes := func() {
		t.Helper()
		if code, body := get(t, probe+"/healthz"); code != http.StatusOK {
			t.Fatalf("GET /healthz during the index builds answered %d %s, want 200", code, body)
		}
		if code, body := get(t, probe+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "building indexes") {
			t.Fatalf("GET /readyz during the index builds answered %d %s, want 503 saying building indexes", code, body)
		}
	}
	probes()
	// Hold the builds for longer than the start's bound.
	select {
	case err := <-startErr:
		t.Fatalf("Start returned %v while createIndexes was held", err)
	case <-time.After(2 * bound):
	}
	probes()
	hold("")
	select {
	case err := <-startErr:
		if err != nil {
			t.Fatalf("Start after index builds longer than its bound = %v, want nil", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("Start did not return within 2 minutes of the index builds' end")
	}
	if code, body := get(t, probe+"/readyz"); code != http.StatusOK {
		t.Fatalf("GET /readyz after Start answered %d %s, want 200", code, body)
	}
}

// get answers GET url's status code and body.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
