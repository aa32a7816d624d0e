package webhook

import (
	"bytes"
	"encoding/json"
	"strings"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// Body returns the webhook request of event e in format f: the headers the body needs (Content-Type
// included for the CloudEvents formats; none for FormatEnvelope, whose Content-Type application/json the
// Client sets) and the body. FormatEnvelope, the default (and what an empty or unknown format gets), is
// Envelope; FormatCloudEvents is the CloudEvents 1.0 binary mode of cloudEvent, FormatCloudEventsStructured
// its structured mode (structuredCloudEvent). Every value comes from the stored event, so every attempt sends
// the same request. It is safe for concurrent use.
func Body(e *pulsetype.Event, f pulsetype.WebhookFormat) (headers map[string]string, body []byte) {
	switch f {
	case pulsetype.FormatCloudEvents:
		return cloudEvent(e)
	case pulsetype.FormatCloudEventsStructured:
		return structuredCloudEvent(e)
	}
	return map[string]string{}, Envelope(e)
}

// CloudEventSource is the ce-source of an event published without one (not as a CloudEvent).
const CloudEventSource = "/pulse-sidecar"

// ceAttributes returns the CloudEvents attributes of e by name, as stored (not encoded), and the media type
// of its data: specversion 1.0, id (the event id), type (the topic), source (the kept "ce-source" event
// header, else CloudEventSource), time (the kept "ce-time", else createdAt in pulsetype.TimeLayout),
// partitionkey (the ordering key) when set, and every other kept "ce-<name>" event header as <name> (subject
// among them); the data's media type is the kept datacontenttype (a JSON type), else application/json, and
// is not among the attributes. Event headers not starting with "ce-" are left out.
func ceAttributes(e *pulsetype.Event) (attrs map[string]string, contentType string) {
	attrs, contentType = map[string]string{}, "application/json"
	for k, v := range e.Headers {
		switch name, ok := strings.CutPrefix(strings.ToLower(k), "ce-"); {
		case !ok || name == "specversion":
		case name == "datacontenttype":
			if pulsetype.IsJSONMediaType(v) {
				contentType = v
			}
		default:
			attrs[name] = v
		}
	}
	attrs["specversion"] = "1.0"
	attrs["id"] = e.ID
	attrs["type"] = e.Topic
	if attrs["source"] == "" {
		attrs["source"] = CloudEventSource
	}
	if attrs["time"] == "" {
		attrs["time"] = pulsetype.FormatTime(e.CreatedAt)
	}
	if e.OrderingKey != "" {
		attrs["partitionkey"] = e.OrderingKey
	}
	return attrs, contentType
}

// cloudEvent returns the event as a CloudEvents 1.0 binary-mode request: every attribute of ceAttributes as
// a header ce-<name>, Content-Type the data's media type (in binary mode the datacontenttype, HTTP binding
// §3.1.1), and the data verbatim as the body. Every ce-* value is percent-encoded as the HTTP binding
// requires (pulsetype.PercentEncodeHeader), so a receiver's CloudEvents SDK that decodes them, as the
// binding says, reads back the values as published.
func cloudEvent(e *pulsetype.Event) (headers map[string]string, body []byte) {
	attrs, ct := ceAttributes(e)
	headers = map[string]string{"Content-Type": ct}
	for name, v := range attrs {
		headers["ce-"+name] = pulsetype.PercentEncodeHeader(v)
	}
	return headers, eventData(e)
}

// ceStructuredMediaType is the Content-Type of a structured-mode CloudEvent in the JSON event format.
const ceStructuredMediaType = "application/cloudevents+json"

// structuredCloudEvent returns the event as a CloudEvents 1.0 structured-mode request (HTTP binding §3.2,
// JSON event format): Content-Type application/cloudevents+json and one JSON object whose members are the
// attributes of ceAttributes as JSON strings, exactly as stored (no header encoding), datacontenttype (the
// data's media type) and data (the stored JSON value, verbatim). Members are in name order, so every attempt
// sends the same bytes.
func structuredCloudEvent(e *pulsetype.Event) (headers map[string]string, body []byte) {
	attrs, ct := ceAttributes(e)
	obj := make(map[string]any, len(attrs)+2)
	for name, v := range attrs {
		obj[name] = v
	}
	obj["datacontenttype"] = ct
	obj["data"] = json.RawMessage(eventData(e))
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)    // the data and attributes as stored, "<" not as "\u003c"
	if enc.Encode(obj) != nil { // not JSON: never for data validated at ingest; sent as a string rather than lost
		b.Reset()
		obj["data"] = string(eventData(e))
		_ = enc.Encode(obj)
	}
	return map[string]string{"Content-Type": ceStructuredMediaType}, bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// eventData is the stored data of e, or null when there is none.
func eventData(e *pulsetype.Event) []byte {
	if len(e.Data) == 0 {
		return []byte("null")
	}
	return e.Data
}
