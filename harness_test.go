package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/pulse-sidecar/pulse/config"
	sidecarpkg "github.com/pulse-sidecar/pulse/internal/sidecar"
	"github.com/pulse-sidecar/pulse/internal/testdb"
)

// bundle is what setup gives a test: a database of its own and a way to start sidecars on it.
type bundle struct {
	t      *testing.T
	client *mongo.Client
	dbName string
	uri    string
}

func setup(t *testing.T) *bundle {
	t.Helper()
	t.Parallel()
	client, dbName := testdb.Database(t)
	return &bundle{t: t, client: client, dbName: dbName, uri: testdb.URI(t)}
}

// fastEnv is the configuration of sidecars under test: short leases and polls keep the tests fast. Each map of
// set is applied on top, in order; the result is a new map, which the caller may change.
func (b *bundle) fastEnv(set ...map[string]string) map[string]string {
	env := map[string]string{
		"PULSE_MONGODB_URI":      b.uri,
		"PULSE_DATABASE":         b.dbName,
		"PULSE_LISTEN":           "127.0.0.1:0",
		"PULSE_LOCK_TIMEOUT":     "600ms",
		"PULSE_POLL_INTERVAL":    "50ms",
		"PULSE_LOG_LEVEL":        "info",
		"PULSE_SHUTDOWN_TIMEOUT": "5s",
	}
	for _, m := range set {
		maps.Copy(env, m)
	}
	return env
}

// sidecar is one in-process sidecar started with run().
type sidecar struct {
	URL  string
	logs *testdb.SyncBuffer
	// stop shuts the sidecar down and waits for it, failing the test if it exited with an error; it is safe
	// twice (t.Cleanup calls it too). Nil for sidecars not started by start.
	stop func()
}

// start runs a sidecar in-process with env (internal/sidecar, as `pulse serve` runs it) and returns once it
// listens; it is stopped in t.Cleanup. The test hooks env sets (PULSE_TEST_CLOCK_SKEW,
// PULSE_TEST_CRASH_AFTER_PUBLISH) reach it as sidecar.TestHooks, in any build.
func (b *bundle) start(env map[string]string) *sidecar {
	b.t.Helper()
	getenv := func(k string) string { return env[k] }
	hooks, err := sidecarpkg.ParseTestHooks(getenv)
	if err != nil {
		b.t.Fatal(err)
	}
	cfg, err := config.Load(getenv)
	if err != nil {
		b.t.Fatal(err)
	}
	logs := &testdb.SyncBuffer{}
	s := sidecarpkg.New(cfg, sidecarpkg.Options{Logs: logs, TestHooks: hooks})
	if err := s.Start(context.Background()); err != nil {
		b.t.Fatalf("sidecar did not start: %v\n%s", err, logs.String())
	}
	stop := sync.OnceFunc(func() {
		s.Stop()
		if err := s.Wait(); err != nil {
			b.t.Errorf("sidecar exited with %v", err)
		}
	})
	b.t.Cleanup(stop)
	return &sidecar{URL: "http://" + s.Addr(), logs: logs, stop: stop}
}

// startWith runs a sidecar in-process with env through serve (serveWith or run) and returns once it
// listens; it is stopped in t.Cleanup.
func (b *bundle) startWith(env map[string]string, serve func(ctx context.Context, getenv func(string) string, stdout io.Writer) error) *sidecar {
	b.t.Helper()
	logs := &testdb.SyncBuffer{}
	pr, pw := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		err := serve(ctx, func(k string) string { return env[k] }, io.MultiWriter(pw, logs))
		pw.Close()
		done <- err
	}()
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			var line struct {
				Message string `json:"message"`
				Addr    string `json:"addr"`
			}
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Message == "listening" {
				addr <- line.Addr
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	stop := sync.OnceFunc(func() {
		cancel()
		if err := <-done; err != nil {
			b.t.Errorf("sidecar exited with %v", err)
		}
	})
	b.t.Cleanup(stop)
	select {
	case a := <-addr:
		return &sidecar{URL: "http://" + a, logs: logs, stop: stop}
	case err := <-done:
		b.t.Fatalf("sidecar did not start: %v\n%s", err, logs.String())
	case <-time.After(60 * time.Second):
		b.t.Fatalf("sidecar did not start within 60s\n%s", logs.String())
	}
	return nil
}

