package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pulse-sidecar/pulse/e2e/internal/harness"
	"github.com/pulse-sidecar/pulse/internal/testdb"
	"github.com/pulse-sidecar/pulse/internal/testwait"
)

// privateDB is a `pulse devdb` process of one test's own, so the test can kill it without disturbing others.
type privateDB struct {
	URI  string
	cmd  *exec.Cmd
	done chan struct{}
}

// startPrivateDB starts `pulse devdb --listen listen --data-dir dir` and returns once it printed its URI; it
// is killed in t.Cleanup.
func startPrivateDB(t *testing.T, listen, dir string) *privateDB {
	t.Helper()
	cmd := exec.Command(testdb.Binary(t), "devdb", "--listen", listen, "--data-dir", dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	db := &privateDB{cmd: cmd, done: make(chan struct{})}
	uri := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if u, ok := strings.CutPrefix(sc.Text(), "devdb: "); ok {
				uri <- u
			}
		}
		_ = cmd.Wait()
		close(db.done)
	}()
	t.Cleanup(db.kill)
	select {
	case db.URI = <-uri:
	case <-db.done:
		t.Fatal("devdb exited before printing its URI")
	case <-time.After(60 * time.Second):
		t.Fatal("devdb printed no URI within 60s")
	}
	return db
}

// kill sends SIGKILL and waits until the process is gone; it is safe twice.
func (db *privateDB) kill() {
	_ = db.cmd.Process.Signal(syscall.SIGKILL)
	<-db.done
}

// timedStatus sends a request and returns its status, the error code of its body, its Retry-After and how
// long it took.
func timedStatus(t *testing.T, method, url string, body any) (int, string, string, time.Duration) {
	t.Helper()
	a, err := timedRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	return a.code, a.errCode, a.retryAfter, a.took
}

// timedAnswer is what timedRequest saw.
type timedAnswer struct {
	code                int
	errCode, retryAfter string
	took                time.Duration
}

