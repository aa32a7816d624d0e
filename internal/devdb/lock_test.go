package devdb_test

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/pulse-sidecar/pulse/internal/devdb"
)

// A second Server on a data directory in use stops with one line naming the holder's pid; once the first
// stops, the directory can be opened again.
func TestDataDirIsLocked(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	first := startServer(t, devdb.Config{DataDir: dir})

	second, err := devdb.Start(t.Context(), devdb.Config{DataDir: dir})
	if err == nil {
		_ = second.Stop()
		t.Fatal("a second Server opened the data directory of a running one")
	}
	var le *devdb.LockedError
	if !errors.As(err, &le) || !errors.Is(err, devdb.ErrDataDirLocked) {
		t.Fatalf("second Start: %v, want a *LockedError", err)
	}
	pid := strconv.Itoa(os.Getpid())
	if msg := err.Error(); strings.Contains(msg, "\n") || !strings.Contains(msg, "process "+pid) || !strings.Contains(msg, dir) {
		t.Fatalf("second Start: %q, want one line naming process %s and %s", msg, pid, dir)
	}

	if err := first.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	third := startServer(t, devdb.Config{DataDir: dir})
	_ = third.Stop()
}

// A busy listen address fails the start before the data directory is created.
func TestBusyAddressCreatesNoDataDir(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dir := filepath.Join(t.TempDir(), "data")
	srv, err := devdb.Start(t.Context(), devdb.Config{DataDir: dir, Listen: ln.Addr().String()})
	if err == nil {
		_ = srv.Stop()
		t.Fatal("Start on a busy address succeeded")
	}
	if _, statErr := os.Stat(dir); !errors.Is(statErr, os.ErrNotExist) {
		t.Fatalf("Start on a busy address (%v) left the data directory behind: stat = %v", err, statErr)
	}
}
