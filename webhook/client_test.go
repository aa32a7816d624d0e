package webhook

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

const testSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// received is what a fake receiver recorded about one request.
type received struct {
	Method   string
	Path     string
	ProtoMaj int
	Header   http.Header
	Body     []byte
}

// receiver is a fake webhook endpoint that records every request before handing it to handle.
type receiver struct {
	*httptest.Server
	got chan received
}

func newReceiver(t *testing.T, handle http.HandlerFunc) *receiver {
	t.Helper()
	rc := &receiver{got: make(chan received, 64)}
	rc.Server = httptest.NewServer(rc.wrap(handle))
	t.Cleanup(rc.Close)
	return rc
}

func (rc *receiver) wrap(handle http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rc.got <- received{Method: r.Method, Path: r.URL.Path, ProtoMaj: r.ProtoMajor, Header: r.Header.Clone(), Body: body}
		handle(w, r)
	}
}

// next returns the next recorded request, failing the test if there is none: Send has returned by the time
// this is called, so the handler has already run.
func (rc *receiver) next(t *testing.T) received {
	t.Helper()
	select {
	case g := <-rc.got:
		return g
	default:
		t.Fatal("receiver got no request")
		return received{}
	}
}

func newRequest(url string) Request {
	return Request{
		URL: url, Body: []byte(`{"id":"evt_1","topic":"payment.captured","data":{}}`),
		EventID: "evt_1", Topic: "payment.captured", ConsumerGroup: "billing", DeliveryID: "dlv_1", Attempt: 1,
		Timeout: 5 * time.Second,
	}
}

func TestSendStatus(t *testing.T) {
	t.Parallel()
	var elsewhere atomic.Int32
	rc := newReceiver(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/elsewhere" {
			elsewhere.Add(1)
			return
		}
		code, _ := strconv.Atoi(r.URL.Query().Get("status"))
		if code >= 300 && code < 400 && code != http.StatusNotModified {
			w.Header().Set("Location", "/elsewhere")
		}
		w.WriteHeader(code)
		io.WriteString(w, "answer "+strconv.Itoa(code))
	})
	client := New(Options{})

	tests := []struct {
		status  int
		outcome Outcome
		message string
	}{
		{200, OutcomeSuccess, "HTTP 200 OK"},
		{201, OutcomeSuccess, "HTTP 201 Created"},
		{202, OutcomeSuccess, "HTTP 202 Accepted"},
		{299, OutcomeSuccess, "HTTP 299"},
		{400, OutcomeTerminal, "HTTP 400 Bad Request"},
		{404, OutcomeTerminal, "HTTP 404 Not Found"},
		{405, OutcomeTerminal, "HTTP 405 Method Not Allowed"},
		{410, OutcomeTerminal, "HTTP 410 Gone"},
		{413, OutcomeTerminal, "HTTP 413 Request Entity Too Large"},
		{415, OutcomeTerminal, "HTTP 415 Unsupported Media Type"},
		{422, OutcomeTerminal, "HTTP 422 Unprocessable Entity"},
		{501, OutcomeTerminal, "HTTP 501 Not Implemented"},
		{301, OutcomeRetry, "redirect to " + rc.URL + "/elsewhere not followed"},
		{302, OutcomeRetry, "redirect to " + rc.URL + "/elsewhere not followed"},
		{307, OutcomeRetry, "redirect to " + rc.URL + "/elsewhere not followed"},
		{308, OutcomeRetry, "redirect to " + rc.URL + "/elsewhere not followed"},
		{304, OutcomeRetry, "HTTP 304 Not Modified"},
		{401, OutcomeRetry, "HTTP 401 Unauthorized"},
		{403, OutcomeRetry, "HTTP 403 Forbidden"},
		{408, OutcomeRetry, "HTTP 408 Request Timeout"},
		{409, OutcomeRetry, "HTTP 409 Conflict"},
		{418, OutcomeRetry, "HTTP 418 I'm a teapot"},
		{425, OutcomeRetry, "HTTP 425 Too Early"},
		{429, OutcomeRetry, "HTTP 429 Too Many Requests"},
		{500, OutcomeRetry, "HTTP 500 Internal Server Error"},
		{502, OutcomeRetry, "HTTP 502 Bad Gateway"},
		{503, OutcomeRetry, "HTTP 503 Service Unavailable"},
		{504, OutcomeRetry, "HTTP 504 Gateway Timeout"},
		{599, OutcomeRetry, "HTTP 599"},
	}
	for _, tt := range tests {
		t.Run(strconv.Itoa(tt.status), func(t *testing.T) {
			res := client.Send(t.Context(), newRequest(rc.URL+"/hook?status="+strconv.Itoa(tt.status)))
			if res.Outcome != tt.outcome || res.HTTPStatus != tt.status || res.Message != tt.message {
				t.Errorf("got %v %d %q, want %v %d %q", res.Outcome, res.HTTPStatus, res.Message,
					tt.outcome, tt.status, tt.message)
			}
			if tt.status != http.StatusNotModified && res.Body != "answer "+strconv.Itoa(tt.status) {
				t.Errorf("Body = %q", res.Body)
			}
			if res.Duration <= 0 {
				t.Errorf("Duration = %v, want > 0", res.Duration)
			}
		})
	}
	if n := elsewhere.Load(); n != 0 {
		t.Errorf("redirect target was requested %d times, want 0", n)
	}
}

