package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"

	"github.com/pulse-sidecar/pulse/e2e/internal/harness"
	"github.com/pulse-sidecar/pulse/internal/testwait"
	"github.com/pulse-sidecar/pulse/pulsetype"
)

// postCE POSTs body to /v1/events with the given headers and returns the status and the decoded answer.
func postCE(t *testing.T, url string, header map[string]string, body string, out any) int {
	t.Helper()
	req, err := http.NewRequest("POST", url+"/v1/events", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatalf("answer %d is not JSON: %q", resp.StatusCode, raw)
		}
	}
	return resp.StatusCode
}

// CloudEvents 1.0 in structured, batch and binary mode become events: type the topic, id the id, data the
// data, partitionkey the ordering key, the other attributes event headers ce-*, all delivered to the webhook.
func TestCloudEventsIn(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv())
	rcv := harness.NewReceiver(t, 200)
	s.RegisterEndpoint(t, "g", map[string]any{"url": rcv.URL, "topics": []string{"order.created"}})
	structured := `{"specversion":"1.0","id":"ce-1","type":"order.created","source":"/shop","subject":"o-1",
		"time":"2025-03-01T12:00:00Z","datacontenttype":"application/json","tenant":"eu","data":{"n":1}}`
	if code := postCE(t, s.URL, map[string]string{"Content-Type": "application/cloudevents+json"}, structured, nil); code != 202 {
		t.Fatalf("structured mode answered %d", code)
	}
	batch := `[{"specversion":"1.0","id":"ce-2","type":"order.created","source":"/shop","data":{"n":2}},
		{"specversion":"1.0","id":"ce-3","type":"order.created","source":"/shop","partitionkey":"c-9","data":[3]}]`
	var out []struct{ ID string }
	if code := postCE(t, s.URL, map[string]string{"Content-Type": "application/cloudevents-batch+json"}, batch, &out); code != 202 || len(out) != 2 {
		t.Fatalf("batch mode answered %d %v", code, out)
	}
	binary := map[string]string{"Ce-Specversion": "1.0", "Ce-Id": "ce-4", "Ce-Type": "order.created",
		"Ce-Source": "/shop", "Ce-Subject": "o-4", "Content-Type": "application/json"}
	if code := postCE(t, s.URL, binary, `{"n":4}`, nil); code != 202 {
		t.Fatalf("binary mode answered %d", code)
	}
	testwait.Eventually(t, 20*time.Second, "four POSTs", func() bool { return len(orderOf(rcv)) == 4 })
	got := map[string]struct {
		Topic, OrderingKey string
		Data               json.RawMessage
		Headers            map[string]string
	}{}
	for _, r := range rcv.Received() {
		var env struct {
			ID, Topic, OrderingKey string
			Data                   json.RawMessage
			Headers                map[string]string
		}
		if err := json.Unmarshal(r.Body, &env); err != nil {
			t.Fatal(err)
		}
		got[env.ID] = struct {
			Topic, OrderingKey string
			Data               json.RawMessage
			Headers            map[string]string
		}{env.Topic, env.OrderingKey, env.Data, env.Headers}
	}
	e1 := got["ce-1"]
	if e1.Topic != "order.created" || string(e1.Data) != `{"n":1}` || e1.Headers["ce-source"] != "/shop" || e1.Headers["ce-subject"] != "o-1" ||
		e1.Headers["ce-time"] != "2025-03-01T12:00:00Z" || e1.Headers["ce-datacontenttype"] != "application/json" || e1.Headers["ce-tenant"] != "eu" {
		t.Errorf("structured event delivered as %+v", e1)
	}
	if e3 := got["ce-3"]; e3.OrderingKey != "c-9" || string(e3.Data) != `[3]` {
		t.Errorf("batch event ce-3 delivered as %+v", e3)
	}
	if e4 := got["ce-4"]; string(e4.Data) != `{"n":4}` || e4.Headers["ce-subject"] != "o-4" || e4.Headers["ce-source"] != "/shop" {
		t.Errorf("binary event delivered as %+v", e4)
	}
	// The same id and attributes again is an idempotent re-publish.
	if code := postCE(t, s.URL, binary, `{"n":4}`, nil); code != 200 {
		t.Errorf("binary re-publish answered %d, want 200", code)
	}
}

