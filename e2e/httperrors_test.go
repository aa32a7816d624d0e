package e2e

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"testing"

	"github.com/pulse-sidecar/pulse/e2e/internal/harness"
)

// A request net/http refuses before any route (a malformed Host, two Host headers) gets the API's JSON
// error from a running sidecar, not Go's plain text: its listener is wrapped (httpapi.JSONErrorListener).
func TestRequestsNetHTTPRefusesAnswerJSON(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv())
	u, err := url.Parse(s.URL)
	if err != nil {
		t.Fatal(err)
	}
	for _, request := range []string{
		"GET /v1/stats HTTP/1.1\r\nHost: a b\r\n\r\n",
		"GET /v1/stats HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: 127.0.0.2\r\n\r\n",
	} {
		conn, err := net.Dial("tcp", u.Host)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(conn, request); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		var e struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		decodeErr := json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		conn.Close()
		if resp.StatusCode != 400 || resp.Header.Get("Content-Type") != "application/json" || decodeErr != nil || e.Error.Code != "bad_request" {
			t.Errorf("%q answered %d %s (%v) %+v, want 400 application/json bad_request", request, resp.StatusCode,
				resp.Header.Get("Content-Type"), decodeErr, e)
		}
	}
}