func TestSendHeadersAndSignature(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, func(http.ResponseWriter, *http.Request) {})
	client := New(Options{UserAgent: "pulse-sidecar/1.2.3"})

	req := newRequest(rc.URL + "/hook")
	// Not canonical JSON on purpose: spacing, escapes, a raw U+2028, a trailing newline must all survive.
	req.Body = []byte("{\"id\" : \"evt_1\",\n \"data\": {\"s\":\"\\u00e9\u2028\"} }\n")
	req.Attempt = 3
	req.Secret = testSecret
	req.Headers = map[string]string{
		"X-Env":             "prod",
		"idempotency-key":   "forged",
		"Webhook-Signature": "v1,forged",
		"PULSE-ATTEMPT":     "99",
		"Content-Type":      "text/plain",
		"User-Agent":        "forged",
	}
	res := client.Send(t.Context(), req)
	if res.Outcome != OutcomeSuccess {
		t.Fatalf("Send = %+v", res)
	}
	got := rc.next(t)
	if got.Method != http.MethodPost {
		t.Errorf("method = %s", got.Method)
	}
	if !bytes.Equal(got.Body, req.Body) {
		t.Errorf("body = %q, want %q", got.Body, req.Body)
	}
	want := map[string]string{
		"Content-Type":         "application/json",
		"Idempotency-Key":      "evt_1",
		"webhook-id":           "evt_1",
		"Pulse-Topic":          "payment.captured",
		"Pulse-Consumer-Group": "billing",
		"Pulse-Delivery-Id":    "dlv_1",
		"Pulse-Attempt":        "3",
		"User-Agent":           "pulse-sidecar/1.2.3",
		"X-Env":                "prod",
	}
	for name, value := range want {
		if vs := got.Header.Values(name); len(vs) != 1 || vs[0] != value {
			t.Errorf("header %s = %q, want [%q]", name, vs, value)
		}
	}
	ts, err := strconv.ParseInt(got.Header.Get("webhook-timestamp"), 10, 64)
	if err != nil || time.Since(time.Unix(ts, 0)).Abs() > time.Minute {
		t.Errorf("webhook-timestamp = %q, want about now", got.Header.Get("webhook-timestamp"))
	}
	wh, err := standardwebhooks.NewWebhook(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	if err := wh.Verify(got.Body, got.Header); err != nil {
		t.Errorf("signature %q does not verify: %v", got.Header.Get("webhook-signature"), err)
	}
}

