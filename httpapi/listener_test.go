package httpapi_test

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/pulse-sidecar/pulse/httpapi"
)

// The answers net/http writes itself, before any handler, are the API's JSON errors on a JSONErrorListener:
// a malformed Host, two Host headers, a header line that does not parse (400 bad_request), headers over the
// limit (431 headers_too_large). The handlers' own answers pass untouched, a plain-text one included.
func TestJSONErrorListener(t *testing.T) {
	t.Parallel()
	srv := httptest.NewUnstartedServer(httpapi.New(answerStore{}, nopNotifier{}, httpapi.Options{Logger: zerolog.Nop()}).Handler())
	srv.Config.MaxHeaderBytes = 1 << 10 // net/http allows 4 KiB above it
	srv.Listener = httpapi.JSONErrorListener(srv.Listener)
	srv.Start()
	t.Cleanup(srv.Close)
	for _, c := range []struct {
		name, request string
		status        int
		code, ctype   string
		message       string // a part of it
	}{
		{"malformed Host", "GET /v1/stats HTTP/1.1\r\nHost: a b\r\n\r\n", 400, "bad_request", "application/json", "malformed Host header"},
		{"two Host headers", "GET /v1/stats HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: 127.0.0.2\r\n\r\n", 400, "bad_request", "application/json", "two Host headers"},
		{"header line without a colon", "GET /v1/stats HTTP/1.1\r\nHost: 127.0.0.1\r\nbroken\r\n\r\n", 400, "bad_request", "application/json", "not valid HTTP"},
		{"headers over the limit", "GET /v1/stats HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + strings.Repeat("x", 8<<10) + "\r\n\r\n", 431, "headers_too_large", "application/json", "larger"},
		{"a route's answer", "GET /v1/stats HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", 200, "", "application/json", ""},
		{"a route's plain-text answer", "GET /ui/nothing.js HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", 404, "", "text/plain; charset=utf-8", ""},
	} {
		conn, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(conn, c.request); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		conn.Close()
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if resp.StatusCode != c.status || resp.Header.Get("Content-Type") != c.ctype {
			t.Errorf("%s: answered %d %s, want %d %s\n%s", c.name, resp.StatusCode, resp.Header.Get("Content-Type"), c.status, c.ctype, body)
			continue
		}
		if c.code == "" {
			continue
		}
		var e struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		if err := json.Unmarshal(body, &e); err != nil || e.Error.Code != c.code || !strings.Contains(e.Error.Message, c.message) {
			t.Errorf("%s: answered %s (%v), want code %s with a message saying %q", c.name, body, err, c.code, c.message)
		}
	}
}
