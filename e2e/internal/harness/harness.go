package harness

import (
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
	"github.com/pulse-sidecar/pulse/internal/testdb"
	"github.com/pulse-sidecar/pulse/internal/testwait"
	"github.com/pulse-sidecar/pulse/sidecar"
)

// Bundle is what setup gives a test: a database of its own and a way to start sidecars on it.
type Bundle struct {
	T      *testing.T
	Client *mongo.Client
	DBName string
	URI    string
}

// Setup gives t a database of its own on the test process's database server and marks t parallel.
func Setup(t *testing.T) *Bundle {
	t.Helper()
	t.Parallel()
	return SetupAlone(t)
}

// SetupAlone is Setup for a test that must not share the database server with the other tests of its
// package while it runs: it does not mark t parallel, so t runs before the parallel tests resume (go test
// runs them once every sequential test ended). It is for a test whose point is the database's own pace, such
// as TestNoDuplicateUnderDeepWriteQueue's write queue: beside a test loading the server with six replicas, a
// write waited over a second.
func SetupAlone(t *testing.T) *Bundle {
	t.Helper()
	client, dbName := testdb.Database(t)
	return &Bundle{T: t, Client: client, DBName: dbName, URI: testdb.URI(t)}
}

// LongLease is FastEnv's PULSE_LOCK_TIMEOUT: far longer than any stall of a test machine.
const LongLease = "30s"

// ShortLease is the configuration of a test about lease expiry or the repairs that wait for it (an expired
// attempt reaped as worker_lost, a torn state, a publish whose fan-out died with its process): a lease of
// 1 s, so the reaper runs every 250 ms, the repair scan every 500 ms and an unfanned publish is repaired
// after 1 s. Apply it with FastEnv(ShortLease); FastEnv copies it, so it is never changed.
var ShortLease = map[string]string{"PULSE_LOCK_TIMEOUT": "1s"}

// FastEnv is the configuration of sidecars under test: short polls keep the tests fast, and leases of
// LongLease mean a stall of the machine (a busy CI runner, -race) never expires one, so that only the tests
// about expiry see it (they apply ShortLease or set their own). Each map of set is applied on top, in
// order; the result is a new map, which the caller may change.
func (b *Bundle) FastEnv(set ...map[string]string) map[string]string {
	env := map[string]string{
		"PULSE_MONGODB_URI":  b.URI,
		"PULSE_DATABASE":     b.DBName,
		"PULSE_LISTEN":       "127.0.0.1:0",
		"PULSE_LOCK_TIMEOUT": LongLease,
		// A publish's database work is bounded by PULSE_DATABASE_TIMEOUT (5 s by default): an array of a
		// hundred events on a test database shared with other tests beside CPU burners can take longer, so
		// tests get a bound as long as LongLease; the tests about an unanswering database set their own.
		"PULSE_DATABASE_TIMEOUT": LongLease,
		"PULSE_POLL_INTERVAL":    "50ms",
		"PULSE_LOG_LEVEL":        "info",
		"PULSE_SHUTDOWN_TIMEOUT": "5s",
	}
	for _, m := range set {
		maps.Copy(env, m)
	}
	return env
}

// Sidecar is one in-process sidecar started with Bundle.Start (package sidecar, as `pulse serve` starts it).
type Sidecar struct {
	URL  string
	Logs *testdb.SyncBuffer
	// Stop shuts the sidecar down and waits for it, failing the test if it exited with an error; it is safe
	// twice (t.Cleanup calls it too). Nil for sidecars not started by Bundle.Start (Process.Sidecar).
	Stop func()
}

// Start runs a sidecar in-process with env (package sidecar, as `pulse serve` runs it) and returns once it
// listens; it is stopped in t.Cleanup. The test hooks env sets (PULSE_TEST_CLOCK_SKEW,
// PULSE_TEST_CRASH_AFTER_PUBLISH) reach it as sidecar.TestHooks, in any build.
func (b *Bundle) Start(env map[string]string) *Sidecar {
	b.T.Helper()
	getenv := func(k string) string { return env[k] }
	hooks, err := sidecar.ParseTestHooks(getenv)
	if err != nil {
		b.T.Fatal(err)
	}
	cfg, err := config.Load(getenv)
	if err != nil {
		b.T.Fatal(err)
	}
	logs := &testdb.SyncBuffer{}
	s := sidecar.New(cfg, sidecar.Options{Logs: logs, TestHooks: hooks})
	if err := s.Start(context.Background()); err != nil {
		b.T.Fatalf("sidecar did not start: %v\n%s", err, logs.String())
	}
	stop := sync.OnceFunc(func() {
		s.Stop()
		if err := s.Wait(); err != nil {
			b.T.Errorf("sidecar exited with %v", err)
		}
	})
	b.T.Cleanup(stop)
	return &Sidecar{URL: "http://" + s.Addr(), Logs: logs, Stop: stop}
}

