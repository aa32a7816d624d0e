package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/pulse-sidecar/pulse/internal/testdb"
)

// proc is a sidecar running as a real process (the binary built without -race), so tests can SIGKILL it.
type proc struct {
	URL  string
	cmd  *exec.Cmd
	logs *testdb.SyncBuffer
	done chan struct{}

	killOnce sync.Once
}

// startProcess starts `pulse` with env (and nothing else of the test's environment but PATH and HOME) and
// returns once it listens. It is killed in t.Cleanup if still running.
func (b *bundle) startProcess(env map[string]string) *proc {
	b.t.Helper()
	p, err := launch(testdb.Binary(b.t), env)
	if p != nil {
		b.t.Cleanup(p.kill)
	}
	if err != nil {
		b.t.Fatal(err)
	}
	return p
}

// startProcesses starts n sidecar processes at once and returns when all listen.
func (b *bundle) startProcesses(n int, env map[string]string) []*proc {
	b.t.Helper()
	bin := testdb.Binary(b.t)
	procs := make([]*proc, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			procs[i], errs[i] = launch(bin, env)
		}()
	}
	wg.Wait()
	for i := range n {
		if procs[i] != nil {
			b.t.Cleanup(procs[i].kill)
		}
		if errs[i] != nil {
			b.t.Fatal(errs[i])
		}
	}
	return procs
}

// launch starts one sidecar process and waits until it listens (60 s at most).
func launch(bin string, env map[string]string) (*proc, error) {
	cmd := exec.Command(bin)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	p := &proc{cmd: cmd, logs: &testdb.SyncBuffer{}, done: make(chan struct{})}
	cmd.Stderr = p.logs
	if err := cmd.Start(); err != nil {
		return nil, err
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
	select {
	case a := <-addr:
		p.URL = "http://" + a
		return p, nil
	case <-p.done:
		return p, fmt.Errorf("sidecar process exited at start:\n%s", p.logs.String())
	case <-time.After(60 * time.Second):
		return p, fmt.Errorf("sidecar process did not listen within 60s:\n%s", p.logs.String())
	}
}

// kill sends SIGKILL and waits until the process is gone.
func (p *proc) kill() {
	p.killOnce.Do(func() {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.done
	})
}

// sidecar returns a client view of the process for the HTTP helpers.
func (p *proc) sidecar() *sidecar { return &sidecar{URL: p.URL, logs: p.logs} }
