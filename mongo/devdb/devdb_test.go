package devdb_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/pulse-sidecar/pulse/internal/cli"
	"github.com/pulse-sidecar/pulse/mongo/devdb"
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

func TestRunCommand(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()

	r, w := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- devdb.RunCommand(ctx, []string{"--listen", "127.0.0.1:0", "--data-dir", t.TempDir()}, w)
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
	if err := connect(t, uri).Ping(ctx, nil); err != nil {
		t.Fatalf("Ping %s: %v", uri, err)
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
}

func TestRunCommandRejectsBadFlags(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"--no-such-flag"}, {"stray"}, {"--listen"}} {
		err := devdb.RunCommand(t.Context(), args, io.Discard)
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
		err := devdb.RunCommand(t.Context(), []string{"--data-dir", t.TempDir() + "/none", arg}, &out)
		if !errors.Is(err, flag.ErrHelp) || !strings.Contains(out.String(), "Usage: pulse devdb") || !strings.Contains(out.String(), "-listen") {
			t.Errorf("RunCommand(%s) = %v, stdout:\n%s", arg, err, out.String())
		}
	}
}