func TestSendUnsignedFixedTimestamp(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, func(http.ResponseWriter, *http.Request) {})
	client := New(Options{})

	req := newRequest(rc.URL)
	req.Timestamp = time.Unix(1700000000, 999)
	req.Attempt = 0
	req.Headers = map[string]string{"webhook-signature": "v1,forged"}
	if res := client.Send(t.Context(), req); res.Outcome != OutcomeSuccess {
		t.Fatalf("Send = %+v", res)
	}
	got := rc.next(t)
	if v := got.Header.Values("webhook-signature"); len(v) != 0 {
		t.Errorf("webhook-signature = %q, want none without a secret", v)
	}
	if v := got.Header.Get("webhook-timestamp"); v != "1700000000" {
		t.Errorf("webhook-timestamp = %q", v)
	}
	if v := got.Header.Get("Pulse-Attempt"); v != "1" {
		t.Errorf("Pulse-Attempt = %q, want 1 for a zero Attempt", v)
	}
	if v := got.Header.Get("User-Agent"); v != DefaultUserAgent {
		t.Errorf("User-Agent = %q", v)
	}
}

func TestSendRetryAfter(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", r.URL.Query().Get("ra"))
		code, _ := strconv.Atoi(r.URL.Query().Get("status"))
		w.WriteHeader(code)
	})
	client := New(Options{})

	inAnHour := time.Now().Add(time.Hour).UTC().Format(http.TimeFormat)
	tests := []struct {
		name     string
		status   int
		value    string
		min, max time.Duration
	}{
		{"seconds on 503", 503, "120", 120 * time.Second, 120 * time.Second},
		{"date on 429", 429, inAnHour, 58 * time.Minute, time.Hour},
		{"past date", 503, "Sun, 06 Nov 1994 08:49:37 GMT", 0, 0},
		{"garbage", 503, "soon", 0, 0},
		{"negative", 429, "-5", 0, 0},
		{"terminal status ignores it", 413, "120", 0, 0},
		{"success ignores it", 200, "120", 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			url := rc.URL + "/?status=" + strconv.Itoa(tt.status) + "&ra=" + strings.ReplaceAll(tt.value, " ", "%20")
			res := client.Send(t.Context(), newRequest(url))
			if res.HTTPStatus != tt.status || res.RetryAfter < tt.min || res.RetryAfter > tt.max {
				t.Errorf("got status %d RetryAfter %v, want %d in [%v, %v]", res.HTTPStatus, res.RetryAfter,
					tt.status, tt.min, tt.max)
			}
		})
	}
}

func TestSendInvalidRequest(t *testing.T) {
	t.Parallel()
	client := New(Options{})
	tests := []struct {
		name    string
		edit    func(*Request)
		message string
	}{
		{"scheme", func(r *Request) { r.URL = "ftp://example.com/x" }, `invalid request: URL scheme must be http or https, not "ftp"`},
		{"no host", func(r *Request) { r.URL = "http:///path" }, "invalid request: URL has no host"},
		{"unparsable", func(r *Request) { r.URL = "http://user:pw@[::1" }, "invalid request: URL does not parse: missing ']' in host"},
		{"event id", func(r *Request) { r.EventID = "" }, "invalid request: event id is empty"},
		{"secret", func(r *Request) { r.Secret = "whsec_!!!" }, "invalid request: secret is not base64 after the whsec_ prefix"},
		{"empty secret", func(r *Request) { r.Secret = "whsec_" }, "invalid request: secret is empty after the whsec_ prefix"},
		{"header name", func(r *Request) { r.Headers = map[string]string{"X Bad": "v"} }, `invalid request: endpoint header name "X Bad" is not a valid token`},
		{"header value", func(r *Request) { r.Headers = map[string]string{"X-A": "a\r\nX-B: b"} }, `invalid request: endpoint header "X-A" has a control character in its value`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := newRequest("http://127.0.0.1:1/hook")
			tt.edit(&req)
			res := client.Send(t.Context(), req)
			if res.Outcome != OutcomeTerminal || res.Message != tt.message {
				t.Errorf("got %v %q, want terminal %q", res.Outcome, res.Message, tt.message)
			}
		})
	}
}

func BenchmarkSend(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, `{"ok":true}`)
	}))
	defer srv.Close()
	client := New(Options{UserAgent: "pulse-sidecar/bench"})
	req := newRequest(srv.URL + "/hook")
	req.Secret = testSecret
	req.Headers = map[string]string{"X-Env": "bench"}
	b.ReportAllocs()
	for b.Loop() {
		if res := client.Send(b.Context(), req); res.Outcome != OutcomeSuccess {
			b.Fatalf("Send = %+v", res)
		}
	}
}
