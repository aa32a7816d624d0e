package httpapi_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/pulse-sidecar/pulse/httpapi"
)

// browserServer serves the API on answerStore, with the Host check of a loopback listener when checkHost.
func browserServer(t *testing.T, checkHost bool, allowed ...string) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(httpapi.New(answerStore{}, nopNotifier{}, httpapi.Options{MaxBodyBytes: 1 << 20, Logger: zerolog.Nop(),
		CheckHost: checkHost, AllowedHosts: allowed}).Handler())
	t.Cleanup(srv.Close)
	return srv
}

// send makes one request with the given headers ("Host" sets the request's Host) and returns the status, the
// answer's error code (or its body's first 40 bytes) and its Allow header.
func send(t *testing.T, srv *httptest.Server, method, path, body string, header map[string]string) (int, string, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	text := string(raw)
	if _, code, ok := strings.Cut(text, `"code":"`); ok {
		text, _, _ = strings.Cut(code, `"`)
	} else if len(text) > 40 {
		text = text[:40]
	}
	return resp.StatusCode, text, resp.Header.Get("Allow")
}

// On a loopback listener a request naming any other DNS name as its Host is refused before any route runs,
// probes and console included: a page whose own name resolves to 127.0.0.1 (DNS rebinding) is same-origin in
// the browser and is told apart by its Host alone. IP addresses, localhost and *.localhost pass, as do the
// names of PULSE_ALLOWED_HOSTS; without the check (a listener beyond loopback) any Host passes.
func TestAPIRefusesHostsThatAreNotLoopbackNames(t *testing.T) {
	t.Parallel()
	srv := browserServer(t, true, "pulse")
	for _, c := range []struct {
		host string
		want int
	}{
		{"evil.example", 403}, {"evil.example:8080", 403}, {"127.0.0.1.nip.io:8080", 403}, {"localhost.evil.example", 403},
		{"127.0.0.1:8080", 200}, {"[::1]:8080", 200}, {"localhost:8080", 200}, {"LOCALHOST.", 200}, {"app.localhost:3000", 200},
		{"10.1.2.3", 200}, {"pulse:8080", 200}, {"PULSE", 200},
	} {
		for _, path := range []string{"/healthz", "/ui/", "/v1/endpoints/billing"} {
			status, code, _ := send(t, srv, "GET", path, "", map[string]string{"Host": c.host})
			if status != c.want || (c.want == 403 && code != "host_not_allowed") {
				t.Errorf("GET %s with Host %s = %d %s, want %d", path, c.host, status, code, c.want)
			}
		}
	}
	open := browserServer(t, false)
	if status, code, _ := send(t, open, "GET", "/v1/endpoints/billing", "", map[string]string{"Host": "pulse.default.svc"}); status != 200 {
		t.Errorf("without the Host check, Host pulse.default.svc = %d %s, want 200", status, code)
	}
}

