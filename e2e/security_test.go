package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/pulse-sidecar/pulse/e2e/internal/harness"
	"github.com/pulse-sidecar/pulse/internal/testdb"
	"github.com/pulse-sidecar/pulse/internal/testwait"
)

// A sidecar asked to bind its API beyond loopback without a token exits non-zero at once, with one line
// saying why and naming PULSE_API_TOKEN.
func TestBeyondLoopbackWithoutTokenExits(t *testing.T) {
	for _, listen := range []string{"0.0.0.0:0", "[::]:0"} {
		cmd := exec.Command(testdb.Binary(t), "serve")
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "PULSE_LISTEN=" + listen,
			"PULSE_DATA_DIR=" + filepath.Join(t.TempDir(), "data")}
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() == 0 {
			t.Fatalf("PULSE_LISTEN=%s without a token: %v, want a non-zero exit\n%s", listen, err, stderr.String())
		}
		msg := strings.TrimSpace(stderr.String())
		if strings.Count(msg, "\n") != 0 || !strings.Contains(msg, "PULSE_API_TOKEN") || !strings.Contains(msg, "beyond loopback") {
			t.Errorf("PULSE_LISTEN=%s: stderr %q, want one line saying why and naming PULSE_API_TOKEN", listen, msg)
		}
	}
}

// probeAddr returns the probe listener's address from the sidecar's "listening" line.
func probeAddr(t *testing.T, logs string) string {
	t.Helper()
	sc := bufio.NewScanner(strings.NewReader(logs))
	for sc.Scan() {
		var line struct {
			Message   string `json:"message"`
			ProbeAddr string `json:"probe_addr"`
		}
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.Message == "listening" && line.ProbeAddr != "" {
			return line.ProbeAddr
		}
	}
	t.Fatalf("no probe_addr in the listening line:\n%s", logs)
	return ""
}

// auditLines returns the audit log's lines (component audit) as decoded JSON.
func auditLines(logs string) []map[string]any {
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(logs))
	for sc.Scan() {
		var line map[string]any
		if json.Unmarshal(sc.Bytes(), &line) == nil && line["component"] == "audit" {
			out = append(out, line)
		}
	}
	return out
}

