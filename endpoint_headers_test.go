package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Endpoint header values are credentials as often as not: PUT answers, GET and the list show every header
// name with a placeholder value, the webhook still gets the real value, the logs never carry it, and a PUT
// that sends the placeholder back is refused.
func TestEndpointHeaderValuesAreRedacted(t *testing.T) {
	b := setup(t)
	s := b.start(b.fastEnv())
	rcv := newReceiver(t, 400) // terminal: the failure is logged
	const credential = "Bearer tok-7f3a9c-credential"
	body := map[string]any{"url": rcv.URL, "topics": []string{"t"}, "headers": map[string]string{"Authorization": credential, "X-Env": "prod"}}
	var put map[string]any
	if code := do(t, "PUT", s.URL+"/v1/endpoints/g", body, &put); code != 201 {
		t.Fatalf("PUT = %d %v", code, put)
	}
	one := get[map[string]any](t, s.URL+"/v1/endpoints/g")
	var list struct{ Endpoints []map[string]any }
	if code := do(t, "GET", s.URL+"/v1/endpoints", nil, &list); code != 200 || len(list.Endpoints) != 1 {
		t.Fatalf("list = %d %v", code, list)
	}
	for name, ep := range map[string]map[string]any{"PUT answer": put, "GET": one, "list": list.Endpoints[0]} {
		h, _ := ep["headers"].(map[string]any)
		if h["Authorization"] != redacted || h["X-Env"] != redacted || len(h) != 2 {
			t.Errorf("%s shows headers %v, want both names with %q", name, ep["headers"], redacted)
		}
	}

	s.publish(t, "t", 1)
	waitFor(t, 20*time.Second, "the POST", func() bool { return len(rcv.received()) == 1 })
	if got := rcv.received()[0].Header.Get("Authorization"); got != credential {
		t.Errorf("the webhook got Authorization %q, want the stored value", got)
	}
	waitFor(t, 20*time.Second, "the terminal failure to be logged", func() bool {
		return strings.Contains(s.logs.String(), `"consumer_group":"g"`)
	})
	if strings.Contains(s.logs.String(), "tok-7f3a9c") {
		t.Errorf("the logs carry the header value:\n%s", s.logs.String())
	}

	body["headers"] = map[string]string{"Authorization": redacted}
	var e errorView
	if code := do(t, "PUT", s.URL+"/v1/endpoints/g", body, &e); code != 400 || e.Error.Code != "invalid_endpoint" || !strings.Contains(e.Error.Message, "Authorization") {
		t.Fatalf("PUT with the placeholder = %d %+v, want 400 invalid_endpoint naming the header", code, e)
	}
	rcv.mu.Lock()
	rcv.statuses = []int{400, 200}
	rcv.mu.Unlock()
	s.publish(t, "t", 2)
	waitFor(t, 20*time.Second, "the second POST", func() bool { return len(rcv.received()) == 2 })
	if got := rcv.received()[1].Header.Get("Authorization"); got != credential {
		t.Errorf("after the refused PUT the webhook got Authorization %q, want the stored value", got)
	}
}

// Header names that differ only in case are refused at PUT (400 naming both, nothing stored) and in
// PULSE_ENDPOINTS_FILE (the start stops, naming both).
func TestHeaderNamesDifferingInCaseAreRefused(t *testing.T) {
	b := setup(t)
	s := b.start(b.fastEnv())
	var e errorView
	body := `{"url":"http://127.0.0.1:9/hook","topics":["t"],"headers":{"X-Tenant":"a","x-tenant":"b"}}`
	if code := do(t, "PUT", s.URL+"/v1/endpoints/g", body, &e); code != 400 || e.Error.Code != "invalid_endpoint" ||
		!strings.Contains(e.Error.Message, `"X-Tenant"`) || !strings.Contains(e.Error.Message, `"x-tenant"`) {
		t.Fatalf("PUT = %d %+v, want 400 invalid_endpoint naming both keys", code, e)
	}
	if n := b.count("subscriptions", bson.M{}); n != 0 {
		t.Fatalf("%d endpoints stored after a refused PUT", n)
	}

	file := filepath.Join(t.TempDir(), "endpoints.yaml")
	content := "- consumerGroup: g\n  url: http://127.0.0.1:9/hook\n  topics: [t]\n  headers:\n    X-Tenant: a\n    x-tenant: b\n"
	if err := os.WriteFile(file, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	env := b.fastEnv()
	env["PULSE_ENDPOINTS_FILE"] = file
	err := run(t.Context(), nil, func(k string) string { return env[k] }, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "PULSE_ENDPOINTS_FILE") || !strings.Contains(err.Error(), `"X-Tenant"`) || !strings.Contains(err.Error(), `"x-tenant"`) {
		t.Fatalf("start with the file = %v, want an error naming the variable and both keys", err)
	}
}

// redacted is what reads show in place of an endpoint header value (pulsetype.RedactedHeaderValue).
const redacted = "<redacted>"

type errorView struct {
	Error struct{ Code, Message string }
}
