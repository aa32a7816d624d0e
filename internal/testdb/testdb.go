// Package testdb gives tests a MongoDB wire-protocol database of their own.
//
// By default it starts the project's `pulse devdb` subcommand (an embedded FerretDB behind the
// linearizing proxy of package internal/devdb) once per test process, as a child process built
// without -race: instrumenting FerretDB would make it several times slower. The package does not
// import FerretDB for the same reason.
//
// Environment:
//   - PULSE_TEST_MONGODB_URI: use this server (for example a real MongoDB replica set) instead.
//   - PULSE_TEST_POSTGRES_URL: run the child devdb on FerretDB's postgresql handler.
//   - PULSE_TEST_SHARD_PLAN=true, with PULSE_TEST_MONGODB_URI naming a mongos: shard each test database's
//     collections per the documented plan (EnvShardPlan).
//   - PULSE_TEST_BINARY: use this pulse binary instead of building one (build it with
//     -tags pulsetesthooks, or the process tests' PULSE_TEST_* hooks have no effect).
//
// The proxy runs each write on a database alone, reads beside reads only (Linearized); Serialize lets a test's
// database interleave them as MongoDB may (Interleaved), for race tests to run in both orders.
//
// A package that uses it calls Main from its TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(testdb.Main(m)) }
//
// Invariants: every test gets its own database, dropped when it ends; the child process dies with
// the test process (on Linux, through the parent-death signal); the process's temporary directory
// (binary, data, devdb log) is removed when its tests end, passed or failed. A test process that
// dies without returning from Main (a panic, a timeout, SIGKILL) leaves its directory to the next
// test process, which removes the directories of dead ones.
package testdb

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Environment variables read by this package.
const (
	EnvMongoDBURI  = "PULSE_TEST_MONGODB_URI"
	EnvPostgresURL = "PULSE_TEST_POSTGRES_URL"
	EnvBinary      = "PULSE_TEST_BINARY"
)

// testHooksTag is the build tag under which the pulse binary reads its PULSE_TEST_* hooks (testhooks.go in
// the module root); a binary built without it ignores them.
const testHooksTag = "pulsetesthooks"

const (
	// dirPrefix names the per-process temporary directories (binary, data, devdb log); the owner's
	// pid follows it, so a later process can remove the directories of dead ones.
	dirPrefix = "pulse-testdb-"
	// connectTimeout bounds server selection, the first ping and the drop in cleanup.
	connectTimeout = 30 * time.Second
)

var (
	procDirOnce = sync.OnceValues(makeProcessDir)
	binaryOnce  = sync.OnceValues(buildBinary)
	serverOnce  = sync.OnceValues(startServer)

	// mainRunning is set by Main: without it nobody would remove the temporary directory.
	mainRunning atomic.Bool

	// stateMu guards what Main's cleanup undoes.
	stateMu   sync.Mutex
	procDir   string        // this process's temporary directory, once made
	childDone chan struct{} // closed once the devdb child has exited, when one was started
	child     *os.Process
)