// timedRequest is timedStatus for any goroutine: it returns the request's error instead of failing the test.
func timedRequest(method, url string, body any) (timedAnswer, error) {
	var e struct {
		Error struct{ Code string } `json:"error"`
	}
	start := time.Now()
	var rd io.Reader
	if body != nil {
		raw, _ := json.Marshal(body)
		rd = bytes.NewReader(raw)
	}
	req, _ := http.NewRequest(method, url, rd)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	took := time.Since(start)
	if err != nil {
		return timedAnswer{}, fmt.Errorf("%s %s: %w", method, url, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(raw, &e)
	return timedAnswer{resp.StatusCode, e.Error.Code, resp.Header.Get("Retry-After"), took}, nil
}

// The database process is killed: publishes and reads answer 503 database_unavailable with Retry-After
// within PULSE_DATABASE_TIMEOUT, /readyz says so, and after the database returns, publishing again with the
// id of a publish that got a 503 stores it once.
func TestDatabaseDownAnswers503Fast(t *testing.T) {
	b := harness.Setup(t)
	db := startPrivateDB(t, "127.0.0.1:0", t.TempDir())
	s := b.Start(b.FastEnv(map[string]string{
		"PULSE_MONGODB_URI":      db.URI,
		"PULSE_DATABASE_TIMEOUT": "1s",
	}))
	rcv := harness.NewReceiver(t, 200)
	s.RegisterEndpoint(t, "g", map[string]any{"url": rcv.URL, "topics": []string{"t"}})
	s.Publish(t, "t", "before")

	db.kill()
	for i, req := range []struct{ method, path string }{
		{"POST", "/v1/events"}, {"POST", "/v1/events"}, {"GET", "/v1/endpoints"}, {"GET", "/v1/deliveries"},
	} {
		var body any
		if req.method == "POST" {
			body = map[string]any{"id": "during-outage", "topic": "t", "data": i}
		}
		code, errCode, retryAfter, took := timedStatus(t, req.method, s.URL+req.path, body)
		t.Logf("%s %s during the outage: %d %s Retry-After %q in %s", req.method, req.path, code, errCode, retryAfter, took.Round(time.Millisecond))
		if code != 503 || errCode != "database_unavailable" || retryAfter == "" {
			t.Fatalf("%s %s during the outage = %d %q Retry-After %q, want 503 database_unavailable with Retry-After", req.method, req.path, code, errCode, retryAfter)
		}
		if took > 5*time.Second { // PULSE_DATABASE_TIMEOUT is 1s; before, the driver's 30 s server selection
			t.Fatalf("%s %s took %s to answer during the outage", req.method, req.path, took)
		}
	}
	if code, errCode, _, _ := timedStatus(t, "GET", s.URL+"/readyz", nil); code != 503 || errCode != "database_unavailable" {
		t.Fatalf("/readyz during the outage = %d %q", code, errCode)
	}

	u := strings.TrimSuffix(strings.TrimPrefix(db.URI, "mongodb://"), "/")
	startPrivateDB(t, u, db.cmd.Args[len(db.cmd.Args)-1]) // the same port and data directory
	var code int
	testwait.Eventually(t, 30*time.Second, "a publish to succeed after the outage", func() bool {
		code, _, _, _ = timedStatus(t, "POST", s.URL+"/v1/events", map[string]any{"id": "during-outage", "topic": "t", "data": 0})
		return code == 202 || code == 200
	})
	if code, _, _, _ := timedStatus(t, "POST", s.URL+"/v1/events", map[string]any{"id": "during-outage", "topic": "t", "data": 0}); code != 200 {
		t.Fatalf("publishing the same id again answered %d, want 200 (stored once)", code)
	}
	if d := s.WaitDelivery(t, "during-outage", "g", 30*time.Second); d.Status != "success" {
		t.Fatalf("delivery after the outage = %+v", d)
	}
	testwait.Eventually(t, 20*time.Second, "/readyz to answer 200", func() bool {
		code, _, _, _ := timedStatus(t, "GET", s.URL+"/readyz", nil)
		return code == 200
	})
}

// The database process is killed and many requests arrive at once: every one of them, on every API route
// that reads or writes the database, answers 503 database_unavailable with Retry-After within
// PULSE_DATABASE_TIMEOUT plus half of it, as a lone request does. Before, concurrent publishes waited for the
// group commit round under way and then for their own (up to twice the timeout), and a replay or a resume
// waited once for its read of the endpoint and once more for its write.
func TestDatabaseDownConcurrentRequestsAnswer503Fast(t *testing.T) {
	const timeout = 3 * time.Second // long enough that a busy machine's delays stay far below half of it
	b := harness.Setup(t)
	db := startPrivateDB(t, "127.0.0.1:0", t.TempDir())
	s := b.Start(b.FastEnv(map[string]string{
		"PULSE_MONGODB_URI":      db.URI,
		"PULSE_DATABASE_TIMEOUT": timeout.String(),
	}))
	rcv := harness.NewReceiver(t, 200)
	s.RegisterEndpoint(t, "g", map[string]any{"url": rcv.URL, "topics": []string{"t"}})
	id := s.Publish(t, "t", "before")
	d := s.WaitDelivery(t, id, "g", 30*time.Second)

	db.kill()
	// The connections pooled before the kill fail at once; a lone request after them waits the timeout.
	testwait.Eventually(t, 30*time.Second, "a request to answer 503 during the outage", func() bool {
		code, _, _, _ := timedStatus(t, "GET", s.URL+"/v1/endpoints", nil)
		return code == 503
	})
	_, _, _, lone := timedStatus(t, "GET", s.URL+"/v1/endpoints", nil)
	t.Logf("a lone GET /v1/endpoints during the outage answered in %s", lone.Round(time.Millisecond))

	endpoint := map[string]any{"url": rcv.URL, "topics": []string{"t"}}
	routes := []struct {
		method, path string
		body         any
	}{
		{"POST", "/v1/events", map[string]any{"topic": "t", "data": 1}},
		{"POST", "/v1/events", []map[string]any{{"topic": "t", "data": 1}, {"topic": "t", "data": 2}}},
		{"GET", "/v1/events/" + id, nil},
		{"GET", "/v1/deliveries", nil},
		{"GET", "/v1/deliveries/" + d.ID, nil},
		{"POST", "/v1/deliveries/" + d.ID + "/retry", nil},
		{"POST", "/v1/deliveries/" + d.ID + "/cancel", nil},
		{"POST", "/v1/endpoints/g/replay", map[string]any{"status": "success"}},
		{"POST", "/v1/endpoints/g/rotate-secret", map[string]any{}},
		{"POST", "/v1/endpoints/g/pause", nil},
		{"POST", "/v1/endpoints/g/resume", nil},
		{"GET", "/v1/stats", nil},
		{"GET", "/v1/stats?consumerGroup=g", nil},
		{"GET", "/v1/endpoints/g/activity", nil},
		{"GET", "/v1/endpoints", nil},
		{"GET", "/v1/endpoints/g", nil},
		{"PUT", "/v1/endpoints/h", endpoint},
		{"DELETE", "/v1/endpoints/g", nil},
		{"GET", "/readyz", nil},
	}
	const perRoute = 8
	type answer struct {
		route int
		timedAnswer
		err error
	}
	answers := make(chan answer, perRoute*len(routes))
	start := make(chan struct{})
	for i, rt := range routes {
		for range perRoute {
			go func() {
				<-start
				a, err := timedRequest(rt.method, s.URL+rt.path, rt.body)
				answers <- answer{i, a, err}
			}()
		}
	}
	close(start)
	slowest := make([]time.Duration, len(routes))
	bound := timeout + timeout/2
	for range perRoute * len(routes) {
		a := <-answers
		rt := routes[a.route]
		if a.err != nil {
			t.Fatal(a.err)
		}
		if a.code != 503 || a.errCode != "database_unavailable" || a.retryAfter == "" {
			t.Errorf("%s %s during the outage = %d %q Retry-After %q, want 503 database_unavailable with Retry-After", rt.method, rt.path, a.code, a.errCode, a.retryAfter)
		}
		slowest[a.route] = max(slowest[a.route], a.took)
	}
	for i, rt := range routes {
		t.Logf("%d concurrent %s %s: the slowest answered in %s", perRoute, rt.method, rt.path, slowest[i].Round(time.Millisecond))
		if slowest[i] > bound {
			t.Errorf("one of %d concurrent %s %s answered in %s, over PULSE_DATABASE_TIMEOUT %s plus half (a lone request: %s)", perRoute, rt.method, rt.path, slowest[i].Round(time.Millisecond), timeout, lone.Round(time.Millisecond))
		}
	}
}

// The embedded database's disk is full: publishes answer 503 database_unavailable (never a bare 500), and
// /readyz turns 503 although the database still answers pings.
func TestDiskFullAnswers503(t *testing.T) {
	b := harness.Setup(t)
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=4m"); err != nil {
		t.Skipf("cannot mount a small tmpfs to fill (needs root): %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
	db := startPrivateDB(t, "127.0.0.1:0", dir)
	s := b.Start(b.FastEnv(map[string]string{"PULSE_MONGODB_URI": db.URI}))
	code, errCode := 0, ""
	fill := func(from int) { // fill with ever smaller events until none fits
		for size := from; size >= 256; size /= 4 {
			for i := 0; i < 1000; i++ {
				code, errCode, _, _ = timedStatus(t, "POST", s.URL+"/v1/events", map[string]any{"topic": "t", "data": strings.Repeat("x", size)})
				if code != 202 {
					break
				}
			}
		}
	}
	fill(256 << 10)
	if code != 503 || errCode != "database_unavailable" {
		t.Fatalf("publish on a full disk = %d %q, want 503 database_unavailable", code, errCode)
	}
	// The sidecar's own deletes (the outbox documents of the events it fanned out) free a few pages after the
	// last publish failed: each look at /readyz fills them first.
	testwait.Eventually(t, 30*time.Second, "/readyz to answer 503 database_unavailable on a full disk", func() bool {
		fill(4 << 10)
		c, e, _, _ := timedStatus(t, "GET", s.URL+"/readyz", nil)
		return c == 503 && e == "database_unavailable"
	})
}
