package e2e

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pulse-sidecar/pulse/e2e/internal/harness"
	"github.com/pulse-sidecar/pulse/internal/testwait"
)

// SIGTERM with a POST in flight: publishes answer 503, the POST finishes and is recorded (success, one
// attempt), and the process exits 0.
func TestSIGTERMLetsInFlightDeliveryFinish(t *testing.T) {
	b := harness.Setup(t)
	p := b.StartProcess(b.FastEnv(map[string]string{"PULSE_SHUTDOWN_TIMEOUT": "20s"}))
	s := p.Sidecar()
	rcv := newBlockingReceiver(t)
	s.RegisterEndpoint(t, "g", map[string]any{"url": rcv.URL, "topics": []string{"t"}})
	id := s.Publish(t, "t", 1)
	waitClosed(t, rcv.started, 20*time.Second, "the first POST")
	if err := p.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 30*time.Second, "publishes to answer 503", func() bool {
		resp, err := http.Post(s.URL+"/v1/events", "application/json", strings.NewReader(`{"topic":"t","data":2}`))
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusServiceUnavailable
	})
	rcv.answer <- 200
	waitClosed(t, p.Done, 20*time.Second, "the process to exit")
	if code := p.Cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("exit code %d after SIGTERM:\n%s", code, p.Logs.String())
	}
	var d harness.DeliveryView
	q := b.Start(b.FastEnv()) // read the outcome through another sidecar
	d = q.WaitDelivery(t, id, "g", 30*time.Second)
	if d.Status != "success" || len(d.Attempts) != 1 {
		t.Fatalf("delivery = %+v, want success with one attempt", d)
	}
}

// PULSE_API_TOKEN guards /v1 (401 without the bearer token); /healthz, /readyz and /metrics stay open, and
// /metrics counts what happened.
func TestAuthAndMetrics(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv(map[string]string{"PULSE_API_TOKEN": "s3cret-token"}))
	rcv := harness.NewReceiver(t, 200)
	for _, path := range []string{"/v1/endpoints", "/v1/events/x", "/v1/deliveries"} {
		var e struct{ Error struct{ Code string } }
		if code := harness.Do(t, "GET", s.URL+path, nil, &e); code != 401 || e.Error.Code != "unauthorized" {
			t.Errorf("GET %s without token = %d %+v", path, code, e)
		}
	}
	authed := func(method, path, body string) *http.Response {
		req, _ := http.NewRequest(method, s.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer s3cret-token")
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() }) // frees the connection before the leak check
		return resp
	}
	if resp := authed("PUT", "/v1/endpoints/g", `{"url":"`+rcv.URL+`","topics":["t"],"secret":"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}`); resp.StatusCode != 201 {
		t.Fatalf("PUT with token = %d", resp.StatusCode)
	}
	resp := authed("GET", "/v1/endpoints/g", "")
	body, _ := io.ReadAll(resp.Body)
	if strings.Contains(string(body), "MfKQ9r8GKYqrTwjUPD8ILPZIo2La") || !strings.Contains(string(body), "whsec_") {
		t.Fatalf("GET endpoint shows the secret: %s", body)
	}
	if resp := authed("POST", "/v1/events", `{"topic":"t","data":1}`); resp.StatusCode != 202 {
		t.Fatalf("publish with token = %d", resp.StatusCode)
	}
	testwait.Eventually(t, 20*time.Second, "the POST", func() bool { return len(rcv.Received()) == 1 })
	if sig := rcv.Received()[0].Header.Get("Webhook-Signature"); !strings.HasPrefix(sig, "v1,") {
		t.Fatalf("webhook-signature = %q", sig)
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if code := harness.Do(t, "GET", s.URL+path, nil, nil); code != 200 {
			t.Errorf("GET %s = %d", path, code)
		}
	}
	testwait.Eventually(t, 20*time.Second, "metrics to count the delivery", func() bool {
		resp, err := http.Get(s.URL + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		m, _ := io.ReadAll(resp.Body)
		return resp.StatusCode == 200 && strings.Contains(string(m), "pulse_events_published_total 1\n") &&
			strings.Contains(string(m), `pulse_attempts_total{consumer_group="g",outcome="success"} 1`) &&
			strings.Contains(string(m), `pulse_attempt_duration_seconds_count{consumer_group="g"} 1`)
	})
}