// A CloudEvent missing required attributes, or with data that is not JSON, is refused naming the problem.
func TestCloudEventsInRejects(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv())
	for _, tc := range []struct {
		name   string
		header map[string]string
		body   string
		status int
		code   string
		names  []string
	}{
		{"structured without id and source", map[string]string{"Content-Type": "application/cloudevents+json"},
			`{"specversion":"1.0","type":"t","data":1}`, 400, "invalid_cloudevent", []string{"id", "source"}},
		{"binary without type", map[string]string{"Ce-Specversion": "1.0", "Ce-Id": "x", "Ce-Source": "/s", "Content-Type": "application/json"},
			`1`, 400, "invalid_cloudevent", []string{"type"}},
		{"batch with a bad event", map[string]string{"Content-Type": "application/cloudevents-batch+json"},
			`[{"specversion":"1.0","id":"a","type":"t","source":"/s"},{"specversion":"1.0","id":"b","source":"/s"}]`, 400, "invalid_cloudevent", []string{"events[1]", "type"}},
		{"type that is no topic", map[string]string{"Content-Type": "application/cloudevents+json"},
			`{"specversion":"1.0","id":"a","type":"has space","source":"/s"}`, 400, "invalid_topic", []string{"type"}},
		{"text data", map[string]string{"Ce-Specversion": "1.0", "Ce-Id": "x", "Ce-Type": "t", "Ce-Source": "/s", "Content-Type": "text/plain"},
			`hello`, 415, "unsupported_media_type", []string{"datacontenttype"}},
		{"malformed structured body", map[string]string{"Content-Type": "application/cloudevents+json"},
			`{"specversion":`, 400, "invalid_cloudevent", nil},
	} {
		var e struct {
			Error struct{ Code, Message string }
		}
		code := postCE(t, s.URL, tc.header, tc.body, &e)
		if code != tc.status || e.Error.Code != tc.code {
			t.Errorf("%s: got %d %+v, want %d %s", tc.name, code, e.Error, tc.status, tc.code)
		}
		for _, n := range tc.names {
			if !strings.Contains(e.Error.Message, n) {
				t.Errorf("%s: message %q does not name %s", tc.name, e.Error.Message, n)
			}
		}
	}
	if n := b.Count("events", map[string]any{}); n != 0 {
		t.Fatalf("%d events stored after rejected CloudEvents", n)
	}
}

// An endpoint with "format": "cloudevents" receives binary-mode CloudEvents that the SDK reads back: ce-id,
// ce-type, ce-source, ce-specversion, ce-time, ce-subject and the data as the body, with Idempotency-Key and
// a signature, the same bytes and headers on the retry.
func TestCloudEventsOut(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv())
	rcv := harness.NewReceiver(t, 500, 200)
	secret := "whsec_" + base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef"))
	s.RegisterEndpoint(t, "ce", map[string]any{"url": rcv.URL, "topics": []string{"order.created"}, "format": "cloudevents",
		"retryDelay": "1ms", "secret": secret})
	binary := map[string]string{"Ce-Specversion": "1.0", "Ce-Id": "o-7", "Ce-Type": "order.created",
		"Ce-Source": "/shop", "Ce-Subject": "o-7", "Ce-Tenant": "eu", "Content-Type": "application/json"}
	if code := postCE(t, s.URL, binary, `{"n": 7}`, nil); code != 202 {
		t.Fatalf("publish answered %d", code)
	}
	testwait.Eventually(t, 20*time.Second, "the failed POST and its retry", func() bool { return len(rcv.Received()) == 2 })
	got := rcv.Received()
	first, retry := got[0], got[1]
	if !bytes.Equal(first.Body, retry.Body) || string(first.Body) != `{"n":7}` {
		t.Errorf("bodies %q and %q, want {\"n\":7} twice", first.Body, retry.Body)
	}
	for _, h := range []string{"Ce-Id", "Ce-Type", "Ce-Source", "Ce-Specversion", "Ce-Time", "Ce-Subject", "Ce-Tenant", "Content-Type", "Idempotency-Key"} {
		if first.Header.Get(h) == "" || first.Header.Get(h) != retry.Header.Get(h) {
			t.Errorf("header %s: %q then %q, want the same non-empty value", h, first.Header.Get(h), retry.Header.Get(h))
		}
	}
	// The signature covers webhook-timestamp, the time of each attempt (Standard Webhooks): both attempts
	// carry one, the same where their timestamps are the same second.
	sig1, sig2 := first.Header.Get("Webhook-Signature"), retry.Header.Get("Webhook-Signature")
	if sig1 == "" || sig2 == "" || (first.Header.Get("Webhook-Timestamp") == retry.Header.Get("Webhook-Timestamp")) != (sig1 == sig2) {
		t.Errorf("webhook-signature %q then %q at webhook-timestamp %q then %q: want one each, equal exactly when the timestamps are",
			sig1, sig2, first.Header.Get("Webhook-Timestamp"), retry.Header.Get("Webhook-Timestamp"))
	}
	msg := cehttp.NewMessage(retry.Header, io.NopCloser(bytes.NewReader(retry.Body)))
	ev, err := binding.ToEvent(context.Background(), msg)
	if err != nil {
		t.Fatalf("the SDK does not read the POST as a CloudEvent: %v", err)
	}
	if err := ev.Validate(); err != nil || ev.ID() != "o-7" || ev.Type() != "order.created" || ev.Source() != "/shop" ||
		ev.Subject() != "o-7" || ev.Extensions()["tenant"] != "eu" || ev.Time().IsZero() || string(ev.Data()) != `{"n":7}` {
		t.Errorf("read back %v (validate: %v)", ev, err)
	}
	// An event published as plain JSON gets the default source and its createdAt as time.
	if code := harness.Do(t, "POST", s.URL+"/v1/events", map[string]any{"topic": "order.created", "data": 1, "orderingKey": "c-1"}, nil); code != 202 {
		t.Fatalf("JSON publish answered %d", code)
	}
	testwait.Eventually(t, 20*time.Second, "the JSON event", func() bool { return len(rcv.Received()) == 3 })
	h := rcv.Received()[2].Header
	if h.Get("Ce-Source") != "/pulse-sidecar" || h.Get("Ce-Time") == "" || h.Get("Ce-Partitionkey") != "c-1" || h.Get("Ce-Specversion") != "1.0" {
		t.Errorf("JSON event sent with ce headers %v", h)
	}
	var e struct {
		Error struct{ Code, Message string }
	}
	if code := harness.Do(t, "PUT", s.URL+"/v1/endpoints/bad", map[string]any{"url": rcv.URL, "topics": []string{"t"}, "format": "xml"}, &e); code != 400 ||
		!strings.Contains(e.Error.Message, "format") {
		t.Errorf("format xml answered %d %+v", code, e.Error)
	}
}