// StartError starts a sidecar in-process with env as `pulse serve` starts one (config.Load, then
// sidecar.Start) and returns the error that stopped the start; a sidecar that starts is stopped at once and
// StartError returns nil. It blocks while the sidecar starts.
func StartError(ctx context.Context, env map[string]string) error {
	cfg, err := config.Load(func(k string) string { return env[k] })
	if err != nil {
		return err
	}
	s := sidecar.New(cfg, sidecar.Options{})
	if err := s.Start(ctx); err != nil {
		return err
	}
	s.Stop()
	return nil
}

// Get decodes the JSON answer of GET url into a T; it fails t unless the answer is 200.
func Get[T any](t *testing.T, url string) T {
	t.Helper()
	var out T
	if code := Do(t, "GET", url, nil, &out); code != 200 {
		t.Fatalf("GET %s answered %d", url, code)
	}
	return out
}

// Do sends a JSON request and decodes a JSON answer into out (when non-nil); it returns the status.
func Do(t *testing.T, method, url string, body any, out any) int {
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

// Receiver is a fake webhook receiver that records every POST and answers with the next status of a script
// (the last status repeats).
type Receiver struct {
	*httptest.Server
	Mu       sync.Mutex
	Got      []Received
	Statuses []int
	Headers  map[string]string
	Notify   chan struct{}
}

type Received struct {
	Header http.Header
	Body   []byte
	At     time.Time
}

func NewReceiver(t *testing.T, statuses ...int) *Receiver {
	if len(statuses) == 0 {
		statuses = []int{200}
	}
	r := &Receiver{Statuses: statuses, Notify: make(chan struct{}, 1000)}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		r.Mu.Lock()
		n := len(r.Got)
		r.Got = append(r.Got, Received{Header: req.Header.Clone(), Body: body, At: time.Now()})
		status := r.Statuses[min(n, len(r.Statuses)-1)]
		for k, v := range r.Headers {
			w.Header().Set(k, v)
		}
		r.Mu.Unlock()
		w.WriteHeader(status)
		r.Notify <- struct{}{}
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *Receiver) Received() []Received {
	r.Mu.Lock()
	defer r.Mu.Unlock()
	return append([]Received(nil), r.Got...)
}

// WantPOSTs fails the test unless the receiver got exactly want POSTs; why, when not empty, ends the message.
func (r *Receiver) WantPOSTs(t *testing.T, want int, why string) {
	t.Helper()
	if n := len(r.Received()); n != want {
		if why != "" {
			why = " " + why
		}
		t.Fatalf("the receiver got %d POSTs, want %d%s", n, want, why)
	}
}

// HoldingReceiver is a receiver that holds every POST until the test lets it go, then answers status: each
// value sent on release lets one POST go, letGo lets every one go from then on (t.Cleanup calls it too, before
// the server closes). It counts the POSTs it holds; arrived gets one signal per POST.
type HoldingReceiver struct {
	*Receiver
	Release chan struct{}
	arrived chan struct{}
	LetGo   func() // safe twice
	mu      sync.Mutex
	now     int
	most    int
}

func NewHoldingReceiver(t *testing.T, status int) *HoldingReceiver {
	h := &HoldingReceiver{Receiver: NewReceiver(t, status), Release: make(chan struct{}), arrived: make(chan struct{}, 1000)}
	h.LetGo = sync.OnceFunc(func() { close(h.Release) })
	t.Cleanup(h.LetGo) // runs before the server closes (cleanups run last-in first-out)
	h.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.Receiver.Mu.Lock()
		h.Got = append(h.Got, Received{Header: r.Header.Clone(), At: time.Now()})
		h.Receiver.Mu.Unlock()
		h.mu.Lock()
		h.now++
		h.most = max(h.most, h.now)
		h.mu.Unlock()
		h.arrived <- struct{}{}
		select {
		case <-h.Release:
		case <-r.Context().Done():
		}
		h.mu.Lock()
		h.now--
		h.mu.Unlock()
		w.WriteHeader(status)
	})
	return h
}

