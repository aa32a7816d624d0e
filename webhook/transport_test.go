package webhook

import (
	"bytes"
	"context"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

func TestSendReceiverNeverAnswers(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, func(_ http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	client := New(Options{})

	req := newRequest(rc.URL)
	req.Timeout = 200 * time.Millisecond
	start := time.Now()
	res := client.Send(t.Context(), req)
	elapsed := time.Since(start)
	if res.Outcome != OutcomeRetry || res.HTTPStatus != 0 || res.Message != "timeout after 200ms" {
		t.Errorf("got %v %d %q, want retry 0 %q", res.Outcome, res.HTTPStatus, res.Message, "timeout after 200ms")
	}
	if elapsed < req.Timeout || elapsed > req.Timeout+2*time.Second {
		t.Errorf("Send took %v, want about %v", elapsed, req.Timeout)
	}
}

func TestSendBodyCutByDeadline(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "partial")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	client := New(Options{})

	req := newRequest(rc.URL)
	req.Timeout = 200 * time.Millisecond
	res := client.Send(t.Context(), req)
	want := "HTTP 200 OK (response body incomplete: timeout after 200ms)"
	if res.Outcome != OutcomeSuccess || res.HTTPStatus != 200 || res.Body != "partial" || res.Message != want {
		t.Errorf("got %+v, want success 200 %q %q", res, "partial", want)
	}
}

func TestSendEndlessBody(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		chunk := bytes.Repeat([]byte("x"), 32<<10)
		for r.Context().Err() == nil {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	})
	client := New(Options{})

	req := newRequest(rc.URL)
	req.Timeout = 30 * time.Second
	res := client.Send(t.Context(), req)
	if res.Outcome != OutcomeRetry || res.Message != "HTTP 503 Service Unavailable" || len(res.Body) != MaxBodyBytes {
		t.Errorf("got %v %q len(Body)=%d, want retry, no body error, %d bytes", res.Outcome, res.Message,
			len(res.Body), MaxBodyBytes)
	}
	if res.Duration >= req.Timeout/2 {
		t.Errorf("Duration = %v, want well under the %v deadline", res.Duration, req.Timeout)
	}
}

func TestSendReusesConnections(t *testing.T) {
	t.Parallel()
	var conns atomic.Int32
	rc := &receiver{got: make(chan received, 64)}
	rc.Server = httptest.NewUnstartedServer(rc.wrap(func(w http.ResponseWriter, _ *http.Request) {
		w.Write(bytes.Repeat([]byte("y"), 20<<10)) // past the kept 4 KiB, within the drain budget
	}))
	rc.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	rc.Start()
	t.Cleanup(rc.Close)
	client := New(Options{})

	for range 5 {
		if res := client.Send(t.Context(), newRequest(rc.URL)); res.Outcome != OutcomeSuccess {
			t.Fatalf("Send = %+v", res)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("server saw %d connections for 5 sequential sends, want 1", n)
	}
}

func TestSendConnectionRefused(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()

	res := New(Options{}).Send(t.Context(), newRequest(url))
	if res.Outcome != OutcomeRetry || res.HTTPStatus != 0 || res.Message != "connection refused" {
		t.Errorf("got %v %d %q, want retry 0 %q", res.Outcome, res.HTTPStatus, res.Message, "connection refused")
	}
}

func TestSendCanceledByCaller(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, func(_ http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	ctx, cancel := context.WithCancel(t.Context())
	cancel()

	res := New(Options{}).Send(ctx, newRequest(rc.URL))
	if res.Outcome != OutcomeRetry || res.Message != "aborted by caller: context canceled" {
		t.Errorf("got %v %q", res.Outcome, res.Message)
	}
}

func TestSendTLS(t *testing.T) {
	t.Parallel()
	rc := &receiver{got: make(chan received, 64)}
	rc.Server = httptest.NewUnstartedServer(rc.wrap(func(http.ResponseWriter, *http.Request) {}))
	rc.EnableHTTP2 = true
	rc.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshake is expected
	rc.StartTLS()                                   // self-signed certificate
	t.Cleanup(rc.Close)
	var logs bytes.Buffer
	client := New(Options{Logger: zerolog.New(&logs)})

	res := client.Send(t.Context(), newRequest(rc.URL))
	if res.Outcome != OutcomeRetry || !strings.HasPrefix(res.Message, "TLS certificate verification failed: ") {
		t.Errorf("verified send to self-signed server: got %v %q, want retry with a TLS message", res.Outcome, res.Message)
	}
	if logs.Len() != 0 {
		t.Errorf("unexpected log output: %s", logs.String())
	}

	req := newRequest(rc.URL)
	req.InsecureSkipVerify = true
	res = client.Send(t.Context(), req)
	if res.Outcome != OutcomeSuccess {
		t.Fatalf("insecure send: %+v", res)
	}
	if got := rc.next(t); got.ProtoMaj != 2 {
		t.Errorf("protocol HTTP/%d, want HTTP/2 over https", got.ProtoMaj)
	}
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], `"level":"warn"`) || !strings.Contains(lines[0], `"component":"webhook"`) {
		t.Errorf("want one warn line, got %q", logs.String())
	}

	// The verified pool must not pick up the connection made without verification.
	if res := client.Send(t.Context(), newRequest(rc.URL)); res.Outcome != OutcomeRetry {
		t.Errorf("verified send after an insecure one: got %v %q, want retry", res.Outcome, res.Message)
	}
}

// A receiver that closes a reused keep-alive connection without answering must not get the request twice:
// Go's transport replays a request carrying Idempotency-Key on a fresh connection unless it is made
// non-replayable. One POST on the wire is one attempt.
func TestSendNeverReplaysSilently(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	rc := newReceiver(t, func(w http.ResponseWriter, _ *http.Request) {
		if calls.Add(1) == 2 { // the second request arrives on the kept-alive connection: drop it unanswered
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close()
			}
		}
	})
	c := New(Options{})
	if res := c.Send(t.Context(), newRequest(rc.URL)); res.Outcome != OutcomeSuccess {
		t.Fatalf("first send = %+v, want success", res)
	}
	res := c.Send(t.Context(), newRequest(rc.URL))
	if got := calls.Load(); got != 2 {
		t.Fatalf("receiver got %d requests for 2 sends, want 2 (no silent resend)", got)
	}
	if res.Outcome != OutcomeRetry || res.HTTPStatus != 0 {
		t.Fatalf("second send = %v %d %q, want a failed attempt to retry by policy", res.Outcome, res.HTTPStatus, res.Message)
	}
}