// The probe listener serves /healthz, /readyz and /metrics without a token and nothing of /v1; the API
// accepts every token of PULSE_API_TOKEN (rotation), a read-only token only on GET routes; every
// administrative action logs one audit line with who, what and which fields, and never a secret value.
func TestProbeListenerTokensAndAudit(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv(map[string]string{
		"PULSE_PROBE_LISTEN":   "127.0.0.1:0",
		"PULSE_API_TOKEN":      "tok-new-1a2b, tok-old-3c4d",
		"PULSE_API_READ_TOKEN": "tok-view-5e6f",
	}))
	testwait.Eventually(t, 30*time.Second, "the listening line in the logs", func() bool { return strings.Contains(s.Logs.String(), `"probe_addr"`) })
	probe := "http://" + probeAddr(t, s.Logs.String())
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		for _, base := range []string{probe, s.URL} { // the API listener keeps them too
			if code := harness.Do(t, "GET", base+path, nil, nil); code != 200 {
				t.Errorf("GET %s%s = %d, want 200 without a token", base, path, code)
			}
		}
	}
	if code := harness.Do(t, "GET", probe+"/v1/endpoints", nil, nil); code != 404 {
		t.Errorf("GET /v1/endpoints on the probe listener = %d, want 404", code)
	}

	call := func(method, path, token string, body any) (int, string) {
		t.Helper()
		var rd io.Reader
		if body != nil {
			raw, _ := json.Marshal(body)
			rd = bytes.NewReader(raw)
		}
		req, _ := http.NewRequest(method, s.URL+path, rd)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(out)
	}
	rcv := harness.NewReceiver(t, 400)
	const secret, cred = "whsec_dGhpcy1pcy1hLXRlc3Qtc2lnbmluZy1r", "Bearer cred-9d8c7b6a"
	ep := map[string]any{"url": rcv.URL, "topics": []string{"t"}, "secret": secret, "headers": map[string]string{"Authorization": cred}}
	if code, body := call("PUT", "/v1/endpoints/billing", "", ep); code != 401 {
		t.Fatalf("PUT without a token = %d %s", code, body)
	}
	if code, body := call("PUT", "/v1/endpoints/billing", "tok-old-3c4d", ep); code != 201 {
		t.Fatalf("PUT with the second (old) token = %d %s", code, body)
	}
	if code, _ := call("GET", "/v1/endpoints/billing", "tok-new-1a2b", nil); code != 200 {
		t.Errorf("GET with the first token = %d", code)
	}
	if code, _ := call("GET", "/v1/endpoints", "tok-view-5e6f", nil); code != 200 {
		t.Errorf("GET with the read-only token = %d", code)
	}
	for _, w := range []struct{ method, path string }{{"PUT", "/v1/endpoints/billing"}, {"POST", "/v1/events"}, {"DELETE", "/v1/endpoints/billing"}} {
		if code, body := call(w.method, w.path, "tok-view-5e6f", ep); code != 403 || !strings.Contains(body, "read_only_token") {
			t.Errorf("%s %s with the read-only token = %d %s, want 403 read_only_token", w.method, w.path, code, body)
		}
	}

	ep["url"] = rcv.URL + "/v2"
	ep["headers"] = map[string]string{"Authorization": cred, "X-Env": "prod"}
	if code, body := call("PUT", "/v1/endpoints/billing", "tok-new-1a2b", ep); code != 200 {
		t.Fatalf("second PUT = %d %s", code, body)
	}
	code, body := call("POST", "/v1/events", "tok-new-1a2b", map[string]any{"topic": "t", "data": 1})
	if code != 202 {
		t.Fatalf("publish = %d %s", code, body)
	}
	var pub struct{ ID string }
	_ = json.Unmarshal([]byte(body), &pub)
	var deliveryID string
	testwait.Eventually(t, 20*time.Second, "the delivery to end", func() bool {
		_, body := call("GET", "/v1/events/"+pub.ID, "tok-view-5e6f", nil)
		var ev harness.EventView
		_ = json.Unmarshal([]byte(body), &ev)
		if len(ev.Deliveries) == 1 && ev.Deliveries[0].Status == "error" {
			deliveryID = ev.Deliveries[0].ID
		}
		return deliveryID != ""
	})
	if code, body := call("POST", "/v1/deliveries/"+deliveryID+"/retry", "tok-new-1a2b", nil); code != 202 {
		t.Fatalf("retry = %d %s", code, body)
	}
	testwait.Eventually(t, 20*time.Second, "the retried delivery to end", func() bool {
		_, body := call("GET", "/v1/deliveries/"+deliveryID, "tok-new-1a2b", nil)
		var d harness.DeliveryView
		_ = json.Unmarshal([]byte(body), &d)
		return d.Status == "error" && len(d.Attempts) == 2
	})
	if code, body := call("POST", "/v1/endpoints/billing/replay", "tok-new-1a2b", map[string]any{"status": "error"}); code != 200 {
		t.Fatalf("replay = %d %s", code, body)
	}
	if code, body := call("DELETE", "/v1/endpoints/billing", "tok-old-3c4d", nil); code != 204 {
		t.Fatalf("DELETE = %d %s", code, body)
	}

	want := []struct {
		action, auth string
		changed      []any // nil: not checked
	}{
		{"endpoint.created", "PULSE_API_TOKEN#2", []any{"delivery", "format", "maxConcurrency", "maxRetries", "maxRetryDelay", "offsetReset", "ordered", "retryBackoffMultiplier", "retryDelay", "secret", "timeout", "topics", "url", "headers.Authorization"}},
		{"endpoint.changed", "PULSE_API_TOKEN#1", []any{"url", "headers.X-Env"}},
		{"delivery.retried", "PULSE_API_TOKEN#1", nil},
		{"deliveries.replayed", "PULSE_API_TOKEN#1", nil},
		{"endpoint.deleted", "PULSE_API_TOKEN#2", nil},
	}
	var lines []map[string]any
	testwait.Eventually(t, 30*time.Second, "the audit lines", func() bool { lines = auditLines(s.Logs.String()); return len(lines) >= len(want) })
	if len(lines) != len(want) {
		t.Fatalf("audit lines = %v, want %d", lines, len(want))
	}
	for i, w := range want {
		l := lines[i]
		if l["action"] != w.action || l["auth"] != w.auth || l["level"] != "info" {
			t.Errorf("audit line %d = %v, want action %s by %s at info", i, l, w.action, w.auth)
		}
		if w.changed != nil {
			got, _ := l["changed"].([]any)
			if len(got) != len(w.changed) {
				t.Errorf("audit line %d changed = %v, want %v", i, got, w.changed)
				continue
			}
			for j := range got {
				if got[j] != w.changed[j] {
					t.Errorf("audit line %d changed = %v, want %v", i, got, w.changed)
					break
				}
			}
		}
		if l["consumer_group"] != "billing" && l["delivery_id"] != deliveryID {
			t.Errorf("audit line %d names no target: %v", i, l)
		}
	}
	for _, leak := range []string{"dGhpcy1pcy1h", "cred-9d8c", "tok-new", "tok-old", "tok-view"} {
		if strings.Contains(s.Logs.String(), leak) {
			t.Errorf("the logs carry %q", leak)
		}
	}
}

