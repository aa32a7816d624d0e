package httpapi_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
	"github.com/go-chi/chi/v5"
	"github.com/rs/zerolog"

	"github.com/pulse-sidecar/pulse/docs"
	"github.com/pulse-sidecar/pulse/httpapi"
	"github.com/pulse-sidecar/pulse/metrics"
	"github.com/pulse-sidecar/pulse/pulsetype"
)

// specStore is the storage of the API the spec tests ask: answerStore's fixed records, plus a delete (the one Store
// method the golden answers do not use) and the metrics route.
type specStore struct{ answerStore }

func (specStore) DeleteEndpoint(_ context.Context, group string) (pulsetype.Deleted, error) {
	if group == "billing" {
		return pulsetype.Deleted{Ended: 1000, Remaining: 4000}, nil
	}
	return pulsetype.Deleted{}, pulsetype.ErrNotFound
}

// registerDecoders tells kin-openapi how to read the bodies of the media types the API uses beyond its
// defaults (it refuses a body it cannot decode). Registration is global, hence once.
var registerDecoders = sync.OnceFunc(func() {
	for _, ct := range []string{"application/cloudevents+json", "application/cloudevents-batch+json"} {
		openapi3filter.RegisterBodyDecoder(ct, openapi3filter.JSONBodyDecoder)
	}
	for _, ct := range []string{"text/html", "text/javascript", "text/css"} {
		openapi3filter.RegisterBodyDecoder(ct, openapi3filter.PlainBodyDecoder)
	}
})

// loadSpec parses and validates docs/openapi.yaml (as embedded in the binary) and returns it with a router
// that finds its operations.
func loadSpec(t *testing.T) (*openapi3.T, routers.Router) {
	t.Helper()
	registerDecoders()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(docs.OpenAPI)
	if err != nil {
		t.Fatalf("docs/openapi.yaml: %v", err)
	}
	if !doc.IsOpenAPI31OrLater() {
		t.Fatalf("docs/openapi.yaml is OpenAPI %s, want 3.1", doc.OpenAPI)
	}
	if err := doc.Validate(loader.Context); err != nil {
		t.Fatalf("docs/openapi.yaml is not a valid OpenAPI document: %v", err)
	}
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	return doc, router
}

// specRoutes returns the operations of doc as "METHOD /path".
func specRoutes(doc *openapi3.T) []string {
	var out []string
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			out = append(out, method+" "+path)
		}
	}
	sort.Strings(out)
	return out
}

