package harness

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
	Cmd  *exec.Cmd
	Logs *testdb.SyncBuffer
	Done chan struct{}

	killOnce sync.Once
}

// StartProcess starts `pulse` with env (and nothing else of the test's environment but PATH and HOME) and
// returns once it listens. It is killed in t.Cleanup if still running.
func (b *Bundle) StartProcess(env map[string]string) *proc {
	b.T.Helper()
	p, err := Launch(testdb.Binary(b.T), env)
	if p != nil {
		b.T.Cleanup(p.Kill)
	}
	if err != nil {
		b.T.Fatal(err)
	}
	return p
}

// StartProcesses starts n sidecar processes at once and returns when all listen.
func (b *Bundle) StartProcesses(n int, env map[string]string) []*proc {
	b.T.Helper()
	bin := testdb.Binary(b.T)
	procs := make([]*proc, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			procs[i], errs[i] = Launch(bin, env)
		}()
	}
	wg.Wait()
	for i := range n {
		if procs[i] != nil {
			b.T.Cleanup(procs[i].Kill)
		}
		if errs[i] != nil {
			b.T.Fatal(errs[i])
		}
	}
	return procs
}

// Launch starts one sidecar process and waits until it listens (60 s at most).
func Launch(bin string, env map[string]string) (*proc, error) {
	cmd := exec.Command(bin)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	p := &proc{Cmd: cmd, Logs: &testdb.SyncBuffer{}, Done: make(chan struct{})}
	cmd.Stderr = p.Logs
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			_, _ = p.Logs.Write(append(sc.Bytes(), '\n'))
			var line struct{ Message, Addr string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Message == "listening" {
				addr <- line.Addr
			}
		}
		_ = cmd.Wait()
		close(p.Done)
	}()
	select {
	case a := <-addr:
		p.URL = "http://" + a
		return p, nil
	case <-p.Done:
		return p, fmt.Errorf("sidecar process exited at start:\n%s", p.Logs.String())
	case <-time.After(60 * time.Second):
		return p, fmt.Errorf("sidecar process did not listen within 60s:\n%s", p.Logs.String())
	}
}

// Kill sends SIGKILL and waits until the process is gone.
func (p *proc) Kill() {
	p.killOnce.Do(func() {
		_ = p.Cmd.Process.Signal(syscall.SIGKILL)
		<-p.Done
	})
}

// Sidecar returns a client view of the process for the HTTP helpers.
func (p *proc) Sidecar() *Sidecar { return &Sidecar{URL: p.URL, Logs: p.Logs} }
