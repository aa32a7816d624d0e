package main

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/pulse-sidecar/pulse/internal/testdb"
)

// proc is a sidecar running as a real process (the binary built without -race), so tests can SIGKILL it.
type proc struct {
	URL  string
	cmd  *exec.Cmd
	logs *syncBuffer
	done chan struct{}
}

// startProcess starts `pulse` with env (and nothing else of the test's environment but PATH and HOME) and
// returns once it listens. It is killed in t.Cleanup if still running.
func (b *bundle) startProcess(env map[string]string) *proc {
	b.t.Helper()
	cmd := exec.Command(testdb.Binary(b.t))
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.t.Fatal(err)
	}
	p := &proc{cmd: cmd, logs: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stderr = p.logs
	if err := cmd.Start(); err != nil {
		b.t.Fatal(err)
	}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			_, _ = p.logs.Write(append(sc.Bytes(), '\n'))
			var line struct{ Message, Addr string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Message == "listening" {
				addr <- line.Addr
			}
		}
		_ = cmd.Wait()
		close(p.done)
	}()
	b.t.Cleanup(func() { p.kill() })
	select {
	case a := <-addr:
		p.URL = "http://" + a
		return p
	case <-p.done:
		b.t.Fatalf("sidecar process exited at start:\n%s", p.logs.String())
	case <-time.After(60 * time.Second):
		b.t.Fatalf("sidecar process did not listen within 60s:\n%s", p.logs.String())
	}
	return nil
}

// kill sends SIGKILL and waits until the process is gone.
func (p *proc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// sidecar returns a client view of the process for the HTTP helpers.
func (p *proc) sidecar() *sidecar { return &sidecar{URL: p.URL, logs: p.logs} }
