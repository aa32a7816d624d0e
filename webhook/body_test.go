package webhook_test

import (
	"bytes"
	"maps"
	"testing"
	"time"

	"github.com/pulse-sidecar/pulse/pulsetype"
	"github.com/pulse-sidecar/pulse/webhook"
)

// Body in the envelope format is Envelope with no body headers; in the CloudEvents format it is the
// binary mode: the data as the body, the ce-* attributes from the event (its kept ce-* headers first, the
// id, topic, ordering key and creation time otherwise), and no header that is not a CloudEvents one.
func TestBody(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 2, 3, 4, 5, 6_000_000, time.UTC)
	ev := &pulsetype.Event{ID: "e-1", Topic: "order.created", Data: []byte(`{"n":1}`), CreatedAt: at, OrderingKey: "c-1",
		Headers: map[string]string{"Ce-Subject": "o-1", "ce-specversion": "0.3", "ce-datacontenttype": "text/plain", "X-Tenant": "t"}}

	for _, f := range []pulsetype.WebhookFormat{pulsetype.FormatEnvelope, ""} {
		headers, body := webhook.Body(ev, f)
		if len(headers) != 0 || !bytes.Equal(body, webhook.Envelope(ev)) {
			t.Errorf("Body(format %q) = %v, %s; want no headers and Envelope", f, headers, body)
		}
	}

	headers, body := webhook.Body(ev, pulsetype.FormatCloudEvents)
	want := map[string]string{"Content-Type": "application/json", "ce-specversion": "1.0", "ce-id": "e-1", "ce-type": "order.created",
		"ce-source": webhook.CloudEventSource, "ce-time": pulsetype.FormatTime(at), "ce-partitionkey": "c-1", "ce-subject": "o-1"}
	if !maps.Equal(headers, want) || string(body) != `{"n":1}` {
		t.Errorf("Body(cloudevents) = %v, %s; want %v, {\"n\":1}", headers, body, want)
	}

	kept := &pulsetype.Event{ID: "e-2", Topic: "t", CreatedAt: at, Headers: map[string]string{"ce-source": "/shop", "ce-time": "2020-01-01T00:00:00Z"}}
	headers, body = webhook.Body(kept, pulsetype.FormatCloudEvents)
	if headers["ce-source"] != "/shop" || headers["ce-time"] != "2020-01-01T00:00:00Z" || headers["ce-partitionkey"] != "" || string(body) != "null" {
		t.Errorf("Body(cloudevents) of an event with ce-source and ce-time, no key and no data = %v, %s", headers, body)
	}
}

// The binary-mode request sends every attribute percent-encoded once.
func TestCloudEventEncodesHeaderValues(t *testing.T) {
	t.Parallel()
	e := &pulsetype.Event{ID: "UPPER:lower", Topic: "t", OrderingKey: "k é", Headers: map[string]string{
		"ce-source": "  spaces  ", "ce-subject": "a b", "ce-pct": "100%", "tenant": "not sent"}}
	h, _ := webhook.Body(e, pulsetype.FormatCloudEvents)
	for name, want := range map[string]string{"ce-id": "UPPER:lower", "ce-source": "%20%20spaces%20%20", "ce-subject": "a%20b",
		"ce-pct": "100%25", "ce-partitionkey": "k%20%C3%A9", "ce-specversion": "1.0", "ce-type": "t"} {
		if h[name] != want {
			t.Errorf("%s = %q, want %q", name, h[name], want)
		}
	}
	if _, ok := h["ce-tenant"]; ok || h["tenant"] != "" {
		t.Errorf("a header without the ce- prefix was sent: %v", h)
	}
	// In binary mode the datacontenttype is the Content-Type (HTTP binding §3.1.1).
	e.Headers["ce-datacontenttype"] = "application/vnd.foo+json"
	if h, _ := webhook.Body(e, pulsetype.FormatCloudEvents); h["Content-Type"] != "application/vnd.foo+json" || h["ce-datacontenttype"] != "" {
		t.Errorf("datacontenttype application/vnd.foo+json sent as Content-Type %q, ce-datacontenttype %q", h["Content-Type"], h["ce-datacontenttype"])
	}
}

// In the structured format the request is one application/cloudevents+json object: every attribute a JSON
// string exactly as stored (no percent-encoding: "%20" stays "%20", "ü" stays "ü"), datacontenttype, the
// ordering key as partitionkey, and the data as a JSON value; the same bytes on every call.
func TestStructuredCloudEvent(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 2, 3, 4, 5, 6_000_000, time.UTC)
	ev := &pulsetype.Event{ID: "e-1", Topic: "order.created", Data: []byte(`{"html":"<b>&</b>"}`), CreatedAt: at, OrderingKey: "k é",
		Headers: map[string]string{"ce-subject": "Zürich – 東京", "ce-source": "/shop/a%20b", "ce-tenant": "eu", "X-Other": "no"}}
	h, body := webhook.Body(ev, pulsetype.FormatCloudEventsStructured)
	if len(h) != 1 || h["Content-Type"] != "application/cloudevents+json" {
		t.Errorf("headers %v, want only Content-Type application/cloudevents+json", h)
	}
	want := `{"data":{"html":"<b>&</b>"},"datacontenttype":"application/json","id":"e-1","partitionkey":"k é","source":"/shop/a%20b",` +
		`"specversion":"1.0","subject":"Zürich – 東京","tenant":"eu","time":"2026-01-02T03:04:05.006Z","type":"order.created"}`
	if string(body) != want {
		t.Errorf("body\n%s\nwant\n%s", body, want)
	}
	if _, again := webhook.Body(ev, pulsetype.FormatCloudEventsStructured); !bytes.Equal(again, body) {
		t.Errorf("a second call sent other bytes: %s", again)
	}
	ev.Headers["ce-datacontenttype"] = "application/vnd.foo+json"
	if _, body := webhook.Body(ev, pulsetype.FormatCloudEventsStructured); !bytes.Contains(body, []byte(`"datacontenttype":"application/vnd.foo+json"`)) {
		t.Errorf("kept datacontenttype not sent: %s", body)
	}
}