// keyB64 is a test encryption key: 32 bytes of b, base64.
func keyB64(b byte) string { return base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{b}, 32)) }

// With PULSE_ENCRYPTION_KEY the subscription documents hold no secret or header value in clear; a rotation
// (new key first, old after) keeps every endpoint delivering with its headers and signature, and a restart
// with only the new key works once every endpoint was written again; a key that cannot decrypt a stored
// value stops the start with a line naming the endpoint.
//
// Not parallel, like the other heavy tests of this file: its sidecar processes then run before the parallel
// phase, not next to the load-sensitive tests (TestLargestEventFitsOneDocument).
func TestEncryptionAtRestAndKeyRotation(t *testing.T) {
	client, dbName := testdb.Database(t)
	b := &harness.Bundle{T: t, Client: client, DBName: dbName, URI: testdb.URI(t)}
	rcv := harness.NewReceiver(t, 200)
	const secretA, credA = "whsec_YS1zaWduaW5nLWtleS1vZi1ncm91cC1h", "Bearer cred-a-77aa11"
	const secretB, credB = "whsec_Yi1zaWduaW5nLWtleS1vZi1ncm91cC1i", "Bearer cred-b-88bb22"
	env := func(keys string) map[string]string {
		e := b.FastEnv()
		e["PULSE_ENCRYPTION_KEY"] = keys
		return e
	}
	register := func(s *harness.Sidecar, group, secret, cred string) {
		s.RegisterEndpoint(t, group, map[string]any{"url": rcv.URL + "/" + group, "topics": []string{"t"}, "secret": secret,
			"headers": map[string]string{"Authorization": cred}})
	}
	// deliver publishes one event and waits until every group got it with its own header and a signature.
	deliver := func(s *harness.Sidecar, groups map[string]string) {
		t.Helper()
		before := len(rcv.Received())
		s.Publish(t, "t", 1)
		testwait.Eventually(t, 20*time.Second, "the POSTs", func() bool { return len(rcv.Received()) == before+len(groups) })
		for _, r := range rcv.Received()[before:] {
			group := r.Header.Get("Pulse-Consumer-Group")
			if r.Header.Get("Authorization") != groups[group] || !strings.HasPrefix(r.Header.Get("Webhook-Signature"), "v1,") {
				t.Errorf("POST to %s: Authorization %q, signature %q", group, r.Header.Get("Authorization"), r.Header.Get("Webhook-Signature"))
			}
		}
	}
	noClear := func() {
		t.Helper()
		cur, err := b.Client.Database(b.DBName).Collection("pulse.subscriptions").Find(context.Background(), bson.M{})
		if err != nil {
			t.Fatal(err)
		}
		for cur.Next(context.Background()) {
			for _, v := range []string{secretA, credA, secretB, credB, "YS1zaWdu", "cred-a", "cred-b"} {
				if bytes.Contains(cur.Current, []byte(v)) {
					t.Errorf("subscription %s holds %q in clear", cur.Current.Lookup("_id"), v)
				}
			}
		}
	}

	p1 := b.StartProcess(env(keyB64(1)))
	register(p1.Sidecar(), "a", secretA, credA)
	noClear()
	deliver(p1.Sidecar(), map[string]string{"a": credA})
	p1.Kill()

	p2 := b.StartProcess(env(keyB64(2) + "," + keyB64(1))) // rotation: the new key encrypts, the old one still decrypts
	deliver(p2.Sidecar(), map[string]string{"a": credA})
	register(p2.Sidecar(), "b", secretB, credB)
	register(p2.Sidecar(), "a", secretA, credA) // re-encrypted with the new key
	noClear()
	deliver(p2.Sidecar(), map[string]string{"a": credA, "b": credB})
	p2.Kill()

	p3 := b.StartProcess(env(keyB64(2))) // the old key dropped
	deliver(p3.Sidecar(), map[string]string{"a": credA, "b": credB})
	p3.Kill()

	for _, keys := range []string{keyB64(3), ""} {
		p, err := harness.Launch(testdb.Binary(t), env(keys))
		if p != nil {
			p.Kill()
		}
		if err == nil || !strings.Contains(err.Error(), `endpoint \"a\"`) && !strings.Contains(err.Error(), `endpoint "a"`) {
			t.Errorf("start with PULSE_ENCRYPTION_KEY=%q: %v, want an exit naming endpoint a", keys, err)
		}
	}
}

