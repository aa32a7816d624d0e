package httpapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/rs/zerolog"

	"github.com/pulse-sidecar/pulse/httpapi"
	"github.com/pulse-sidecar/pulse/metrics"
	"github.com/pulse-sidecar/pulse/pulsetype"
)

// failStore answers every call with err: the store of a database that is down (pulsetype.ErrUnavailable:
// 503) or failing otherwise (500).
type failStore struct{ err error }

func (f failStore) Publish(context.Context, []*pulsetype.Event) ([]pulsetype.Published, error) {
	return nil, f.err
}
func (f failStore) GetEvent(context.Context, string) (*pulsetype.Event, error) { return nil, f.err }
func (f failStore) DeliveriesOfEvent(context.Context, string) ([]*pulsetype.Delivery, error) {
	return nil, f.err
}
func (f failStore) AttemptsOf(context.Context, []string) (map[string][]*pulsetype.Attempt, error) {
	return nil, f.err
}
func (f failStore) GetDelivery(context.Context, string) (*pulsetype.Delivery, []*pulsetype.Attempt, error) {
	return nil, nil, f.err
}
func (f failStore) PutEndpoint(context.Context, *pulsetype.Endpoint) (*pulsetype.Endpoint, bool, error) {
	return nil, false, f.err
}
func (f failStore) GetEndpoint(context.Context, string) (*pulsetype.Endpoint, error) {
	return nil, f.err
}
func (f failStore) ListEndpoints(context.Context) ([]*pulsetype.Endpoint, error) { return nil, f.err }
func (f failStore) DeleteEndpoint(context.Context, string) (pulsetype.Deleted, error) {
	return pulsetype.Deleted{}, f.err
}
func (f failStore) Ping(context.Context) error       { return f.err }
func (f failStore) ProbeWrite(context.Context) error { return f.err }
func (f failStore) ListDeliveries(context.Context, pulsetype.DeliveryFilter) ([]*pulsetype.Delivery, string, error) {
	return nil, "", f.err
}
func (f failStore) RetryDelivery(context.Context, string) (int, error) { return 0, f.err }
func (f failStore) ReplayDeliveries(context.Context, pulsetype.ReplayParams) (int, error) {
	return 0, f.err
}
func (f failStore) CancelDelivery(context.Context, string) (pulsetype.CancelResult, error) {
	return pulsetype.CancelResult{}, f.err
}
func (f failStore) RotateSecret(context.Context, string, string, time.Duration) (*pulsetype.Endpoint, error) {
	return nil, f.err
}
func (f failStore) SetEndpointState(context.Context, string, pulsetype.EndpointState) (*pulsetype.Endpoint, error) {
	return nil, f.err
}
func (f failStore) Stats(context.Context, []string) ([]*pulsetype.GroupStats, error) {
	return nil, f.err
}
func (f failStore) Activity(context.Context, string) (*pulsetype.GroupActivity, error) {
	return nil, f.err
}
func (f failStore) ActivityAll(context.Context) ([]*pulsetype.GroupActivity, error) {
	return nil, f.err
}
func (f failStore) LineHead(context.Context, pulsetype.Line) (string, error) { return "", f.err }

// specCodeWord is an error code as the spec's response descriptions name them: snake_case with at least one
// underscore, or the one word before " —" that opens a description ("unauthorized — ...").
var specCodeWord = regexp.MustCompile(`\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b|^[a-z]+(?: —)`)

// specErrors returns, for each operation ("METHOD /path") of doc, the error codes each of its JSON error
// responses (status 400 and above) names in its description, and whether that response is shared (a $ref
// to components/responses, which names codes other operations answer too).
func specErrors(doc *openapi3.T) (map[string]map[int][]string, map[string]map[int]bool) {
	codes, shared := map[string]map[int][]string{}, map[string]map[int]bool{}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			key := method + " " + path
			codes[key], shared[key] = map[int][]string{}, map[int]bool{}
			for status, ref := range op.Responses.Map() {
				n, err := strconv.Atoi(status)
				if err != nil || n < 400 || ref.Value == nil || ref.Value.Content.Get("application/json") == nil {
					continue
				}
				var found []string
				for _, w := range specCodeWord.FindAllString(*ref.Value.Description, -1) {
					if w = strings.TrimSuffix(w, " —"); !slices.Contains(found, w) {
						found = append(found, w)
					}
				}
				codes[key][n], shared[key][n] = found, ref.Ref != ""
			}
		}
	}
	return codes, shared
}

// walkAnswer is one answer of the walk: the operation it was asked of, its status and error code.
type walkAnswer struct {
	name, op string
	status   int
	code     string // "" when the body is not a JSON error
}