// A request a browser marks as made for a page of another origin is refused, reads included, whatever the
// route: by Sec-Fetch-Site (cross-site and same-site, which covers another port of localhost), or without it
// by an Origin that is not the request's own. The console's own calls (same-origin), a typed URL (none) and
// non-browser clients (neither header) pass, and so does a navigation to the console's static files.
func TestAPIRefusesCrossOriginRequests(t *testing.T) {
	t.Parallel()
	srv := browserServer(t, true)
	self := strings.TrimPrefix(srv.URL, "http://")
	refused := []struct {
		method, path string
		header       map[string]string
	}{
		{"POST", "/v1/endpoints/billing/pause", map[string]string{"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"}},
		{"POST", "/v1/endpoints/billing/resume", map[string]string{"Sec-Fetch-Site": "same-site"}},
		{"POST", "/v1/deliveries/dlv-failed/retry", map[string]string{"Origin": "http://localhost:3000"}},
		{"POST", "/v1/deliveries/dlv-pending/cancel", map[string]string{"Origin": "null"}},
		{"DELETE", "/v1/endpoints/billing", map[string]string{"Sec-Fetch-Site": "cross-site"}},
		{"GET", "/v1/endpoints", map[string]string{"Sec-Fetch-Site": "cross-site"}},
		{"GET", "/v1/events/evt-1", map[string]string{"Origin": "http://evil.example"}},
		{"GET", "/metrics", map[string]string{"Sec-Fetch-Site": "same-site"}},
		{"GET", "/healthz", map[string]string{"Sec-Fetch-Site": "cross-site"}},
		{"POST", "/ui/", map[string]string{"Sec-Fetch-Site": "cross-site"}},
	}
	for _, c := range refused {
		if status, code, _ := send(t, srv, c.method, c.path, "", c.header); status != 403 || code != "cross_origin_request" {
			t.Errorf("%s %s with %v = %d %s, want 403 cross_origin_request", c.method, c.path, c.header, status, code)
		}
	}
	allowed := []struct {
		method, path string
		header       map[string]string
		want         int
	}{
		{"POST", "/v1/endpoints/billing/resume", map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": srv.URL}, 200},
		{"POST", "/v1/endpoints/billing/resume", map[string]string{"Origin": srv.URL, "Host": self}, 200},
		{"GET", "/v1/endpoints", map[string]string{"Sec-Fetch-Site": "none"}, 200},
		{"POST", "/v1/endpoints/billing/resume", nil, 200},
		{"GET", "/ui/", map[string]string{"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}, 200},
		{"GET", "/ui/app.js", map[string]string{"Sec-Fetch-Site": "same-origin"}, 200},
	}
	for _, c := range allowed {
		if status, code, _ := send(t, srv, c.method, c.path, "", c.header); status != c.want {
			t.Errorf("%s %s with %v = %d %s, want %d", c.method, c.path, c.header, status, code, c.want)
		}
	}
}

// A body is read only with its documented media type: application/json for every /v1 route that takes one
// (publish also takes the CloudEvents types), 415 otherwise, a missing Content-Type included, since a page can
// send text/plain, a form or an untyped body without a preflight. A request without a body needs none.
func TestAPIReadsBodiesOnlyWithTheirMediaType(t *testing.T) {
	t.Parallel()
	srv := browserServer(t, false)
	routes := []struct{ method, path, body string }{
		{"POST", "/v1/events", `{"topic":"t","data":1}`},
		{"PUT", "/v1/endpoints/fresh", `{"url":"https://h.example/","topics":["t"]}`},
		{"POST", "/v1/endpoints/billing/rotate-secret", `{"overlap":"0s"}`},
		{"POST", "/v1/endpoints/billing/replay", `{}`},
		{"POST", "/v1/endpoints/billing/pause", `{}`},
		{"POST", "/v1/deliveries/dlv-failed/retry", `{}`},
		{"POST", "/v1/deliveries/dlv-pending/cancel", `{}`},
	}
	for _, r := range routes {
		for _, ct := range []string{"", "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/jsonx"} {
			if status, code, _ := send(t, srv, r.method, r.path, r.body, map[string]string{"Content-Type": ct}); status != 415 || code != "unsupported_media_type" {
				t.Errorf("%s %s with Content-Type %q = %d %s, want 415 unsupported_media_type", r.method, r.path, ct, status, code)
			}
		}
	}
	for _, r := range []struct{ method, path string }{{"POST", "/v1/endpoints/billing/pause"}, {"POST", "/v1/deliveries/dlv-failed/retry"}} {
		if status, code, _ := send(t, srv, r.method, r.path, "", nil); status != 200 && status != 202 {
			t.Errorf("%s %s without a body = %d %s, want 200 or 202", r.method, r.path, status, code)
		}
	}
	if status, code, _ := send(t, srv, "PUT", "/v1/endpoints/fresh", routes[1].body, map[string]string{"Content-Type": "application/json; charset=utf-8"}); status != 201 {
		t.Errorf("PUT with application/json; charset=utf-8 = %d %s, want 201", status, code)
	}
}

// A 405 names the methods the path does take in Allow (RFC 9110 §15.5.6); HEAD is answered wherever GET is.
func TestMethodNotAllowedSaysWhatIsAllowed(t *testing.T) {
	t.Parallel()
	srv := browserServer(t, false)
	for _, c := range []struct{ method, path, allow string }{
		{"GET", "/v1/endpoints/billing/pause", "POST"},
		{"GET", "/v1/deliveries/d/retry", "POST"},
		{"PATCH", "/v1/endpoints/billing", "GET, HEAD, PUT, DELETE"},
		{"DELETE", "/v1/events", "POST"},
		{"POST", "/v1/stats", "GET, HEAD"},
		{"POST", "/healthz", "GET, HEAD"},
		{"PUT", "/ui/", "GET, HEAD"},
	} {
		status, code, allow := send(t, srv, c.method, c.path, "", nil)
		if status != 405 || code != "method_not_allowed" || allow != c.allow {
			t.Errorf("%s %s = %d %s Allow %q, want 405 method_not_allowed Allow %q", c.method, c.path, status, code, allow, c.allow)
		}
	}
	for _, path := range []string{"/healthz", "/v1/endpoints", "/v1/stats", "/ui/"} {
		if status, _, _ := send(t, srv, "HEAD", path, "", nil); status != 200 {
			t.Errorf("HEAD %s = %d, want 200", path, status)
		}
	}
}

// A path parameter is read percent-decoded: a client that escapes a character of an id (as URL builders do
// for ':') reaches the same record as one that does not.
func TestPathParametersArePercentDecoded(t *testing.T) {
	t.Parallel()
	srv := browserServer(t, false)
	_, plain, _ := send(t, srv, "GET", "/v1/events/evt-1", "", nil)
	for _, path := range []string{"/v1/events/evt%2D1", "/v1/events/%65vt-1"} {
		if status, got, _ := send(t, srv, "GET", path, "", nil); status != 200 || got != plain {
			t.Errorf("GET %s = %d %q, want 200 %q", path, status, got, plain)
		}
	}
	if status, _, _ := send(t, srv, "GET", "/v1/endpoints/b%69lling", "", nil); status != 200 {
		t.Errorf("GET /v1/endpoints/b%%69lling = %d, want 200", status)
	}
	// Decoded once: an escaped '%' stays a '%' of the id.
	for _, path := range []string{"/v1/events/evt%252D1", "/v1/endpoints/bill%2569ng"} {
		if status, code, _ := send(t, srv, "GET", path, "", nil); status != 404 {
			t.Errorf("GET %s = %d %s, want 404 (the name holds %%)", path, status, code)
		}
	}
}