// The spec lists exactly the router's routes: every route chi serves has an operation in docs/openapi.yaml
// and every operation a route. The console, mounted at /ui as one handler, serves GET only (other methods
// answer 405), so its GET paths in the spec stand for the mount.
func TestOpenAPIListsEveryRoute(t *testing.T) {
	t.Parallel()
	doc, _ := loadSpec(t)
	routes := httpapi.New(specStore{}, nopNotifier{}, httpapi.Options{Logger: zerolog.Nop(), Metrics: metrics.New()}).Routes()
	var served, mounts []string
	err := chi.Walk(routes, func(method, route string, _ http.Handler, _ ...func(http.Handler) http.Handler) error {
		if prefix, mounted := strings.CutSuffix(route, "/*"); mounted {
			if method == http.MethodGet && !slices.Contains(mounts, prefix) {
				mounts = append(mounts, prefix)
			}
			return nil
		}
		served = append(served, method+" "+route)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var specified []string
	for _, r := range specRoutes(doc) {
		method, path, _ := strings.Cut(r, " ")
		under := slices.ContainsFunc(mounts, func(p string) bool { return path == p || strings.HasPrefix(path, p+"/") })
		switch {
		case under && method != http.MethodGet:
			t.Errorf("docs/openapi.yaml: %s: the handler mounted there serves GET only", r)
		case !under:
			specified = append(specified, r)
		}
	}
	for _, p := range mounts {
		if !slices.ContainsFunc(specRoutes(doc), func(r string) bool { return r == "GET "+p+"/" }) {
			t.Errorf("docs/openapi.yaml has no GET %s/ for the handler mounted at %s", p, p)
		}
	}
	sort.Strings(served)
	for _, r := range served {
		if !slices.Contains(specified, r) {
			t.Errorf("the router serves %s, docs/openapi.yaml does not list it", r)
		}
	}
	for _, r := range specified {
		if !slices.Contains(served, r) {
			t.Errorf("docs/openapi.yaml lists %s, the router does not serve it", r)
		}
	}
	if len(served) < 15 {
		t.Errorf("chi.Walk found only %d routes: %v", len(served), served)
	}
}

// recordedAnswer is one answer to validate: the request that got it and the status, Content-Type and body.
type recordedAnswer struct {
	name    string
	req     *http.Request
	status  int
	ctype   string
	body    []byte
	request bool // also validate the request (a well-formed one)
}

// The recorded answer of every route validates against the spec's schema of its status (an undocumented
// status fails), with kin-openapi's response validation: the golden answers of answers_test.go, then live
// answers of the routes they lack (a delete, /metrics, the console, the spec itself). The well-formed
// requests among them validate as requests too.
func TestOpenAPIValidatesRecordedAnswers(t *testing.T) {
	t.Parallel()
	doc, router := loadSpec(t)
	const base = "http://127.0.0.1:8080"
	newRequest := func(method, path, body string, header map[string]string) *http.Request {
		req := httptest.NewRequest(method, base+path, strings.NewReader(body))
		if body != "" && header["Content-Type"] == "" {
			req.Header.Set("Content-Type", "application/json")
		}
		for k, v := range header {
			req.Header.Set(k, v)
		}
		return req
	}
	// Answers of no route: the router's own 404 and 405, which no operation describes.
	noRoute := map[string]bool{"no-route": true, "method-not-allowed": true}
	var answers []recordedAnswer
	for _, c := range answerCases {
		raw, err := os.ReadFile(filepath.Join("testdata", "answers", c.name+".golden"))
		if err != nil {
			t.Fatal(err)
		}
		line, body, _ := bytes.Cut(raw, []byte("\n"))
		statusText, ctype, _ := strings.Cut(string(line), " ")
		status := 0
		for _, d := range statusText {
			status = status*10 + int(d-'0')
		}
		req := newRequest(c.method, c.path, c.body, c.header)
		if noRoute[c.name] {
			if _, _, err := router.FindRoute(req); err == nil {
				t.Errorf("%s: %s %s has an operation in the spec, but the API answered it as no route", c.name, c.method, c.path)
			}
			continue
		}
		// A binary-mode CloudEvent's body is its data, any JSON: no request schema describes it.
		_, binaryCE := c.header["Ce-Specversion"]
		answers = append(answers, recordedAnswer{name: c.name, req: req, status: status, ctype: ctype, body: body,
			request: status < 300 && !binaryCE})
	}
	srv := httptest.NewServer(httpapi.New(specStore{}, nopNotifier{}, httpapi.Options{Logger: zerolog.Nop(),
		Metrics: metrics.New(), MaxBodyBytes: 1 << 20}).Handler())
	t.Cleanup(srv.Close)
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, c := range []struct{ name, method, path string }{
		{"delete", "DELETE", "/v1/endpoints/billing"}, {"delete-not-found", "DELETE", "/v1/endpoints/nope"},
		{"metrics", "GET", "/metrics"}, {"console-redirect", "GET", "/ui"}, {"console", "GET", "/ui/"},
		{"console-script", "GET", "/ui/app.js"}, {"console-style", "GET", "/ui/app.css"},
		{"console-missing", "GET", "/ui/nothing.js"}, {"openapi", "GET", "/v1/openapi.yaml"},
	} {
		req, err := http.NewRequestWithContext(t.Context(), c.method, srv.URL+c.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if c.name == "openapi" && !bytes.Equal(body, docs.OpenAPI) {
			t.Errorf("GET /v1/openapi.yaml answered %d bytes, not docs/openapi.yaml", len(body))
		}
		answers = append(answers, recordedAnswer{name: c.name, req: newRequest(c.method, c.path, "", nil), status: resp.StatusCode,
			ctype: resp.Header.Get("Content-Type"), body: body, request: resp.StatusCode < 300})
	}

	covered := map[string]bool{}
	opts := &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true, AuthenticationFunc: openapi3filter.NoopAuthenticationFunc}
	for _, a := range answers {
		route, params, err := router.FindRoute(a.req)
		if err != nil {
			t.Errorf("%s: %s %s: no operation in docs/openapi.yaml: %v", a.name, a.req.Method, a.req.URL.Path, err)
			continue
		}
		covered[a.req.Method+" "+route.Path] = true
		in := &openapi3filter.RequestValidationInput{Request: a.req, PathParams: params, Route: route, Options: opts}
		if a.request {
			if err := openapi3filter.ValidateRequest(t.Context(), in); err != nil {
				t.Errorf("%s: the request %s %s does not validate: %v", a.name, a.req.Method, a.req.URL, err)
			}
		}
		out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: a.status,
			Header: http.Header{"Content-Type": {a.ctype}}, Options: opts}
		out.SetBodyBytes(a.body)
		if err := openapi3filter.ValidateResponse(t.Context(), out); err != nil {
			t.Errorf("%s: the answer %d to %s %s does not validate: %v\n%s", a.name, a.status, a.req.Method, a.req.URL.Path, err, a.body)
		}
	}
	for _, r := range specRoutes(doc) {
		if !covered[r] {
			t.Errorf("no recorded answer of %s is validated", r)
		}
	}
}
