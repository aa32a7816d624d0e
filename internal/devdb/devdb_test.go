package devdb_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/pulse-sidecar/pulse/internal/cli"
	"github.com/pulse-sidecar/pulse/internal/devdb"
	"github.com/pulse-sidecar/pulse/internal/testdb"
)

func startServer(t *testing.T, cfg devdb.Config) *devdb.Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	srv, err := devdb.Start(ctx, cfg)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		if err := srv.Stop(); err != nil {
			t.Errorf("Stop in cleanup: %v", err)
		}
	})
	return srv
}

func connect(t *testing.T, uri string) *mongo.Client {
	t.Helper()
	client, err := mongo.Connect(options.Client().ApplyURI(uri).SetServerSelectionTimeout(10 * time.Second))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { _ = client.Disconnect(context.Background()) })
	return client
}

func TestRestartKeepsData(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dir := t.TempDir() + "/nested/data" // Start creates missing directories

	srv := startServer(t, devdb.Config{DataDir: dir})
	if !strings.HasPrefix(srv.URI(), "mongodb://127.0.0.1:") {
		t.Fatalf("URI = %q, want mongodb://127.0.0.1:PORT/", srv.URI())
	}
	client := connect(t, srv.URI())
	coll := client.Database("restart").Collection("docs")
	if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: "a"}, {Key: "n", Value: 42}}); err != nil {
		t.Fatalf("InsertOne: %v", err)
	}
	if err := client.Disconnect(ctx); err != nil {
		t.Fatalf("Disconnect: %v", err)
	}
	if err := srv.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if err := srv.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}

	srv2 := startServer(t, devdb.Config{DataDir: dir})
	client2 := connect(t, srv2.URI())
	var got struct {
		ID string `bson:"_id"`
		N  int    `bson:"n"`
	}
	err := client2.Database("restart").Collection("docs").FindOne(ctx, bson.D{{Key: "_id", Value: "a"}}).Decode(&got)
	if err != nil {
		t.Fatalf("FindOne after restart: %v", err)
	}
	if got.ID != "a" || got.N != 42 {
		t.Fatalf("after restart got %+v, want {a 42}", got)
	}
}

func TestStartRejectsEmptyConfig(t *testing.T) {
	t.Parallel()
	if _, err := devdb.Start(t.Context(), devdb.Config{}); err == nil {
		t.Fatal("Start with neither DataDir nor PostgreSQLURL: want an error")
	}
}

// RunCommand prints the URI and keeps FerretDB's warnings off the console: a session that makes FerretDB
// warn (an existing collection, a TTL index, endSessions) leaves stderr empty and the warnings in the data
// directory's log file.
func TestRunCommand(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	dataDir := t.TempDir()
	var stderr testdb.SyncBuffer

	r, w := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- devdb.RunCommand(ctx, []string{"--listen", "127.0.0.1:0", "--data-dir", dataDir}, w, &stderr)
		_ = w.Close()
	}()

	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(r)
		if sc.Scan() {
			lines <- sc.Text()
		}
		_, _ = io.Copy(io.Discard, r)
		close(lines)
	}()

	var line string
	select {
	case line = <-lines:
	case err := <-done:
		t.Fatalf("RunCommand returned before printing the URI: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("no devdb line within a minute")
	}
	uri, ok := strings.CutPrefix(line, devdb.ReadyPrefix)
	if !ok || !strings.HasPrefix(uri, "mongodb://127.0.0.1:") {
		t.Fatalf("stdout line = %q, want %q followed by the URI", line, devdb.ReadyPrefix)
	}
	client := connect(t, uri)
	if err := client.Ping(ctx, nil); err != nil {
		t.Fatalf("Ping %s: %v", uri, err)
	}
	db := client.Database("console")
	for range 2 {
		_ = db.CreateCollection(ctx, "c") // the second answers "already exists"
	}
	ttl := mongo.IndexModel{Keys: bson.D{{Key: "at", Value: 1}}, Options: options.Index().SetExpireAfterSeconds(60)}
	_, _ = db.Collection("c").Indexes().CreateOne(ctx, ttl) // not implemented by FerretDB
	if err := client.Disconnect(ctx); err != nil {          // sends endSessions, unknown to FerretDB
		t.Fatalf("Disconnect: %v", err)
	}
	// A client that resets its connection (a killed sidecar) is not worth a console line either.
	conn, err := net.Dial("tcp", strings.TrimSuffix(strings.TrimPrefix(uri, "mongodb://"), "/"))
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.(*net.TCPConn).SetLinger(0)
	_ = conn.Close()
	if err := connect(t, uri).Ping(ctx, nil); err != nil {
		t.Fatalf("Ping after a reset: %v", err)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("RunCommand after cancel: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("RunCommand did not return within a minute of cancel")
	}
	if stderr.String() != "" {
		t.Errorf("the console got FerretDB's warnings:\n%s", stderr.String())
	}
	log, err := os.ReadFile(filepath.Join(dataDir, devdb.DatabaseLogName))
	if err != nil || !strings.Contains(string(log), "expireAfterSeconds") {
		t.Errorf("%s has no warning about the TTL index (%v):\n%s", devdb.DatabaseLogName, err, log)
	}
}

func TestRunCommandRejectsBadFlags(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"--no-such-flag"}, {"stray"}, {"--listen"}} {
		err := devdb.RunCommand(t.Context(), args, io.Discard, io.Discard)
		var ue *cli.UsageError
		if !errors.As(err, &ue) || !strings.Contains(ue.Usage, "-data-dir") {
			t.Errorf("RunCommand(%q) = %v, want a *cli.UsageError with the usage", args, err)
		}
	}
}

// -h, --help and help print the usage to stdout and start nothing.
func TestRunCommandHelp(t *testing.T) {
	t.Parallel()
	for _, arg := range []string{"-h", "--help", "help"} {
		var out bytes.Buffer
		err := devdb.RunCommand(t.Context(), []string{"--data-dir", t.TempDir() + "/none", arg}, &out, io.Discard)
		if !errors.Is(err, flag.ErrHelp) || !strings.Contains(out.String(), "Usage: pulse devdb") || !strings.Contains(out.String(), "-listen") {
			t.Errorf("RunCommand(%s) = %v, stdout:\n%s", arg, err, out.String())
		}
	}
}
