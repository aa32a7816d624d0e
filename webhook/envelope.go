package webhook

import (
	"bytes"
	"encoding/json"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// envelope is the webhook body; encoding/json writes its fields in this order.
type envelope struct {
	ID          string            `json:"id"`
	Topic       string            `json:"topic"`
	CreatedAt   string            `json:"createdAt"`
	Data        json.RawMessage   `json:"data"`
	Headers     map[string]string `json:"headers"`
	OrderingKey string            `json:"orderingKey,omitempty"`
}

// Envelope returns the webhook body of event e (endpoint format pulsetype.FormatEnvelope):
// {"id","topic","createdAt","data","headers"} and "orderingKey" when set, createdAt in pulsetype.TimeLayout,
// data verbatim (null when empty), headers sorted by name, no HTML escaping. Every field comes from the
// stored event, so every attempt sends the same bytes (testdata/envelope.golden).
func Envelope(e *pulsetype.Event) []byte {
	body := envelope{ID: e.ID, Topic: e.Topic, CreatedAt: pulsetype.FormatTime(e.CreatedAt), Data: e.Data, Headers: e.Headers,
		OrderingKey: e.OrderingKey}
	if len(body.Data) == 0 {
		body.Data = json.RawMessage("null")
	}
	if body.Headers == nil {
		body.Headers = map[string]string{}
	}
	var b bytes.Buffer
	b.Grow(len(body.Data) + 256)
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(body); err != nil {
		// Only data that is not JSON fails, and publish stores compacted, valid JSON.
		body.Data = json.RawMessage("null")
		b.Reset()
		_ = enc.Encode(body)
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}
