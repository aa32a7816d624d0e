package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pulse-sidecar/pulse/internal/devdb"
	"github.com/pulse-sidecar/pulse/internal/testdb"
)

// runBinary runs the pulse binary with args and an environment of PATH and HOME only, and returns its exit
// status, stdout and stderr.
func runBinary(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	cmd := exec.Command(testdb.Binary(t), args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatalf("run pulse %q: %v", args, err)
	}
	return code, out.String(), errOut.String()
}

// -h, --help and help print the usage with every subcommand and exit 0, on every subcommand too (without
// starting anything); --version works; an unknown command or flag prints the usage and exits 2.
func TestCommandLineConventions(t *testing.T) {
	t.Parallel()
	subcommands := []string{"serve", "devdb", "bench", "healthcheck", "version", "help"}
	for _, args := range [][]string{{"-h"}, {"--help"}, {"-help"}, {"help"}} {
		code, out, errOut := runBinary(t, args...)
		if code != 0 || errOut != "" {
			t.Errorf("pulse %q: exit %d, stderr %q; want 0 and nothing", args, code, errOut)
		}
		for _, sub := range subcommands {
			if !strings.Contains(out, "\n  "+sub+" ") {
				t.Errorf("pulse %q: usage does not list %s:\n%s", args, sub, out)
			}
		}
	}
	for _, sub := range []string{"serve", "devdb", "bench", "healthcheck", "version"} {
		for _, args := range [][]string{{sub, "-h"}, {sub, "--help"}, {sub, "help"}, {"help", sub}} {
			code, out, errOut := runBinary(t, args...)
			if code != 0 || errOut != "" || !strings.Contains(out, "Usage: pulse") {
				t.Errorf("pulse %q: exit %d, stdout %q, stderr %q; want 0 and the usage on stdout", args, code, out, errOut)
			}
		}
	}
	for _, args := range [][]string{{"--version"}, {"version"}} {
		if code, out, _ := runBinary(t, args...); code != 0 || strings.TrimSpace(out) == "" {
			t.Errorf("pulse %q: exit %d, stdout %q; want 0 and the version", args, code, out)
		}
	}
	for _, args := range [][]string{
		{"nosuch"}, {"devdb", "--nosuch"},
		{"bench", "--nosuch"}, {"bench", "extra"}, {"healthcheck", "--nosuch"}, {"healthcheck", "--timeout", "soon"},
		{"version", "extra"}, {"help", "nosuch"},
	} {
		code, out, errOut := runBinary(t, args...)
		if code != 2 || out != "" || !strings.Contains(errOut, "Usage: pulse") || !strings.HasPrefix(errOut, "pulse: ") {
			t.Errorf("pulse %q: exit %d, stdout %q, stderr %q; want 2, the reason and the usage on stderr", args, code, out, errOut)
		}
	}
}

// A flag or an argument given to serve (the default command) prints the reason and one hint, that the
// configuration is the environment's, not serve's hundred lines of variables; exit 2.
func TestServeFlagPrintsAHint(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"serve", "--port", "9"}, {"--port", "9"}, {"serve", "--nosuch"}, {"serve", "extra"}} {
		code, out, errOut := runBinary(t, args...)
		lines := strings.Split(strings.TrimSuffix(errOut, "\n"), "\n")
		if code != 2 || out != "" || len(lines) != 2 || !strings.HasPrefix(lines[0], "pulse: ") ||
			!strings.HasPrefix(lines[1], "pulse serve takes no flags; set PULSE_LISTEN=") {
			t.Errorf("pulse %q: exit %d, stdout %q, stderr %q; want 2, the reason and the hint line on stderr", args, code, out, errOut)
		}
	}
}

// pulse healthcheck reads PULSE_PROBE_LISTEN, else PULSE_LISTEN, as serve does, and dials a wildcard address on
// loopback.
func TestHealthcheckReadsListen(t *testing.T) {
	t.Parallel()
	status := http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(status)
	}))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	for _, env := range []map[string]string{
		{"PULSE_LISTEN": "127.0.0.1:" + port},
		{"PULSE_LISTEN": "0.0.0.0:" + port, "PULSE_API_TOKEN": "t"}, // beyond loopback needs a token
		{"PULSE_PROBE_LISTEN": "0.0.0.0:" + port},                   // the probe listener first
	} {
		if err := run(t.Context(), []string{"healthcheck"}, func(k string) string { return env[k] }, io.Discard); err != nil {
			t.Errorf("healthcheck with %v: %v", env, err)
		}
	}
	status = http.StatusServiceUnavailable
	env := map[string]string{"PULSE_LISTEN": "127.0.0.1:" + port}
	if err := run(t.Context(), []string{"healthcheck"}, func(k string) string { return env[k] }, io.Discard); err == nil {
		t.Error("healthcheck passed while /readyz answered 503")
	}
	env["PULSE_LISTEN"] = "nonsense"
	if err := run(t.Context(), []string{"healthcheck"}, func(k string) string { return env[k] }, io.Discard); err == nil ||
		!strings.Contains(err.Error(), "PULSE_LISTEN") {
		t.Errorf("healthcheck with a bad PULSE_LISTEN: %v, want an error naming it", err)
	}
}

// A sidecar whose PULSE_DATA_DIR is in use by another process stops with one line naming the variable and
// the holder; one whose port is busy stops before it creates the data directory.
func TestServeDataDirLockAndBusyPort(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	holder, err := devdb.Start(t.Context(), devdb.Config{DataDir: dir})
	if err != nil {
		t.Fatalf("devdb.Start: %v", err)
	}
	defer holder.Stop()
	env := map[string]string{"PULSE_DATA_DIR": dir, "PULSE_LISTEN": "127.0.0.1:0"}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second) // a sidecar that starts anyway ends here
	defer cancel()
	err = run(ctx, nil, func(k string) string { return env[k] }, io.Discard)
	if err == nil || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "PULSE_DATA_DIR") ||
		!strings.Contains(err.Error(), "process "+strconv.Itoa(os.Getpid())) {
		t.Errorf("serve on a data directory in use: %v, want one line naming PULSE_DATA_DIR and process %d", err, os.Getpid())
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	fresh := filepath.Join(t.TempDir(), "data")
	env = map[string]string{"PULSE_DATA_DIR": fresh, "PULSE_LISTEN": ln.Addr().String()}
	err = run(ctx, nil, func(k string) string { return env[k] }, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "PULSE_LISTEN") {
		t.Errorf("serve on a busy port: %v, want an error naming PULSE_LISTEN", err)
	}
	if _, statErr := os.Stat(fresh); !errors.Is(statErr, os.ErrNotExist) {
		t.Errorf("serve on a busy port created PULSE_DATA_DIR (stat: %v)", statErr)
	}
}

// A bad configuration stops `pulse serve` (main's run) at start with one line naming the variable, before it
// binds or connects to anything.
func TestRunStopsOnABadConfiguration(t *testing.T) {
	t.Parallel()
	for key, value := range map[string]string{"PULSE_LOCK_TIMEOUT": "soon", "PULSE_ALLOWED_HOSTS": "pulse:8080", "PULSE_LISTEN": "nope"} {
		err := run(t.Context(), []string{"serve"}, func(k string) string {
			if k == key {
				return value
			}
			return ""
		}, io.Discard)
		if err == nil || !strings.Contains(err.Error(), key) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s=%s: run = %v, want one line naming %s", key, value, err, key)
		}
	}
}