// The same event arrives the same whatever mode it was published in: binary-mode headers are percent-decoded
// on the way in and every ce-* value is percent-encoded once on the way out (the HTTP binding, §3.1.3.2), so
// a receiver decoding the headers reads the attributes as published, source byte for byte. An envelope
// receiver gets them unencoded in the body.
func TestCloudEventsArriveTheSameInEveryMode(t *testing.T) {
	b := harness.Setup(t)
	s := b.Start(b.FastEnv())
	ce, env := harness.NewReceiver(t, 200), harness.NewReceiver(t, 200)
	s.RegisterEndpoint(t, "ce", map[string]any{"url": ce.URL, "topics": []string{"order.created"}, "format": "cloudevents"})
	s.RegisterEndpoint(t, "env", map[string]any{"url": env.URL, "topics": []string{"order.created"}})
	const source, subject, pct = "https://Example.COM/Path/ é", "a b", "100%"
	binary := map[string]string{"Ce-Specversion": "1.0", "Ce-Id": "bin-1", "Ce-Type": "order.created", "Content-Type": "application/json",
		"Ce-Source": "https://Example.COM/Path/%20%C3%A9", "Ce-Subject": "a%20b", "Ce-Pct": "100%25"}
	if code := postCE(t, s.URL, binary, `{"n":1}`, nil); code != 202 {
		t.Fatalf("binary publish answered %d", code)
	}
	structured := `{"specversion":"1.0","id":"str-1","type":"order.created","source":"https://Example.COM/Path/ é","subject":"a b","pct":"100%","data":{"n":1}}`
	if code := postCE(t, s.URL, map[string]string{"Content-Type": "application/cloudevents+json"}, structured, nil); code != 202 {
		t.Fatalf("structured publish answered %d", code)
	}
	testwait.Eventually(t, 30*time.Second, "both events at both receivers", func() bool { return len(ce.Received()) == 2 && len(env.Received()) == 2 })
	for _, r := range ce.Received() {
		for name, want := range map[string]string{"Ce-Source": "https://Example.COM/Path/%20%C3%A9", "Ce-Subject": "a%20b", "Ce-Pct": "100%25"} {
			if got := r.Header.Get(name); got != want {
				t.Errorf("event %s: %s: %q, want %q (encoded once)", r.Header.Get("Ce-Id"), name, got, want)
			}
		}
		if got, err := pulsetype.PercentDecodeHeader(r.Header.Get("Ce-Source")); err != nil || got != source {
			t.Errorf("event %s: ce-source decodes to %q, %v; want %q", r.Header.Get("Ce-Id"), got, err, source)
		}
	}
	for _, r := range env.Received() {
		var body struct{ Headers map[string]string }
		if err := json.Unmarshal(r.Body, &body); err != nil {
			t.Fatal(err)
		}
		if body.Headers["ce-source"] != source || body.Headers["ce-subject"] != subject || body.Headers["ce-pct"] != pct {
			t.Errorf("envelope headers %v, want source %q, subject %q, pct %q as published", body.Headers, source, subject, pct)
		}
	}
}