// Every route of docs/openapi.yaml is walked through every error it can provoke: the golden requests of
// answers_test.go, then for each operation a request without a token, with a read-only token, from another
// origin, with a Host the listener does not answer, with a method the path does not take, with a body of
// another media type, against a database that is down and one that fails, and the route-specific errors
// the golden answers lack. Each answer's status must be one the operation documents and its code one that
// response names; each documented error status of each operation must be answered, each code of an
// operation's own response on that operation, each code of a shared response on some operation.
func TestOpenAPIWalksEveryError(t *testing.T) {
	t.Parallel()
	doc, router := loadSpec(t)
	codes, shared := specErrors(doc)
	opts := httpapi.Options{APITokens: []string{"tok-full"}, ReadTokens: []string{"tok-read"}, MaxBodyBytes: 1 << 20,
		Logger: zerolog.Nop(), Metrics: metrics.New()}
	server := func(store httpapi.Store, change func(*httpapi.Options, *httpapi.Server)) string {
		o := opts
		change(&o, nil)
		s := httpapi.New(store, nopNotifier{}, o)
		change(&o, s)
		srv := httptest.NewServer(s.Handler())
		t.Cleanup(srv.Close)
		return srv.URL
	}
	same := func(*httpapi.Options, *httpapi.Server) {}
	full := server(specStore{}, same)
	hostChecked := server(specStore{}, func(o *httpapi.Options, _ *httpapi.Server) { o.CheckHost = true })
	down := server(failStore{fmt.Errorf("find: %w: server selection timeout", pulsetype.ErrUnavailable)}, same)
	failing := server(failStore{errors.New("decode: unexpected type")}, same)
	draining := server(specStore{}, func(_ *httpapi.Options, s *httpapi.Server) {
		if s != nil {
			s.Drain()
		}
	})
	tinyBody := server(specStore{}, func(o *httpapi.Options, _ *httpapi.Server) { o.MaxBodyBytes = 64 })

	type probe struct {
		name, base, method, path, body, token string
		header                                map[string]string
		op                                    string // the operation asked; "": the one the router finds
	}
	var answers []walkAnswer
	ask := func(p probe) {
		t.Helper()
		req := apiRequest(t, p.method, p.base+p.path, p.body, p.token)
		for k, v := range p.header {
			switch {
			case v == "-":
				req.Header.Del(k)
			case k == "Host":
				req.Host = v
			default:
				req.Header.Set(k, v)
			}
		}
		op := p.op
		if op == "" {
			specReq := req.Clone(t.Context())
			specReq.URL.Scheme, specReq.URL.Host = "http", "127.0.0.1:8080"
			route, _, err := router.FindRoute(specReq)
			if err != nil {
				t.Errorf("%s: %s %s has no operation in docs/openapi.yaml: %v", p.name, p.method, p.path, err)
				return
			}
			op = p.method + " " + route.Path
		}
		client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		var e struct {
			Error struct{ Code string } `json:"error"`
		}
		if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
			_ = json.Unmarshal(raw, &e)
		}
		answers = append(answers, walkAnswer{name: p.name, op: op, status: resp.StatusCode, code: e.Error.Code})
	}

	// The golden requests; a well-formed one of each operation is kept for the probes below.
	valid := map[string]probe{}
	for _, c := range answerCases {
		if c.name == "no-route" || c.name == "method-not-allowed" {
			continue // no operation: the router's own answers
		}
		raw, err := os.ReadFile(filepath.Join("testdata", "answers", c.name+".golden"))
		if err != nil {
			t.Fatal(err)
		}
		p := probe{name: c.name, base: full, method: c.method, path: c.path, body: c.body, token: c.token, header: c.header}
		ask(p)
		if status, _, _ := strings.Cut(string(raw), " "); status < "300" && c.token == "" && c.header == nil {
			if a := answers[len(answers)-1]; valid[a.op].name == "" {
				valid[a.op] = p
			}
		}
	}
	for _, p := range []probe{
		{name: "delete", method: "DELETE", path: "/v1/endpoints/billing"}, {name: "metrics", method: "GET", path: "/metrics"},
		{name: "console-redirect", method: "GET", path: "/ui"}, {name: "console", method: "GET", path: "/ui/"},
		{name: "console-asset", method: "GET", path: "/ui/app.js"}, {name: "openapi", method: "GET", path: "/v1/openapi.yaml"},
	} {
		p.base = full
		ask(p)
		valid[answers[len(answers)-1].op] = p
	}

	// The errors every operation can answer, from one well-formed request of it.
	ops := specRoutes(doc)
	for _, op := range ops {
		p, ok := valid[op]
		if !ok {
			t.Errorf("%s: no golden request answered it with success", op)
			continue
		}
		p.op = op
		documents := func(status int) bool { _, ok := codes[op][status]; return ok }
		variant := func(name, base string, change func(*probe)) {
			q := p
			q.name, q.base = op+" "+name, base
			q.header = map[string]string{}
			for k, v := range p.header {
				q.header[k] = v
			}
			change(&q)
			ask(q)
		}
		v1 := strings.HasPrefix(strings.TrimPrefix(op, p.method+" "), "/v1/")
		if v1 {
			variant("without a token", full, func(q *probe) { q.token = "-" })
			if p.method != http.MethodGet {
				variant("with a read-only token", full, func(q *probe) { q.token = "tok-read" })
			}
		}
		variant("from another origin", full, func(q *probe) {
			q.header["Sec-Fetch-Site"], q.header["Origin"] = "cross-site", "http://evil.example"
		})
		variant("under a Host not allowed", hostChecked, func(q *probe) { q.header["Host"] = "evil.example" })
		variant("with a method the path does not take", full, func(q *probe) { q.method = http.MethodPatch })
		if p.method != http.MethodGet {
			variant("with a text/plain body", full, func(q *probe) {
				q.body = cmp(q.body, "{}")
				q.header["Content-Type"] = "text/plain"
			})
		}
		if documents(http.StatusServiceUnavailable) {
			variant("with the database down", down, func(*probe) {})
		}
		if documents(http.StatusInternalServerError) {
			variant("with the database failing", failing, func(*probe) {})
		}
	}

	// The route-specific errors no golden answer shows.
	events := `[` + strings.Repeat(`{"topic":"t","data":1},`, httpapi.MaxBatch) + `{"topic":"t","data":1}]`
	for _, p := range []probe{
		{name: "publish-not-json", method: "POST", path: "/v1/events", body: `{"topic":`},
		{name: "publish-not-an-object", method: "POST", path: "/v1/events", body: `[1]`},
		{name: "publish-reserved-topic", method: "POST", path: "/v1/events", body: `{"topic":"pulse.x","data":1}`},
		{name: "publish-missing-data", method: "POST", path: "/v1/events", body: `{"topic":"t"}`},
		{name: "publish-bad-id", method: "POST", path: "/v1/events", body: `{"id":"..","topic":"t","data":1}`},
		{name: "publish-bad-header", method: "POST", path: "/v1/events", body: `{"topic":"t","data":1,"headers":{"a b":"x"}}`},
		{name: "publish-bad-ordering-key", method: "POST", path: "/v1/events", body: `{"topic":"t","data":1,"orderingKey":""}`},
		{name: "publish-duplicate-id", method: "POST", path: "/v1/events", body: `[{"id":"a","topic":"t","data":1},{"id":"a","topic":"t","data":2}]`},
		{name: "publish-empty-batch", method: "POST", path: "/v1/events", body: `[]`},
		{name: "publish-batch-too-large", method: "POST", path: "/v1/events", body: events},
		{name: "publish-cloudevent-without-source", method: "POST", path: "/v1/events", body: `{"specversion":"1.0","id":"x","type":"t"}`,
			header: map[string]string{"Content-Type": "application/cloudevents+json"}},
		{name: "publish-too-large", base: tinyBody, method: "POST", path: "/v1/events", body: `{"topic":"t","data":"` + strings.Repeat("x", 100) + `"}`},
		{name: "publish-shutting-down", base: draining, method: "POST", path: "/v1/events", body: `{"topic":"t","data":1}`},
		{name: "readyz-shutting-down", base: draining, method: "GET", path: "/readyz"},
		{name: "retry-not-subscribed", method: "POST", path: "/v1/deliveries/dlv-unsubscribed/retry"},
		{name: "retry-in-flight", method: "POST", path: "/v1/deliveries/dlv-in-flight/retry"},
		{name: "retry-not-found", method: "POST", path: "/v1/deliveries/nope/retry"},
		{name: "cancel-not-found", method: "POST", path: "/v1/deliveries/nope/cancel"},
		{name: "rotate-bad-secret", method: "POST", path: "/v1/endpoints/billing/rotate-secret", body: `{"secret":"s3cr3t"}`},
		{name: "rotate-too-large", method: "POST", path: "/v1/endpoints/billing/rotate-secret", body: `{"secret":"` + strings.Repeat("x", 70_000) + `"}`},
		{name: "put-endpoint-too-large", method: "PUT", path: "/v1/endpoints/fresh", body: `{"url":"` + strings.Repeat("x", 70_000) + `"}`},
		{name: "replay-bad-status", method: "POST", path: "/v1/endpoints/billing/replay", body: `{"status":"pending"}`},
		{name: "replay-not-found", method: "POST", path: "/v1/endpoints/nope/replay"},
		{name: "resume-not-found", method: "POST", path: "/v1/endpoints/nope/resume"},
		{name: "retry-too-large", method: "POST", path: "/v1/deliveries/dlv-failed/retry", body: `{"a":"` + strings.Repeat("x", 70_000) + `"}`},
		{name: "cancel-too-large", method: "POST", path: "/v1/deliveries/dlv-pending/cancel", body: `{"a":"` + strings.Repeat("x", 70_000) + `"}`},
		{name: "resume-too-large", method: "POST", path: "/v1/endpoints/billing/resume", body: `{"a":"` + strings.Repeat("x", 70_000) + `"}`},
		{name: "delete-not-found", method: "DELETE", path: "/v1/endpoints/nope"},
		{name: "delete-too-large", method: "DELETE", path: "/v1/endpoints/billing", body: `{"a":"` + strings.Repeat("x", 70_000) + `"}`},
		{name: "console-missing", method: "GET", path: "/ui/nothing.js"},
	} {
		p.base = cmp(p.base, full)
		ask(p)
	}

	// Each answer is documented, with its code.
	answered := map[string]map[int]bool{}
	provoked := map[string]map[int][]string{}
	for _, a := range answers {
		if answered[a.op] == nil {
			answered[a.op], provoked[a.op] = map[int]bool{}, map[int][]string{}
		}
		answered[a.op][a.status] = true
		provoked[a.op][a.status] = append(provoked[a.op][a.status], a.code)
		if a.status < 400 {
			continue
		}
		doc := doc.Paths.Find(strings.SplitN(a.op, " ", 2)[1]).GetOperation(strings.SplitN(a.op, " ", 2)[0])
		if doc == nil || doc.Responses.Status(a.status) == nil {
			t.Errorf("%s: %s answered %d, which docs/openapi.yaml does not document for it", a.name, a.op, a.status)
			continue
		}
		if want, ok := codes[a.op][a.status]; ok && !slices.Contains(want, a.code) {
			t.Errorf("%s: %s answered %d %q; docs/openapi.yaml names %v for %d", a.name, a.op, a.status, a.code, want, a.status)
		}
	}
	// Each documented error is provoked. unreadable_body needs a body whose reading fails midway (a client
	// that breaks the connection), which no request here makes.
	notProvoked := map[string]bool{"unreadable_body": true}
	sharedCodes := map[string]bool{}
	for _, op := range ops {
		for status, want := range codes[op] {
			if !answered[op][status] {
				t.Errorf("%s: no request provoked its documented %d", op, status)
			}
			for _, c := range want {
				if shared[op][status] {
					continue
				}
				if !notProvoked[c] && !slices.Contains(provoked[op][status], c) {
					t.Errorf("%s: no request provoked its documented %d %s", op, status, c)
				}
			}
		}
		for status := range codes[op] {
			if shared[op][status] {
				for _, c := range provoked[op][status] {
					sharedCodes[fmt.Sprint(status, " ", c)] = true
				}
			}
		}
	}
	var missing []string
	for _, op := range ops {
		for status, want := range codes[op] {
			if !shared[op][status] {
				continue
			}
			for _, c := range want {
				if k := fmt.Sprint(status, " ", c); !sharedCodes[k] && !slices.Contains(missing, k) {
					missing = append(missing, k)
				}
			}
		}
	}
	sort.Strings(missing)
	for _, k := range missing {
		t.Errorf("no operation answered the shared response's %s", k)
	}
	if len(answers) < 200 {
		t.Errorf("the walk asked only %d requests", len(answers))
	}
}

// cmp returns a, or b when a is empty.
func cmp(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// A delete answers 204 with what it did before answering: the pending deliveries it ended (one page at most)
// and those it left pending for the repair scan, as the store counted them.
func TestDeleteAnswersWhatItEndedAndLeft(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(httpapi.New(specStore{}, nopNotifier{}, httpapi.Options{Logger: zerolog.Nop()}).Handler())
	t.Cleanup(srv.Close)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodDelete, srv.URL+"/v1/endpoints/billing", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent || resp.Header.Get("Pulse-Deliveries-Ended") != "1000" ||
		resp.Header.Get("Pulse-Deliveries-Remaining") != "4000" {
		t.Errorf("DELETE answered %d with Pulse-Deliveries-Ended %q and Pulse-Deliveries-Remaining %q, want 204, 1000 and 4000",
			resp.StatusCode, resp.Header.Get("Pulse-Deliveries-Ended"), resp.Header.Get("Pulse-Deliveries-Remaining"))
	}
}