// get decodes the JSON answer of GET url into a T; it fails t unless the answer is 200.
func get[T any](t *testing.T, url string) T {
	t.Helper()
	var out T
	if code := do(t, "GET", url, nil, &out); code != 200 {
		t.Fatalf("GET %s answered %d", url, code)
	}
	return out
}

// do sends a JSON request and decodes a JSON answer into out (when non-nil); it returns the status.
func do(t *testing.T, method, url string, body any, out any) int {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		j, _ := json.Marshal(b)
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if out != nil && len(raw) > 0 {
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatalf("%s %s answered %d with non-JSON %q", method, url, resp.StatusCode, raw)
		}
	}
	return resp.StatusCode
}

// receiver is a fake webhook receiver that records every POST and answers with the next status of a script
// (the last status repeats).
type receiver struct {
	*httptest.Server
	mu       sync.Mutex
	got      []received
	statuses []int
	headers  map[string]string
	notify   chan struct{}
}

type received struct {
	Header http.Header
	Body   []byte
	At     time.Time
}

func newReceiver(t *testing.T, statuses ...int) *receiver {
	if len(statuses) == 0 {
		statuses = []int{200}
	}
	r := &receiver{statuses: statuses, notify: make(chan struct{}, 1000)}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		n := len(r.got)
		r.got = append(r.got, received{Header: req.Header.Clone(), Body: body, At: time.Now()})
		status := r.statuses[min(n, len(r.statuses)-1)]
		for k, v := range r.headers {
			w.Header().Set(k, v)
		}
		r.mu.Unlock()
		w.WriteHeader(status)
		r.notify <- struct{}{}
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *receiver) received() []received {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]received(nil), r.got...)
}

// wantPOSTs fails the test unless the receiver got exactly want POSTs; why, when not empty, ends the message.
func (r *receiver) wantPOSTs(t *testing.T, want int, why string) {
	t.Helper()
	if n := len(r.received()); n != want {
		if why != "" {
			why = " " + why
		}
		t.Fatalf("the receiver got %d POSTs, want %d%s", n, want, why)
	}
}

// holdingReceiver is a receiver that holds every POST until the test lets it go, then answers status: each
// value sent on release lets one POST go, letGo lets every one go from then on (t.Cleanup calls it too, before
// the server closes). It counts the POSTs it holds; arrived gets one signal per POST.
type holdingReceiver struct {
	*receiver
	release chan struct{}
	arrived chan struct{}
	letGo   func() // safe twice
	mu      sync.Mutex
	now     int
	most    int
}

func newHoldingReceiver(t *testing.T, status int) *holdingReceiver {
	h := &holdingReceiver{receiver: newReceiver(t, status), release: make(chan struct{}), arrived: make(chan struct{}, 1000)}
	h.letGo = sync.OnceFunc(func() { close(h.release) })
	t.Cleanup(h.letGo) // runs before the server closes (cleanups run last-in first-out)
	h.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.receiver.mu.Lock()
		h.got = append(h.got, received{Header: r.Header.Clone(), At: time.Now()})
		h.receiver.mu.Unlock()
		h.mu.Lock()
		h.now++
		h.most = max(h.most, h.now)
		h.mu.Unlock()
		h.arrived <- struct{}{}
		select {
		case <-h.release:
		case <-r.Context().Done():
		}
		h.mu.Lock()
		h.now--
		h.mu.Unlock()
		w.WriteHeader(status)
	})
	return h
}

// held returns how many POSTs the receiver holds now, and the most it held at once.
func (h *holdingReceiver) held() (now, most int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.now, h.most
}

func (h *holdingReceiver) waitArrival(t *testing.T) {
	t.Helper()
	select {
	case <-h.arrived:
	case <-time.After(20 * time.Second):
		t.Fatal("no POST arrived within 20s")
	}
}

// waitFor polls cond every 20ms until it holds or the deadline passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond) // polling interval, not a wait for an outcome
	}
}

