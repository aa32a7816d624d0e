package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"github.com/cloudevents/sdk-go/v2/types"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// The media types of CloudEvents 1.0 over HTTP: structured mode (one event as the body) and batch mode (a
// JSON array of events). Binary mode is any request with a ce-specversion header; its Content-Type is the
// event's datacontenttype.
const (
	ceStructured = "application/cloudevents+json"
	ceBatch      = "application/cloudevents-batch+json"
)

// CEHeaderPrefix starts the event header keys that keep a CloudEvent's attributes besides id, type and data:
// "ce-source", "ce-subject", "ce-time", "ce-datacontenttype", "ce-dataschema" and "ce-<extension>".
const CEHeaderPrefix = "ce-"

// ceOrderingKey is the CloudEvents partitioning extension; its value becomes the event's ordering key.
const ceOrderingKey = "partitionkey"

// isCloudEvents reports whether a publish request carries CloudEvents (structured, batch or binary mode).
func isCloudEvents(h http.Header) bool {
	if h.Get("Ce-Specversion") != "" {
		return true
	}
	mt, _, _ := mime.ParseMediaType(h.Get("Content-Type"))
	return mt == ceStructured || mt == ceBatch
}

// DecodeCloudEvents parses a CloudEvents 1.0 publish request, header h and body (read in full), with the
// CloudEvents SDK: structured mode, batch mode (1 to MaxBatch events; isArray true) or binary mode. Each
// event's type becomes the topic, id the event id, data the data (which must be JSON: datacontenttype absent,
// application/json or a +json type), the partitionkey extension the ordering key, and every other attribute
// an event header CEHeaderPrefix+name with its canonical string value (time in RFC 3339, UTC). It returns a
// *BadRequestError naming the problem: 400 invalid_cloudevent for a body the SDK cannot read or an event
// missing required attributes (named), 400 invalid_topic / invalid_id / invalid_ordering_key / duplicate_id
// as for JSON events, 415 for data that is not JSON.
//
// The HTTP binding's rules that the SDK leaves to its caller are kept here: in binary mode every ce-* header
// is trimmed and percent-decoded before it is read (pulsetype.PercentDecodeHeader; 400 naming the header when
// it is malformed); only specversion 1.0 is read (400 naming the version otherwise); a structured or batch body
// is read whatever its insignificant whitespace; source and id are kept byte for byte as published (the SDK
// would re-encode source as a URL); and an event whose attributes could not be sent back as ce-* headers is
// refused (pulsetype.Event.CheckCEHeaders: 400 invalid_cloudevent naming the attribute).
func DecodeCloudEvents(h http.Header, body []byte) (events []*pulsetype.Event, isArray bool, err error) {
	binary := h.Get("Ce-Specversion") != ""
	if binary {
		if h, err = decodeCEHeaders(h); err != nil {
			return nil, false, err
		}
	} else {
		var b bytes.Buffer
		if json.Compact(&b, body) == nil {
			body = b.Bytes() // the SDK's reader fails on some insignificant whitespace ("data_base64": "...")
		}
	}
	msg := cehttp.NewMessage(h, io.NopCloser(bytes.NewReader(body)))
	var ces []event.Event
	var sources []*string // each event's source as published, where it was a string
	switch msg.ReadEncoding() {
	case binding.EncodingBatch:
		isArray = true
		if ces, err = binding.ToEvents(context.Background(), msg, bytes.NewReader(body)); err != nil {
			return nil, true, badRequest("invalid_cloudevent", "the body is not a CloudEvents JSON batch: %v", err)
		}
		if len(ces) == 0 {
			return nil, true, badRequest("empty_batch", "the batch holds no events")
		}
		if len(ces) > MaxBatch {
			return nil, true, badRequest("batch_too_large", "the batch holds %d events; at most %d are allowed per request", len(ces), MaxBatch)
		}
		var objs []map[string]json.RawMessage
		if json.Unmarshal(body, &objs) == nil && len(objs) == len(ces) {
			for i, o := range objs {
				if err := specVersion(o, fmt.Sprintf("events[%d]: ", i)); err != nil {
					return nil, true, err
				}
				sources = append(sources, stringMember(o, "source"))
			}
		}
	case binding.EncodingStructured:
		var o map[string]json.RawMessage
		if json.Unmarshal(body, &o) == nil {
			if err := specVersion(o, ""); err != nil {
				return nil, false, err
			}
			sources = []*string{stringMember(o, "source")}
		}
		ev, err := binding.ToEvent(context.Background(), msg)
		if err != nil {
			return nil, false, badRequest("invalid_cloudevent", "the request is not a CloudEvent: %v", err)
		}
		ces = []event.Event{*ev}
	case binding.EncodingBinary:
		ev, err := binding.ToEvent(context.Background(), msg)
		if err != nil {
			return nil, false, badRequest("invalid_cloudevent", "the request is not a CloudEvent: %v", err)
		}
		ces = []event.Event{*ev}
		if src, ok := h["Ce-Source"]; ok && len(src) > 0 {
			sources = []*string{&src[0]}
		}
	default:
		return nil, false, badRequest("invalid_cloudevent", "the request is not a CloudEvent: no ce-specversion header and Content-Type is not %s or %s", ceStructured, ceBatch)
	}
	seen := map[string]int{}
	for i, ce := range ces {
		where := ""
		if isArray {
			where = fmt.Sprintf("events[%d]: ", i)
		}
		var source *string
		if i < len(sources) {
			source = sources[i]
		}
		e, err := fromCloudEvent(&ce, source)
		if err != nil {
			var br *BadRequestError
			errors.As(err, &br)
			br.Message = where + br.Message
			return nil, isArray, br
		}
		if j, dup := seen[e.ID]; dup {
			return nil, isArray, badRequest("duplicate_id", "events[%d] and events[%d] have the same id %q", j, i, e.ID)
		}
		seen[e.ID] = i
		events = append(events, e)
	}
	return events, isArray, nil
}

