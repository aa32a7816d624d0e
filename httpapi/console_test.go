package httpapi_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pulse-sidecar/pulse/httpapi"
	"github.com/pulse-sidecar/pulse/internal/testdb"
	"github.com/pulse-sidecar/pulse/mongo"
	"github.com/pulse-sidecar/pulse/pulsetype"
)

type nopNotifier struct{}

func (nopNotifier) Published([]*pulsetype.Event) {}
func (nopNotifier) EndpointChanged(string)       {}
func (nopNotifier) Wake()                        {}

// console is an API server on a fresh test database, without a dispatcher: what the store holds stays put.
type console struct {
	t     *testing.T
	ctx   context.Context
	store *mongo.Store
	url   string
}

func newConsole(t *testing.T, opts httpapi.Options) *console {
	t.Helper()
	client, dbName := testdb.Database(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	t.Cleanup(cancel)
	store := mongo.New(client, mongo.Options{Database: dbName, CollectionPrefix: "pulse", LeaseTimeout: time.Minute, Logger: zerolog.Nop()})
	if _, err := store.EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	opts.Logger = zerolog.Nop()
	srv := httptest.NewServer(httpapi.New(store, nopNotifier{}, opts).Handler())
	t.Cleanup(srv.Close)
	return &console{t: t, ctx: ctx, store: store, url: srv.URL}
}

// get GETs path with token (none when empty), decodes the JSON answer into out, and returns the status and
// how long the answer took.
func (c *console) get(path, token string, out any) (int, time.Duration) {
	c.t.Helper()
	req, _ := http.NewRequestWithContext(c.ctx, http.MethodGet, c.url+path, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	if out != nil {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			c.t.Fatalf("GET %s answered %d, not JSON: %v", path, resp.StatusCode, err)
		}
	}
	return resp.StatusCode, time.Since(start)
}

// The console's files load without a token (they hold no data) on the API handler, with the security
// headers; its data calls need the token like the rest of /v1; the probe handler has no console.
func TestConsoleFilesAndHeaders(t *testing.T) {
	t.Parallel()
	const token = "tok-console-4b1d"
	c := newConsole(t, httpapi.Options{APITokens: []string{token}})
	for _, f := range []struct{ path, ctype, has string }{
		{"/ui/", "text/html", `<script src="app.js"`},
		{"/ui/app.js", "javascript", "Authorization"},
		{"/ui/app.css", "text/css", "font-family"},
	} {
		resp, err := http.Get(c.url + f.path)
		if err != nil {
			t.Fatal(err)
		}
		body := readAll(t, resp)
		if resp.StatusCode != 200 || !strings.Contains(resp.Header.Get("Content-Type"), f.ctype) || !strings.Contains(body, f.has) {
			t.Errorf("GET %s = %d %s, want 200 %s holding %q", f.path, resp.StatusCode, resp.Header.Get("Content-Type"), f.ctype, f.has)
		}
		for h, want := range map[string]string{
			"Content-Security-Policy": "default-src 'self'", "X-Content-Type-Options": "nosniff",
			"Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY",
		} {
			if got := resp.Header.Get(h); !strings.Contains(got, want) {
				t.Errorf("GET %s: %s = %q, want %q", f.path, h, got, want)
			}
		}
		if strings.Contains(resp.Header.Get("Content-Security-Policy"), "unsafe-inline") {
			t.Errorf("GET %s: the CSP allows inline code", f.path)
		}
	}
	html := func() string {
		resp, err := http.Get(c.url + "/ui/")
		if err != nil {
			t.Fatal(err)
		}
		return readAll(t, resp)
	}()
	if strings.Contains(html, "<script>") || strings.Contains(html, " onclick=") || strings.Contains(html, "style=") {
		t.Errorf("index.html holds inline script or style, which the CSP blocks")
	}
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noRedirect.Get(c.url + "/ui")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMovedPermanently || resp.Header.Get("Location") != "/ui/" {
		t.Errorf("GET /ui = %d to %q, want 301 to /ui/", resp.StatusCode, resp.Header.Get("Location"))
	}
	resp, err = http.Post(c.url+"/ui/", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /ui/ = %d, want 405", resp.StatusCode)
	}
	if code, _ := c.get("/ui/nothing.js", "", nil); code != 404 {
		t.Errorf("GET /ui/nothing.js = %d, want 404", code)
	}

	if code, _ := c.get("/v1/stats", "", nil); code != 401 {
		t.Errorf("GET /v1/stats without the token = %d, want 401", code)
	}
	if code, _ := c.get("/v1/stats", token, nil); code != 200 {
		t.Errorf("GET /v1/stats with the token = %d, want 200", code)
	}

	probe := httptest.NewServer(httpapi.New(c.store, nopNotifier{}, httpapi.Options{Logger: zerolog.Nop()}).ProbeHandler())
	defer probe.Close()
	resp, err = http.Get(probe.URL + "/ui/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Errorf("GET /ui/ on the probe handler = %d, want 404", resp.StatusCode)
	}
}

// readAll returns the body of resp and closes it.
func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(raw)
}