type attemptView struct {
	Attempt    int    `json:"attempt"`
	Status     string `json:"status"`
	LockState  string `json:"lockState"`
	HTTPStatus int    `json:"httpStatus"`
	Error      *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
	NextAttemptAt time.Time  `json:"nextAttemptAt"`
	StartedAt     *time.Time `json:"startedAt"`
	EndedAt       *time.Time `json:"endedAt"`
}

type deliveryView struct {
	ID            string        `json:"id"`
	EventID       string        `json:"eventId"`
	ConsumerGroup string        `json:"consumerGroup"`
	Status        string        `json:"status"`
	Attempts      []attemptView `json:"attempts"`
	Error         *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

type eventView struct {
	ID         string          `json:"id"`
	Topic      string          `json:"topic"`
	Data       json.RawMessage `json:"data"`
	Deliveries []struct {
		ID            string `json:"id"`
		ConsumerGroup string `json:"consumerGroup"`
		Status        string `json:"status"`
		Attempts      int    `json:"attempts"`
	} `json:"deliveries"`
}

// registerEndpoint PUTs an endpoint and fails the test unless it answers 200 or 201.
func (s *sidecar) registerEndpoint(t *testing.T, group string, body map[string]any) {
	t.Helper()
	if code := do(t, "PUT", s.URL+"/v1/endpoints/"+group, body, nil); code != 201 && code != 200 {
		t.Fatalf("PUT endpoint %s answered %d", group, code)
	}
}

// deleteEndpoint DELETEs an endpoint and fails the test unless it answers 204.
func (s *sidecar) deleteEndpoint(t *testing.T, group string) {
	t.Helper()
	if code := do(t, "DELETE", s.URL+"/v1/endpoints/"+group, nil, nil); code != 204 {
		t.Fatalf("DELETE endpoint %s answered %d", group, code)
	}
}

// publish POSTs one event and returns its id.
func (s *sidecar) publish(t *testing.T, topic string, data any) string {
	t.Helper()
	var out struct {
		ID string `json:"id"`
	}
	if code := do(t, "POST", s.URL+"/v1/events", map[string]any{"topic": topic, "data": data}, &out); code != 202 {
		t.Fatalf("publish answered %d", code)
	}
	return out.ID
}

// waitDelivery waits until the event's delivery to group is terminal and returns it.
func (s *sidecar) waitDelivery(t *testing.T, eventID, group string, timeout time.Duration) deliveryView {
	t.Helper()
	var d deliveryView
	waitFor(t, timeout, "delivery of "+eventID+" to "+group+" to end", func() bool {
		var ev eventView
		if do(t, "GET", s.URL+"/v1/events/"+eventID, nil, &ev) != 200 {
			return false
		}
		for _, x := range ev.Deliveries {
			if x.ConsumerGroup == group && x.Status != "pending" {
				do(t, "GET", s.URL+"/v1/deliveries/"+x.ID, nil, &d)
				return d.Status != "pending"
			}
		}
		return false
	})
	return d
}

// wantSuccess waits for the delivery of each event to group and fails t unless every one ends in success.
func (s *sidecar) wantSuccess(t *testing.T, group string, timeout time.Duration, eventIDs ...string) {
	t.Helper()
	for _, id := range eventIDs {
		if d := s.waitDelivery(t, id, group, timeout); d.Status != "success" {
			t.Fatalf("delivery of %s to %s = %+v, want success", id, group, d)
		}
	}
}

// wantErrorAfter fails t unless d ended in error after n attempts and attempt i (from 1) failed with an error
// whose message contains msg.
func wantErrorAfter(t *testing.T, d deliveryView, n, i int, msg string) {
	t.Helper()
	if d.Status != "error" || len(d.Attempts) != n {
		t.Fatalf("delivery = %+v, want error after %d attempts", d, n)
	}
	if e := d.Attempts[i-1].Error; e == nil || !strings.Contains(e.Message, msg) {
		t.Fatalf("attempt %d error = %+v, want one saying %q", i, e, msg)
	}
}

// count returns the number of documents in <prefix>.<coll> of the test database.
func (b *bundle) count(coll string, filter bson.M) int64 {
	b.t.Helper()
	n, err := b.client.Database(b.dbName).Collection("pulse."+coll).CountDocuments(context.Background(), filter)
	if err != nil {
		b.t.Fatalf("count %s: %v", coll, err)
	}
	return n
}