// Held returns how many POSTs the receiver holds now, and the most it held at once.
func (h *HoldingReceiver) Held() (now, most int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.now, h.most
}

func (h *HoldingReceiver) WaitArrival(t *testing.T) {
	t.Helper()
	select {
	case <-h.arrived:
	case <-time.After(20 * time.Second):
		t.Fatal("no POST arrived within 20s")
	}
}

type AttemptView struct {
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

type DeliveryView struct {
	ID            string        `json:"id"`
	EventID       string        `json:"eventId"`
	ConsumerGroup string        `json:"consumerGroup"`
	Status        string        `json:"status"`
	Attempts      []AttemptView `json:"attempts"`
	Error         *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

type EventView struct {
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

// RegisterEndpoint PUTs an endpoint and fails the test unless it answers 200 or 201.
func (s *Sidecar) RegisterEndpoint(t *testing.T, group string, body map[string]any) {
	t.Helper()
	if code := Do(t, "PUT", s.URL+"/v1/endpoints/"+group, body, nil); code != 201 && code != 200 {
		t.Fatalf("PUT endpoint %s answered %d", group, code)
	}
}

// DeleteEndpoint DELETEs an endpoint and fails the test unless it answers 204.
func (s *Sidecar) DeleteEndpoint(t *testing.T, group string) {
	t.Helper()
	if code := Do(t, "DELETE", s.URL+"/v1/endpoints/"+group, nil, nil); code != 204 {
		t.Fatalf("DELETE endpoint %s answered %d", group, code)
	}
}

// Publish POSTs one event and returns its id.
func (s *Sidecar) Publish(t *testing.T, topic string, data any) string {
	t.Helper()
	var out struct {
		ID string `json:"id"`
	}
	if code := Do(t, "POST", s.URL+"/v1/events", map[string]any{"topic": topic, "data": data}, &out); code != 202 {
		t.Fatalf("publish answered %d", code)
	}
	return out.ID
}

// WaitDelivery waits until the event's delivery to group is terminal and returns it.
func (s *Sidecar) WaitDelivery(t *testing.T, eventID, group string, timeout time.Duration) DeliveryView {
	t.Helper()
	var d DeliveryView
	testwait.Eventually(t, timeout, "delivery of "+eventID+" to "+group+" to end", func() bool {
		var ev EventView
		if Do(t, "GET", s.URL+"/v1/events/"+eventID, nil, &ev) != 200 {
			return false
		}
		for _, x := range ev.Deliveries {
			if x.ConsumerGroup == group && x.Status != "pending" {
				Do(t, "GET", s.URL+"/v1/deliveries/"+x.ID, nil, &d)
				return d.Status != "pending"
			}
		}
		return false
	})
	return d
}

// WantSuccess waits for the delivery of each event to group and fails t unless every one ends in success.
func (s *Sidecar) WantSuccess(t *testing.T, group string, timeout time.Duration, eventIDs ...string) {
	t.Helper()
	for _, id := range eventIDs {
		if d := s.WaitDelivery(t, id, group, timeout); d.Status != "success" {
			t.Fatalf("delivery of %s to %s = %+v, want success", id, group, d)
		}
	}
}

// WantErrorAfter fails t unless d ended in error after n attempts and attempt i (from 1) failed with an error
// whose message contains msg.
func WantErrorAfter(t *testing.T, d DeliveryView, n, i int, msg string) {
	t.Helper()
	if d.Status != "error" || len(d.Attempts) != n {
		t.Fatalf("delivery = %+v, want error after %d attempts", d, n)
	}
	if e := d.Attempts[i-1].Error; e == nil || !strings.Contains(e.Message, msg) {
		t.Fatalf("attempt %d error = %+v, want one saying %q", i, e, msg)
	}
}

// Count returns the number of documents in <prefix>.<coll> of the test database.
func (b *Bundle) Count(coll string, filter bson.M) int64 {
	b.T.Helper()
	n, err := b.Client.Database(b.DBName).Collection("pulse."+coll).CountDocuments(context.Background(), filter)
	if err != nil {
		b.T.Fatalf("count %s: %v", coll, err)
	}
	return n
}