// decodeCEHeaders returns a copy of h whose ce-* headers are trimmed and percent-decoded, as the HTTP binding
// reads them (§3.1.3.2), or a *BadRequestError naming a malformed one or a specversion other than 1.0.
func decodeCEHeaders(h http.Header) (http.Header, error) {
	out := h.Clone()
	for name, values := range out {
		if !strings.HasPrefix(strings.ToLower(name), CEHeaderPrefix) {
			continue
		}
		for i, v := range values {
			d, err := pulsetype.PercentDecodeHeader(v)
			if err != nil {
				return nil, badRequest("invalid_cloudevent", "header %s: %v", strings.ToLower(name), err)
			}
			values[i] = d
		}
	}
	if v := out.Get("Ce-Specversion"); v != "1.0" {
		return nil, badRequest("invalid_cloudevent", "ce-specversion %q is not supported: the sidecar reads CloudEvents 1.0", v)
	}
	return out, nil
}

// specVersion returns a *BadRequestError when a structured event's specversion is a string other than "1.0"
// (the SDK would report it as missing); where prefixes the message.
func specVersion(o map[string]json.RawMessage, where string) error {
	if v := stringMember(o, "specversion"); v != nil && *v != "1.0" {
		return badRequest("invalid_cloudevent", "%sspecversion %q is not supported: the sidecar reads CloudEvents 1.0", where, *v)
	}
	return nil
}

// stringMember returns the string value of member name of a JSON object, or nil when it is absent or not a
// string.
func stringMember(o map[string]json.RawMessage, name string) *string {
	var v string
	if raw, ok := o[name]; !ok || json.Unmarshal(raw, &v) != nil {
		return nil
	}
	return &v
}

// fromCloudEvent converts one validated CloudEvent; source, when not nil, is its source as published, kept
// instead of the SDK's re-encoded URL. See DecodeCloudEvents.
func fromCloudEvent(ce *event.Event, source *string) (*pulsetype.Event, error) {
	if err := ce.Validate(); err != nil {
		var ve event.ValidationError
		if errors.As(err, &ve) {
			names := make([]string, 0, len(ve))
			for k, v := range ve {
				names = append(names, k+" ("+v.Error()+")")
			}
			slices.Sort(names)
			return nil, badRequest("invalid_cloudevent", "invalid CloudEvent attributes: %s", strings.Join(names, ", "))
		}
		return nil, badRequest("invalid_cloudevent", "invalid CloudEvent: %v", err)
	}
	if !pulsetype.ValidTopic(ce.Type()) {
		return nil, badRequest("invalid_topic", "type %q becomes the topic and must match ^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$", ce.Type())
	}
	if !pulsetype.ValidEventID(ce.ID()) {
		return nil, badRequest("invalid_id", "id %q must be 1-128 characters of letters, digits, '.', '_', ':' or '-'", ce.ID())
	}
	if ct := ce.DataContentType(); ct != "" && !isJSONType(ct) {
		return nil, &BadRequestError{Status: http.StatusUnsupportedMediaType, Code: "unsupported_media_type",
			Message: fmt.Sprintf("datacontenttype %q: the sidecar stores JSON data only (application/json or a +json type)", ct)}
	}
	data := []byte("null")
	if raw := ce.Data(); len(raw) > 0 {
		var b bytes.Buffer
		if !utf8.Valid(raw) || json.Compact(&b, raw) != nil {
			return nil, badRequest("invalid_json", "data is not valid JSON")
		}
		data = b.Bytes()
	}
	e := &pulsetype.Event{ID: ce.ID(), Topic: ce.Type(), Data: data, Headers: map[string]string{}}
	put := func(name, v string) {
		if v != "" {
			e.Headers[CEHeaderPrefix+name] = v
		}
	}
	if source != nil {
		put("source", *source)
	} else {
		put("source", ce.Source())
	}
	put("subject", ce.Subject())
	if t := ce.Time(); !t.IsZero() {
		put("time", t.UTC().Format(time.RFC3339Nano))
	}
	put("datacontenttype", ce.DataContentType())
	put("dataschema", ce.DataSchema())
	for name, v := range ce.Extensions() {
		s, err := types.Format(v)
		if err != nil {
			return nil, badRequest("invalid_cloudevent", "extension %s: %v", name, err)
		}
		if name == ceOrderingKey {
			if n := utf8.RuneCountInString(s); n == 0 || n > pulsetype.MaxOrderingKey {
				return nil, badRequest("invalid_ordering_key", "partitionkey (the orderingKey) must be 1-%d characters, not %d", pulsetype.MaxOrderingKey, n)
			}
			e.OrderingKey = s
			continue
		}
		put(name, s)
	}
	if len(e.Headers) > MaxEventHeaders {
		return nil, badRequest("invalid_headers", "the event has %d attributes besides id, type and data; at most %d", len(e.Headers), MaxEventHeaders)
	}
	for k := range e.Headers {
		if !eventHeaderKey.MatchString(k) {
			return nil, badRequest("invalid_headers", "attribute name %q must be letters, digits, '_' or '-'", strings.TrimPrefix(k, CEHeaderPrefix))
		}
	}
	if err := e.CheckCEHeaders(); err != nil {
		return nil, badRequest("invalid_cloudevent", "%v", err)
	}
	return e, nil
}

// isJSONType reports whether a media type holds JSON: application/json, text/json or any +json type.
func isJSONType(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && (mt == "application/json" || mt == "text/json" || strings.HasSuffix(mt, "+json"))
}
