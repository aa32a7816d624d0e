package webhook

import (
	"strings"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// Body returns the webhook request of event e in format f: the headers the body needs (Content-Type
// included for FormatCloudEvents; none for FormatEnvelope, whose Content-Type application/json the Client
// sets) and the body. FormatEnvelope, the default (and what an empty or unknown format gets), is Envelope;
// FormatCloudEvents is the CloudEvents 1.0 binary mode of cloudEvent. Every value comes from the stored
// event, so every attempt sends the same request. It is safe for concurrent use.
func Body(e *pulsetype.Event, f pulsetype.WebhookFormat) (headers map[string]string, body []byte) {
	if f == pulsetype.FormatCloudEvents {
		return cloudEvent(e)
	}
	return map[string]string{}, Envelope(e)
}

// CloudEventSource is the ce-source of an event published without one (not as a CloudEvent).
const CloudEventSource = "/pulse-sidecar"

// cloudEvent returns the event as a CloudEvents 1.0 binary-mode request: headers ce-specversion 1.0, ce-id
// (the event id), ce-type (the topic), ce-source (the kept "ce-source" event header, else CloudEventSource),
// ce-time (the kept "ce-time", else createdAt in pulsetype.TimeLayout), ce-partitionkey (the ordering key)
// when set, every other kept "ce-<name>" event header as ce-<name> (ce-subject among them), and Content-Type
// the kept datacontenttype (a JSON type), else application/json; the body is the data verbatim. Event
// headers not starting with "ce-" are not sent. Every ce-* value is percent-encoded as the HTTP binding
// requires (pulsetype.PercentEncodeHeader), so a receiver's CloudEvents SDK reads back the values as
// published.
func cloudEvent(e *pulsetype.Event) (headers map[string]string, body []byte) {
	headers = map[string]string{"Content-Type": "application/json"}
	for k, v := range e.Headers {
		switch name, ok := strings.CutPrefix(strings.ToLower(k), "ce-"); {
		case !ok || name == "specversion":
		case name == "datacontenttype": // in binary mode, the Content-Type (HTTP binding §3.1.1)
			if pulsetype.IsJSONMediaType(v) {
				headers["Content-Type"] = v
			}
		default:
			headers["ce-"+name] = v
		}
	}
	headers["ce-specversion"] = "1.0"
	headers["ce-id"] = e.ID
	headers["ce-type"] = e.Topic
	if headers["ce-source"] == "" {
		headers["ce-source"] = CloudEventSource
	}
	if headers["ce-time"] == "" {
		headers["ce-time"] = pulsetype.FormatTime(e.CreatedAt)
	}
	if e.OrderingKey != "" {
		headers["ce-partitionkey"] = e.OrderingKey
	}
	for k, v := range headers {
		if strings.HasPrefix(k, "ce-") {
			headers[k] = pulsetype.PercentEncodeHeader(v)
		}
	}
	body = e.Data
	if len(body) == 0 {
		body = []byte("null")
	}
	return headers, body
}
