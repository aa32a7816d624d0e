package mongo

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

func TestDatabaseName(t *testing.T) {
	t.Parallel()
	for uri, want := range map[string]string{
		"mongodb://127.0.0.1:27017/orders?replicaSet=rs0": "orders",
		"mongodb://127.0.0.1:27017/":                      "",
		"mongodb://127.0.0.1:27017":                       "",
	} {
		if got, err := DatabaseName(uri); err != nil || got != want {
			t.Errorf("DatabaseName(%q) = %q, %v; want %q", uri, got, err, want)
		}
	}
	if _, err := DatabaseName("http://127.0.0.1/"); err == nil {
		t.Error("DatabaseName of a URI that is not a connection string returned no error")
	}
	if _, err := Connect("http://127.0.0.1/", ConnectOptions{}); err == nil {
		t.Error("Connect to a URI that is not a connection string returned no error")
	}
}

// A connected Store reads the server's clock with hello, through the monitor the client was given.
func testServerTime(t *testing.T, e *env) {
	b := e.setup(t)
	var log commandLog
	client, err := Connect(b.srv.URI, ConnectOptions{ServerSelectionTimeout: 30 * time.Second, Monitor: log.monitor()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Disconnect(context.Background()) })
	s := New(client, Options{Database: "unused"})
	got, err := s.ServerTime(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// The test database runs on this machine: its clock is this one's.
	if d := time.Since(got); d < -time.Minute || d > time.Minute {
		t.Fatalf("server time %s is %s away from the local clock", got, d)
	}
	if commands := log.sent(); len(commands) != 1 || commands[0] != "hello" {
		t.Fatalf("commands = %q, want one hello", commands)
	}
}

// With no server listening, a command fails as unavailable after the server selection timeout, not the
// driver's 30 s.
func TestServerSelectionTimeout(t *testing.T) {
	t.Parallel()
	client, err := Connect("mongodb://127.0.0.1:1/?connectTimeoutMS=100", ConnectOptions{ServerSelectionTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Disconnect(context.Background()) })
	start := time.Now()
	_, err = New(client, Options{Database: "unused"}).ServerTime(context.Background())
	if !errors.Is(err, pulsetype.ErrUnavailable) {
		t.Fatalf("ServerTime = %v, want ErrUnavailable", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("ServerTime failed after %s, want about the 200ms server selection timeout", d)
	}
}

// With no server listening, concurrent publishes of one event each share group commit rounds, and each
// fails as unavailable within the server selection timeout plus half of it, as a lone command does: the
// publishes queued behind a round that found no server answer with it rather than waiting the timeout
// again in a round of their own.
func TestConcurrentPublishesFailWithinServerSelectionTimeout(t *testing.T) {
	t.Parallel()
	const timeout = 2 * time.Second // long enough that a busy machine's delays stay far below half of it
	client, err := Connect("mongodb://127.0.0.1:1/?connectTimeoutMS=100", ConnectOptions{ServerSelectionTimeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Disconnect(context.Background()) })
	s := New(client, Options{Database: "unused"})
	const publishes = 16
	took := make(chan time.Duration, publishes)
	errs := make(chan error, publishes)
	start := make(chan struct{})
	for i := range publishes {
		go func() {
			<-start
			began := time.Now()
			_, err := s.Publish(context.Background(), []*pulsetype.Event{{ID: fmt.Sprintf("e%d", i), Topic: "t", Data: []byte(`1`)}})
			took <- time.Since(began)
			errs <- err
		}()
	}
	close(start)
	for range publishes {
		d, err := <-took, <-errs
		if !errors.Is(err, pulsetype.ErrUnavailable) {
			t.Errorf("Publish = %v, want ErrUnavailable", err)
		}
		if d > timeout+timeout/2 {
			t.Errorf("a concurrent Publish failed after %s, want within the %s server selection timeout plus half", d, timeout)
		}
	}
}

// A connection string that asks for less than the sidecar's concerns stops Connect with one line naming the
// URI option and why; one that asks for the same (or leaves them alone) connects.
func TestConnectRefusesWeakerConcerns(t *testing.T) {
	t.Parallel()
	const base = "mongodb://127.0.0.1:1/pulse?replicaSet=rs0&"
	for option, why := range map[string]string{
		"w=0":                               "rolled back",
		"w=1":                               "rolled back",
		"w=2":                               "rolled back",
		"w=dc1":                             "tagged",
		"journal=false":                     "journal",
		"j=false":                           "not an option",
		"readPreference=secondaryPreferred": "stale leases",
		"readPreference=secondary":          "stale leases",
		"readPreference=primaryPreferred":   "stale leases",
		"readPreference=nearest":            "stale leases",
		"readConcernLevel=local":            "majority",
		"readPreferenceTags=dc:ny":          "stale leases",
		"maxStalenessSeconds=120":           "stale leases",
		"readConcernLevel=available":        "majority",
	} {
		_, err := Connect(base+option, ConnectOptions{})
		if err == nil {
			t.Errorf("Connect with %s returned no error", option)
			continue
		}
		msg := err.Error()
		if !strings.Contains(msg, "URI option "+option) || !strings.Contains(msg, why) || strings.Contains(msg, "\n") {
			t.Errorf("Connect with %s = %q, want one line naming %q and saying %q", option, msg, "URI option "+option, why)
		}
	}
	for _, option := range []string{"w=majority", "journal=true", "readPreference=primary", "readConcernLevel=majority", "appName=x"} {
		client, err := Connect(base+option, ConnectOptions{})
		if err != nil {
			t.Errorf("Connect with %s = %v, want a client", option, err)
			continue
		}
		_ = client.Disconnect(context.Background())
	}
}