// Main runs the tests of m (m.Run), then stops the database server started for them and removes this
// process's temporary directory, whether the tests passed or failed. It returns the exit code for
// os.Exit: m.Run's, or 1 when the cleanup fails (the reason goes to stderr). URI, Database and Binary
// fail a test whose package's TestMain does not call Main.
func Main(m *testing.M) int {
	mainRunning.Store(true)
	code := m.Run()
	if err := cleanup(); err != nil {
		fmt.Fprintf(os.Stderr, "testdb: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// cleanup kills the devdb child, waits until it has exited, and removes the process's directory.
func cleanup() error {
	stateMu.Lock()
	dir, proc, done := procDir, child, childDone
	stateMu.Unlock()
	if proc != nil {
		_ = proc.Kill()
		select {
		case <-done:
		case <-time.After(connectTimeout):
			return fmt.Errorf("devdb child %d did not exit within %s of SIGKILL; %s stays", proc.Pid, connectTimeout, dir)
		}
	}
	if dir == "" {
		return nil
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	return nil
}

// URI returns the base URI of the test database server for this test process. It is
// PULSE_TEST_MONGODB_URI when set. Otherwise the first call builds the pulse binary (see Binary),
// starts `pulse devdb --listen 127.0.0.1:0 --data-dir <tempdir>` as a child process (adding
// --postgresql-url when PULSE_TEST_POSTGRES_URL is set), and waits for its `devdb: <uri>` line; later
// calls return the same URI. The child is killed when the test process exits. URI is safe for
// concurrent use; it fails t if the server cannot be started (the error includes the child's log).
func URI(t testing.TB) string {
	t.Helper()
	if uri := os.Getenv(EnvMongoDBURI); uri != "" {
		return uri
	}
	uri, err := serverOnce()
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	return uri
}

// Database returns a client connected to URI(t) and the name of a fresh database unique to this
// test (its sanitized name plus a random suffix). In t.Cleanup the database is dropped and the
// client disconnected. It fails t if the server does not answer a ping within 30 seconds.
func Database(t testing.TB) (client *mongo.Client, dbName string) {
	t.Helper()
	uri := URI(t)
	client, err := mongo.Connect(options.Client().ApplyURI(uri).SetServerSelectionTimeout(connectTimeout))
	if err != nil {
		t.Fatalf("testdb: connect to %s: %v", uri, err)
	}
	dbName = databaseName(t.Name())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
		defer cancel()
		if err := client.Database(dbName).Drop(ctx); err != nil {
			t.Errorf("testdb: drop database %s: %v", dbName, err)
		}
		if err := client.Disconnect(ctx); err != nil {
			t.Errorf("testdb: disconnect: %v", err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
	defer cancel()
	if err := client.Ping(ctx, nil); err != nil {
		t.Fatalf("testdb: ping %s: %v", uri, err)
	}
	if shardPlanOn() {
		if err := shardPlan(ctx, client, dbName); err != nil {
			t.Fatalf("testdb: %v", err)
		}
	}
	return client, dbName
}

// Embedded reports whether the tests run on the embedded database, that is whether
// PULSE_TEST_MONGODB_URI is unset.
func Embedded() bool { return os.Getenv(EnvMongoDBURI) == "" }

// Serialization is how the embedded database's proxy orders the operations on one database (the
// serializations of internal/devdb, named alike; not imported, to keep FerretDB out of the test binaries).
type Serialization string

const (
	// Linearized runs each write on a database alone and whole, reads beside reads only (the default).
	Linearized Serialization = "linearized"
	// Interleaved runs a database's reads together and its writes one document at a time, with other
	// operations between the documents of one write: interleavings MongoDB allows without transactions.
	Interleaved Serialization = "interleaved"
)

// serializationCommand is devdb.SerializationCommand.
const serializationCommand = "devdbSerialization"

// Serialize sets how the embedded database orders the operations on database dbName, through client; the
// setting lasts until the next Serialize of that database. It fails t on a server given by
// PULSE_TEST_MONGODB_URI (a real server has its own order: check Embedded first) or if the proxy refuses.
func Serialize(t testing.TB, client *mongo.Client, dbName string, s Serialization) {
	t.Helper()
	if !Embedded() {
		t.Fatalf("testdb: Serialize(%s) needs the embedded database; %s is set", s, EnvMongoDBURI)
	}
	ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
	defer cancel()
	if err := client.Database(dbName).RunCommand(ctx, bson.D{{Key: serializationCommand, Value: string(s)}}).Err(); err != nil {
		t.Fatalf("testdb: set serialization %s of %s: %v", s, dbName, err)
	}
}

// Binary returns the path of the project's pulse binary, built without -race and with its test hooks
// (PULSE_TEST_CLOCK_SKEW, PULSE_TEST_CRASH_AFTER_PUBLISH): PULSE_TEST_BINARY when set, otherwise the result
// of `go build -tags pulsetesthooks -o <tempdir>/pulse .` in the module root, run once per test
// process (the go tool is GOROOT/bin/go, or "go" on PATH). It is safe for concurrent use and fails t
// if the build fails (the error includes the compiler's output).
func Binary(t testing.TB) string {
	t.Helper()
	path, err := binaryOnce()
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	return path
}

func buildBinary() (string, error) {
	if path := os.Getenv(EnvBinary); path != "" {
		return path, nil
	}
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	dir, err := procDirOnce()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, "pulse")
	cmd := exec.Command(goTool(), "build", "-tags", testHooksTag, "-o", out, ".")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOFLAGS="+withoutRace(os.Getenv("GOFLAGS")))
	start := time.Now()
	if output, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build pulse in %s (%s): %w\n%s", root, time.Since(start).Round(time.Millisecond), err, output)
	}
	return out, nil
}

// moduleRoot returns the directory of the go.mod above this source file.
func moduleRoot() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", fmt.Errorf("find module root: runtime.Caller failed")
	}
	for dir := filepath.Dir(file); ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		if filepath.Dir(dir) == dir {
			return "", fmt.Errorf("find module root: no go.mod above %s", file)
		}
	}
}

// goTool returns GOROOT/bin/go when it exists, otherwise "go" (found on PATH).
func goTool() string {
	if root := runtime.GOROOT(); root != "" {
		path := filepath.Join(root, "bin", "go")
		if _, err := os.Stat(path); err == nil {
			return path
		}
	}
	return "go"
}

// withoutRace removes -race from a GOFLAGS value so that the binary is never race-instrumented.
func withoutRace(goflags string) string {
	var kept []string
	for _, f := range strings.Fields(goflags) {
		if f != "-race" && f != "--race" && f != "-race=true" {
			kept = append(kept, f)
		}
	}
	return strings.Join(kept, " ")
}

// databaseName returns "t_<test name>_<16 hex digits>", at most 59 characters of [a-z0-9_], which
// FerretDB and MongoDB both accept.
func databaseName(testName string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(testName) {
		if b.Len() == 40 {
			break
		}
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	suffix := make([]byte, 8)
	_, _ = rand.Read(suffix) // never fails
	return "t_" + b.String() + "_" + hex.EncodeToString(suffix)
}