// A terminal delivery can be retried (409 while pending); replay re-opens a consumer group's failed
// deliveries; the list pages newest first with filters.
func TestInspectRetryAndReplay(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv())
	rcv := harness.NewReceiver(t, 422, 422, 422, 200)
	s.RegisterEndpoint(t, "g", map[string]any{"url": rcv.URL, "topics": []string{"t"}})
	var ids []string
	for i := range 3 {
		ids = append(ids, s.Publish(t, "t", i))
	}
	var d harness.DeliveryView
	for _, id := range ids {
		d = s.WaitDelivery(t, id, "g", 20*time.Second)
		if d.Status != "error" {
			t.Fatalf("delivery = %+v, want error", d)
		}
	}
	var page struct {
		Deliveries []struct{ ID, Status, ConsumerGroup string }
		Next       string
	}
	if code := harness.Do(t, "GET", s.URL+"/v1/deliveries?consumerGroup=g&status=error&limit=2", nil, &page); code != 200 || len(page.Deliveries) != 2 || page.Next == "" {
		t.Fatalf("first page = %d %+v", code, page)
	}
	first := append([]struct{ ID, Status, ConsumerGroup string }(nil), page.Deliveries...)
	page.Deliveries = nil
	if code := harness.Do(t, "GET", s.URL+"/v1/deliveries?consumerGroup=g&status=error&limit=2&after="+page.Next, nil, &page); code != 200 || len(page.Deliveries) != 1 || page.Next != "" {
		t.Fatalf("second page = %d %+v", code, page)
	}
	if page.Deliveries[0].ID == first[0].ID || page.Deliveries[0].ID == first[1].ID {
		t.Fatalf("pages overlap: %+v then %+v", first, page.Deliveries)
	}
	if code := harness.Do(t, "GET", s.URL+"/v1/deliveries?after=garbage", nil, nil); code != 400 {
		t.Fatalf("bad cursor = %d, want 400", code)
	}

	var retried struct{ Attempt int }
	if code := harness.Do(t, "POST", s.URL+"/v1/deliveries/"+d.ID+"/retry", nil, &retried); code != 202 || retried.Attempt != 2 {
		t.Fatalf("retry = %d %+v", code, retried)
	}
	d = s.WaitDelivery(t, d.EventID, "g", 20*time.Second)
	if d.Status != "success" || len(d.Attempts) != 2 {
		t.Fatalf("retried delivery = %+v, want success on attempt 2", d)
	}
	var replay struct{ Replayed int }
	if code := harness.Do(t, "POST", s.URL+"/v1/endpoints/g/replay", map[string]any{"status": "error"}, &replay); code != 200 || replay.Replayed != 2 {
		t.Fatalf("replay = %d %+v, want 2 reopened", code, replay)
	}
	s.WantSuccess(t, "g", 20*time.Second, ids[:2]...)
	if code := harness.Do(t, "POST", s.URL+"/v1/deliveries/nope/retry", nil, nil); code != 404 {
		t.Fatalf("retry of unknown delivery = %d", code)
	}
}

// PULSE_ENDPOINTS_FILE registers endpoints at start and again when the file changes; an invalid entry stops
// the start naming it.
func TestEndpointsFile(t *testing.T) {
	b := harness.Setup(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "endpoints.yaml")
	rcv := harness.NewReceiver(t, 200)
	write := func(content string) {
		if err := os.WriteFile(file, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("- consumerGroup: billing\n  url: " + rcv.URL + "\n  topics: [payment.captured]\n")
	env := b.FastEnv()
	env["PULSE_ENDPOINTS_FILE"] = file
	s := b.Start(env)
	var ep struct{ URL string }
	if code := harness.Do(t, "GET", s.URL+"/v1/endpoints/billing", nil, &ep); code != 200 || ep.URL != rcv.URL {
		t.Fatalf("endpoint from file = %d %+v", code, ep)
	}
	write("- consumerGroup: billing\n  url: " + rcv.URL + "/v2\n  topics: [payment.captured]\n")
	testwait.Eventually(t, 20*time.Second, "the changed file to be re-applied", func() bool {
		return harness.Do(t, "GET", s.URL+"/v1/endpoints/billing", nil, &ep) == 200 && ep.URL == rcv.URL+"/v2"
	})

	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("- consumerGroup: ok\n  url: http://x\n  topics: [t]\n- consumerGroup: broken\n  url: ftp://x\n  topics: [t]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env["PULSE_ENDPOINTS_FILE"] = bad
	err := harness.StartError(t.Context(), env)
	if err == nil || !strings.Contains(err.Error(), "entry 2") || !strings.Contains(err.Error(), "broken") || !strings.Contains(err.Error(), "url") {
		t.Fatalf("start with an invalid entry = %v", err)
	}
}

// A bad configuration stops the start with one line naming the variable.
func TestBadConfigurationStopsStart(t *testing.T) {
	t.Parallel()
	err := harness.StartError(t.Context(), map[string]string{"PULSE_LOCK_TIMEOUT": "soon"})
	if err == nil || !strings.Contains(err.Error(), "PULSE_LOCK_TIMEOUT") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("err = %v", err)
	}
}
