package main

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"

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
		{"nosuch"}, {"--nosuch"}, {"serve", "--nosuch"}, {"serve", "extra"}, {"devdb", "--nosuch"},
		{"bench", "--nosuch"}, {"bench", "extra"}, {"healthcheck", "--nosuch"}, {"healthcheck", "--timeout", "soon"},
		{"version", "extra"}, {"help", "nosuch"},
	} {
		code, out, errOut := runBinary(t, args...)
		if code != 2 || out != "" || !strings.Contains(errOut, "Usage: pulse") || !strings.HasPrefix(errOut, "pulse: ") {
			t.Errorf("pulse %q: exit %d, stdout %q, stderr %q; want 2, the reason and the usage on stderr", args, code, out, errOut)
		}
	}
}

// pulse healthcheck reads PULSE_LISTEN as serve does, and dials a wildcard address on loopback.
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
	for _, listen := range []string{"127.0.0.1:" + port, "0.0.0.0:" + port} {
		env := map[string]string{"PULSE_LISTEN": listen}
		if err := run(t.Context(), []string{"healthcheck"}, func(k string) string { return env[k] }, io.Discard); err != nil {
			t.Errorf("healthcheck with PULSE_LISTEN=%s: %v", listen, err)
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