// cloudEventsJS is the directory of the pinned CloudEvents JavaScript SDK (package.json, package-lock.json) and
// of toevent.js, which decodes one request with the SDK's HTTP.toEvent; .ci/run installs it with npm ci.
const cloudEventsJS = "testdata/cloudevents-js"

// An endpoint in the cloudevents-structured format receives one application/cloudevents+json object, and the
// CloudEvents JavaScript SDK (npm cloudevents 10.0.0, which reads binary-mode ce-* headers without
// percent-decoding them) reads back every attribute exactly as published: a non-ASCII subject, a source with
// a literal %20, an extension, the time, the dataschema, the ordering key as partitionkey, and the data.
// Skipped, saying why, without node or without the SDK installed in testdata/cloudevents-js.
func TestCloudEventsStructuredDeliveryReadByJavaScriptSDK(t *testing.T) {
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("node is not installed: the CloudEvents JavaScript SDK is not run")
	}
	if _, err := os.Stat(filepath.Join(cloudEventsJS, "node_modules", "cloudevents", "package.json")); err != nil {
		t.Skipf("the CloudEvents JavaScript SDK is not installed (%v): run npm ci --prefix e2e/%s, as .ci/run does", err, cloudEventsJS)
	}
	b := harness.Setup(t)
	s := b.Start(b.FastEnv())
	rcv := harness.NewReceiver(t, 200)
	s.RegisterEndpoint(t, "g", map[string]any{"url": rcv.URL, "topics": []string{"order.created"}, "format": "cloudevents-structured"})
	published := map[string]any{"specversion": "1.0", "id": "ce-js-1", "type": "order.created", "source": "/shop/a%20b",
		"subject": "Zürich – 東京", "time": "2025-03-01T12:00:00.123Z", "dataschema": "https://example.com/schemas/order%201",
		"datacontenttype": "application/json", "tenant": "eu west", "partitionkey": "c-9 é",
		"data": map[string]any{"orderId": "o-1", "note": "100% <b>&</b>"}}
	body, err := json.Marshal(published)
	if err != nil {
		t.Fatal(err)
	}
	if code := postCE(t, s.URL, map[string]string{"Content-Type": "application/cloudevents+json"}, string(body), nil); code != 202 {
		t.Fatalf("structured publish answered %d", code)
	}
	testwait.Eventually(t, 20*time.Second, "the structured-mode POST", func() bool { return len(rcv.Received()) >= 1 })
	got := rcv.Received()[0]
	headers := map[string]string{}
	for k := range got.Header {
		headers[strings.ToLower(k)] = got.Header.Get(k)
	}
	if headers["content-type"] != "application/cloudevents+json" {
		t.Errorf("Content-Type %q, want application/cloudevents+json", headers["content-type"])
	}
	in, err := json.Marshal(map[string]any{"headers": headers, "body": string(got.Body)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "toevent.js")
	cmd.Dir, cmd.Stdin = cloudEventsJS, bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("HTTP.toEvent refused the delivery: %v\n%s\nbody: %s", err, stderr.String(), got.Body)
	}
	var read map[string]any
	if err := json.Unmarshal(out, &read); err != nil {
		t.Fatalf("toevent.js wrote %q: %v", out, err)
	}
	for name, want := range published {
		if name == "data" {
			continue
		}
		if read[name] != want {
			t.Errorf("the SDK read %s = %#v, want %#v as published", name, read[name], want)
		}
	}
	wantData, _ := json.Marshal(published["data"])
	if gotData, _ := json.Marshal(read["data"]); !bytes.Equal(gotData, wantData) {
		t.Errorf("the SDK read data %s, want %s", gotData, wantData)
	}
	for name := range read {
		if _, ok := published[name]; !ok {
			t.Errorf("the SDK read attribute %s = %#v, which was not published", name, read[name])
		}
	}
}