// With the embedded development database and a key, no file under PULSE_DATA_DIR holds an endpoint's secret
// or header value, while an event's data is there (the check reads what the database wrote).
func TestDevDatabaseFilesHoldNoSecret(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	env := map[string]string{"PULSE_DATA_DIR": dir, "PULSE_LISTEN": "127.0.0.1:0", "PULSE_ENCRYPTION_KEY": keyB64(7),
		"PULSE_LOG_LEVEL": "info"}
	s := (&harness.Bundle{T: t}).Start(env)
	const secret, cred, marker = "whsec_ZGV2LWRiLXNpZ25pbmcta2V5LWNsZWFy", "Bearer devcred-6a5b4c3d", "marker-event-data-0f1e2d"
	s.RegisterEndpoint(t, "g", map[string]any{"url": "http://127.0.0.1:9/", "topics": []string{"t"}, "secret": secret,
		"headers": map[string]string{"Authorization": cred}})
	s.Publish(t, "t", marker)
	s.Stop() // the database's files are complete once it stopped
	if strings.Contains(s.Logs.String(), "PULSE_ENCRYPTION_KEY is not set") {
		t.Error("warned about a missing key although one is set")
	}
	var sawMarker bool
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		sawMarker = sawMarker || bytes.Contains(raw, []byte(marker))
		for _, v := range []string{secret, cred, "ZGV2LWRi", "devcred"} {
			if bytes.Contains(raw, []byte(v)) {
				t.Errorf("%s holds %q in clear", path, v)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !sawMarker {
		t.Fatalf("no file under %s holds the event's data: the check reads the wrong files", dir)
	}
}

// Endpoint header values are credentials as often as not: PUT answers, GET and the list show every header
// name with a placeholder value, the webhook still gets the real value, the logs never carry it, and a PUT
// that sends the placeholder back is refused.
func TestEndpointHeaderValuesAreRedacted(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv())
	rcv := harness.NewReceiver(t, 400) // terminal: the failure is logged
	const credential = "Bearer tok-7f3a9c-credential"
	body := map[string]any{"url": rcv.URL, "topics": []string{"t"}, "headers": map[string]string{"Authorization": credential, "X-Env": "prod"}}
	var put map[string]any
	if code := harness.Do(t, "PUT", s.URL+"/v1/endpoints/g", body, &put); code != 201 {
		t.Fatalf("PUT = %d %v", code, put)
	}
	one := harness.Get[map[string]any](t, s.URL+"/v1/endpoints/g")
	var list struct{ Endpoints []map[string]any }
	if code := harness.Do(t, "GET", s.URL+"/v1/endpoints", nil, &list); code != 200 || len(list.Endpoints) != 1 {
		t.Fatalf("list = %d %v", code, list)
	}
	for name, ep := range map[string]map[string]any{"PUT answer": put, "GET": one, "list": list.Endpoints[0]} {
		h, _ := ep["headers"].(map[string]any)
		if h["Authorization"] != redacted || h["X-Env"] != redacted || len(h) != 2 {
			t.Errorf("%s shows headers %v, want both names with %q", name, ep["headers"], redacted)
		}
	}

	s.Publish(t, "t", 1)
	testwait.Eventually(t, 20*time.Second, "the POST", func() bool { return len(rcv.Received()) == 1 })
	if got := rcv.Received()[0].Header.Get("Authorization"); got != credential {
		t.Errorf("the webhook got Authorization %q, want the stored value", got)
	}
	testwait.Eventually(t, 20*time.Second, "the terminal failure to be logged", func() bool {
		return strings.Contains(s.Logs.String(), `"consumer_group":"g"`)
	})
	if strings.Contains(s.Logs.String(), "tok-7f3a9c") {
		t.Errorf("the logs carry the header value:\n%s", s.Logs.String())
	}

	body["headers"] = map[string]string{"Authorization": redacted}
	var e errorView
	if code := harness.Do(t, "PUT", s.URL+"/v1/endpoints/g", body, &e); code != 400 || e.Error.Code != "invalid_endpoint" || !strings.Contains(e.Error.Message, "Authorization") {
		t.Fatalf("PUT with the placeholder = %d %+v, want 400 invalid_endpoint naming the header", code, e)
	}
	rcv.Mu.Lock()
	rcv.Statuses = []int{400, 200}
	rcv.Mu.Unlock()
	s.Publish(t, "t", 2)
	testwait.Eventually(t, 20*time.Second, "the second POST", func() bool { return len(rcv.Received()) == 2 })
	if got := rcv.Received()[1].Header.Get("Authorization"); got != credential {
		t.Errorf("after the refused PUT the webhook got Authorization %q, want the stored value", got)
	}
}

// Header names that differ only in case are refused at PUT (400 naming both, nothing stored) and in
// PULSE_ENDPOINTS_FILE (the start stops, naming both).
func TestHeaderNamesDifferingInCaseAreRefused(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv())
	var e errorView
	body := `{"url":"http://127.0.0.1:9/hook","topics":["t"],"headers":{"X-Tenant":"a","x-tenant":"b"}}`
	if code := harness.Do(t, "PUT", s.URL+"/v1/endpoints/g", body, &e); code != 400 || e.Error.Code != "invalid_endpoint" ||
		!strings.Contains(e.Error.Message, `"X-Tenant"`) || !strings.Contains(e.Error.Message, `"x-tenant"`) {
		t.Fatalf("PUT = %d %+v, want 400 invalid_endpoint naming both keys", code, e)
	}
	if n := b.Count("subscriptions", bson.M{}); n != 0 {
		t.Fatalf("%d endpoints stored after a refused PUT", n)
	}

	file := filepath.Join(t.TempDir(), "endpoints.yaml")
	content := "- consumerGroup: g\n  url: http://127.0.0.1:9/hook\n  topics: [t]\n  headers:\n    X-Tenant: a\n    x-tenant: b\n"
	if err := os.WriteFile(file, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	env := b.FastEnv()
	env["PULSE_ENDPOINTS_FILE"] = file
	err := harness.StartError(t.Context(), env)
	if err == nil || !strings.Contains(err.Error(), "PULSE_ENDPOINTS_FILE") || !strings.Contains(err.Error(), `"X-Tenant"`) || !strings.Contains(err.Error(), `"x-tenant"`) {
		t.Fatalf("start with the file = %v, want an error naming the variable and both keys", err)
	}
}

// redacted is what reads show in place of an endpoint header value (pulsetype.RedactedHeaderValue).
const redacted = "<redacted>"

type errorView struct {
	Error struct{ Code, Message string }
}
