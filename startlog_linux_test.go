package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pulse-sidecar/pulse/internal/testdb"
	"github.com/pulse-sidecar/pulse/internal/testwait"
)

// openPTY returns the two ends of a new pseudo-terminal (Linux /dev/ptmx), closed in cleanup.
func openPTY(t *testing.T) (master, terminal *os.File) {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminal (/dev/ptmx): %v", err)
	}
	t.Cleanup(func() { master.Close() })
	if err := unix.IoctlSetPointerInt(int(master.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatalf("unlock the pseudo-terminal: %v", err)
	}
	n, err := unix.IoctlGetInt(int(master.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatalf("pseudo-terminal number: %v", err)
	}
	terminal, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("open the pseudo-terminal: %v", err)
	}
	t.Cleanup(func() { terminal.Close() })
	return master, terminal
}

// startLog runs `pulse serve` on a fresh embedded database with stdout set to out (a pipe's or a terminal's
// write end, read through read), waits for its "listening" line, stops it with SIGTERM and returns the lines
// it wrote up to and including that one. env adds variables.
func startLog(t *testing.T, out *os.File, read io.Reader, env ...string) []string {
	t.Helper()
	cmd := exec.Command(testdb.Binary(t), "serve")
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"),
		"PULSE_DATA_DIR=" + filepath.Join(t.TempDir(), "data"), "PULSE_LISTEN=127.0.0.1:0"}, env...)
	cmd.Stdout, cmd.Stderr = out, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start pulse serve: %v", err)
	}
	out.Close() // the child holds its own copy
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
	var log testdb.SyncBuffer
	go func() { _, _ = io.Copy(&log, read) }()
	testwait.Eventually(t, 2*time.Minute, "the listening line", func() bool {
		select {
		case <-exited:
			t.Fatalf("pulse serve exited before listening:\n%s", log.String())
		default:
		}
		return strings.Contains(log.String(), "listening")
	})
	_ = cmd.Process.Signal(syscall.SIGTERM)
	var lines []string
	for line := range strings.Lines(strings.ReplaceAll(log.String(), "\r\n", "\n")) {
		lines = append(lines, strings.TrimSuffix(line, "\n"))
		if strings.Contains(line, "listening") {
			break
		}
	}
	return lines
}

// The first start on a fresh embedded database logs JSON lines when stdout is a pipe and console lines when
// it is a terminal (PULSE_LOG_FORMAT unset), or what PULSE_LOG_FORMAT says; and its index builds are one
// info line, "built N indexes in X s", not two lines per index.
func TestFirstStartLog(t *testing.T) {
	t.Parallel()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	piped := startLog(t, w, r)
	summaries := 0
	for _, line := range piped {
		if !strings.HasPrefix(line, "{") {
			t.Errorf("stdout a pipe: line %q is not JSON", line)
		}
		if strings.Contains(line, `"building index"`) || strings.Contains(line, `"index built"`) {
			t.Errorf("stdout a pipe: a line per index build at info: %s", line)
		}
		if strings.Contains(line, `"message":"built `) && strings.Contains(line, " indexes in ") {
			summaries++
		}
	}
	if summaries != 1 {
		t.Errorf("stdout a pipe: %d index summary lines, want 1:\n%s", summaries, strings.Join(piped, "\n"))
	}
	t.Logf("a first start on a pipe logs %d lines up to listening", len(piped))

	master, terminal := openPTY(t)
	onTerminal := startLog(t, terminal, master)
	for _, line := range onTerminal {
		if strings.HasPrefix(line, "{") {
			t.Errorf("stdout a terminal: line %q is JSON, want the console format", line)
		}
	}
	if last := onTerminal[len(onTerminal)-1]; !strings.Contains(last, "INF") || !strings.Contains(last, "listening") {
		t.Errorf("stdout a terminal: last line %q, want a console line with INF and listening", last)
	}

	master, terminal = openPTY(t)
	for _, line := range startLog(t, terminal, master, "PULSE_LOG_FORMAT=json") {
		if !strings.HasPrefix(line, "{") {
			t.Errorf("PULSE_LOG_FORMAT=json on a terminal: line %q is not JSON", line)
		}
	}
}
