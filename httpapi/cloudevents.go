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
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"github.com/cloudevents/sdk-go/v2/types"

	"github.com/pulse-sidecar/pulse/pulsetype"
	"github.com/pulse-sidecar/pulse/webhook"
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
	for name := range h {
		if strings.HasPrefix(strings.ToLower(name), CEHeaderPrefix) {
			return true // a binary-mode event, or one without its ce-specversion, which DecodeCloudEvents names
		}
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
// it is malformed or names no attribute); only specversion "1.0" is read (400 naming what was sent otherwise);
// a structured or batch body is read whatever its insignificant whitespace; every string attribute (id, type,
// source, subject, extensions) is kept byte for byte as published, the SDK's reading serving only to validate
// (it trims binary-mode values and re-encodes source as a URL); and an event whose attributes could not be sent
// back as ce-* headers is refused (webhook.CheckCEHeaders: 400 invalid_cloudevent naming the
// attribute).
func DecodeCloudEvents(h http.Header, body []byte) (events []*pulsetype.Event, isArray bool, err error) {
	var raws []map[string]string // each event's string attributes as published, by attribute name
	// The Content-Type decides structured and batch mode, whatever ce-* headers come with them (HTTP binding
	// §3.2, §3.3; the SDK reads them so too).
	switch mt, _, _ := mime.ParseMediaType(h.Get("Content-Type")); {
	case mt == ceStructured || mt == ceBatch:
		isArray = mt == ceBatch
		var b bytes.Buffer
		if json.Compact(&b, body) == nil {
			body = b.Bytes() // the SDK's reader fails on some insignificant whitespace ("data_base64": "...")
		}
		if raws, err = structuredAttributes(body, isArray); err != nil {
			return nil, isArray, err
		}
	case h.Get("Ce-Specversion") != "":
		var raw map[string]string
		if h, raw, err = decodeCEHeaders(h); err != nil {
			return nil, false, err
		}
		raws = []map[string]string{raw}
	default:
		return nil, false, badRequest("invalid_cloudevent", "the request has ce-* headers but no ce-specversion: a binary-mode CloudEvent needs ce-specversion: 1.0 (a JSON event puts its headers in the body)")
	}
	ces, err := readCloudEvents(h, body)
	if err != nil {
		return nil, isArray, err
	}
	if isArray && len(ces) == 0 {
		return nil, true, badRequest("empty_batch", "the batch holds no events")
	}
	if len(ces) > MaxBatch {
		return nil, true, badRequest("batch_too_large", "the batch holds %d events; at most %d are allowed per request", len(ces), MaxBatch)
	}
	seen := map[string]int{}
	for i, ce := range ces {
		where := ""
		if isArray {
			where = fmt.Sprintf("events[%d]: ", i)
		}
		var raw map[string]string
		if i < len(raws) {
			raw = raws[i]
		}
		e, err := fromCloudEvent(&ce, raw)
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

// readCloudEvents reads the request's events with the SDK: one in structured or binary mode, any number in
// batch mode. It returns a *BadRequestError for what the SDK refuses, or for a request that is not a CloudEvent
// (neither a ce-specversion header nor a CloudEvents media type). A panic of the SDK on input it did not expect
// is refused the same way, never answered 500.
func readCloudEvents(h http.Header, body []byte) (ces []event.Event, err error) {
	defer func() {
		if p := recover(); p != nil {
			ces, err = nil, badRequest("invalid_cloudevent", "the CloudEvents SDK could not read the request: %v", p)
		}
	}()
	msg := cehttp.NewMessage(h, io.NopCloser(bytes.NewReader(body)))
	switch msg.ReadEncoding() {
	case binding.EncodingBatch:
		if ces, err = binding.ToEvents(context.Background(), msg, bytes.NewReader(body)); err != nil {
			return nil, badRequest("invalid_cloudevent", "the body is not a CloudEvents JSON batch: %s", sdkError(err))
		}
		return ces, nil
	case binding.EncodingStructured, binding.EncodingBinary:
		ev, err := binding.ToEvent(context.Background(), msg)
		if err != nil {
			return nil, badRequest("invalid_cloudevent", "the request is not a CloudEvent: %s", sdkError(err))
		}
		return []event.Event{*ev}, nil
	}
	return nil, badRequest("invalid_cloudevent", "the request is not a CloudEvent: no ce-specversion header and Content-Type is not %s or %s", ceStructured, ceBatch)
}

// sdkError is the SDK's error message on one line.
func sdkError(err error) string { return strings.Join(strings.Fields(err.Error()), " ") }

// ceAttributeName is what a CloudEvents attribute name may be (core spec, "Attribute Naming Convention"):
// lower-case ASCII letters and digits. Header names are case-insensitive, so a header's name is lowered first.
var ceAttributeName = regexp.MustCompile(`^[a-z0-9]+$`)

// decodeCEHeaders returns a copy of h whose ce-* headers are trimmed and percent-decoded, as the HTTP binding
// reads them (§3.1.3.2), and the decoded values by attribute name; or a *BadRequestError naming a malformed
// header, a header whose value has a byte outside ASCII (raw UTF-8 or Latin-1: the binding requires such
// characters percent-encoded as UTF-8, so the message says so), a header that names no valid attribute, or a
// specversion other than 1.0.
func decodeCEHeaders(h http.Header) (http.Header, map[string]string, error) {
	out := h.Clone()
	raw := map[string]string{}
	for name, values := range out {
		attr, ok := strings.CutPrefix(strings.ToLower(name), CEHeaderPrefix)
		if !ok {
			continue
		}
		if !ceAttributeName.MatchString(attr) {
			return nil, nil, badRequest("invalid_cloudevent", "header %q names no CloudEvents attribute: a name is lower-case letters and digits", name)
		}
		if len(values) > 1 {
			return nil, nil, badRequest("invalid_cloudevent", "header %s is given %d times: an attribute has one value", strings.ToLower(name), len(values))
		}
		for i, v := range values {
			if at := strings.IndexFunc(v, func(r rune) bool { return r >= 0x80 }); at >= 0 {
				return nil, nil, badRequest("invalid_cloudevent", "header %s: byte %d is not ASCII: header values must be percent-encoded UTF-8 (HTTP binding §3.1.3.2: %q is %s), or send the event in structured mode (Content-Type: %s), whose attributes are JSON strings",
					strings.ToLower(name), at, "ü", pulsetype.PercentEncodeHeader("ü"), ceStructured)
			}
			d, err := pulsetype.PercentDecodeHeader(v)
			if err != nil {
				return nil, nil, badRequest("invalid_cloudevent", "header %s: %v", strings.ToLower(name), err)
			}
			values[i] = d
		}
		raw[attr] = values[0]
	}
	if v := raw["specversion"]; v != "1.0" {
		return nil, nil, badRequest("invalid_cloudevent", "ce-specversion %q is not supported: the sidecar reads CloudEvents 1.0", v)
	}
	return out, raw, nil
}

// structuredAttributes returns the string members of a structured event (or of each event of a batch) by
// name, as published; or a *BadRequestError when an event's specversion is not the string "1.0" (the SDK's
// own messages name no event). A body that is not a JSON object (or array of them) gives nil, for the SDK to
// refuse.
func structuredAttributes(body []byte, isArray bool) ([]map[string]string, error) {
	var objs []map[string]json.RawMessage
	if isArray {
		if json.Unmarshal(body, &objs) != nil {
			return nil, nil
		}
	} else {
		var o map[string]json.RawMessage
		if json.Unmarshal(body, &o) != nil {
			return nil, nil
		}
		objs = []map[string]json.RawMessage{o}
	}
	raws := make([]map[string]string, len(objs))
	for i, o := range objs {
		where := ""
		if isArray {
			where = fmt.Sprintf("events[%d]: ", i)
		}
		raws[i] = map[string]string{}
		for name, v := range o {
			var str string
			if json.Unmarshal(v, &str) == nil {
				raws[i][name] = str
			}
		}
		switch v, ok := o["specversion"]; {
		case !ok:
			return nil, badRequest("invalid_cloudevent", `%sspecversion is required: the string "1.0"`, where)
		case raws[i]["specversion"] != "1.0":
			return nil, badRequest("invalid_cloudevent", `%sspecversion %s is not supported: the sidecar reads CloudEvents 1.0, the string "1.0"`, where, v)
		}
	}
	return raws, nil
}

// fromCloudEvent converts one validated CloudEvent; raw holds its string attributes as published, kept
// instead of the SDK's readings (trimmed, source re-encoded). See DecodeCloudEvents.
func fromCloudEvent(ce *event.Event, raw map[string]string) (*pulsetype.Event, error) {
	published := func(name, read string) string {
		if v, ok := raw[name]; ok {
			return v
		}
		return read
	}
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
	id, topic := published("id", ce.ID()), published("type", ce.Type())
	if !pulsetype.ValidTopic(topic) {
		return nil, badRequest("invalid_topic", "type %q becomes the topic and must match ^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$", topic)
	}
	if pulsetype.Reserved(topic) {
		return nil, badRequest("reserved_topic", "type %q becomes the topic: the prefix %q is reserved for the sidecar's operational events", topic, pulsetype.ReservedTopicPrefix)
	}
	if !pulsetype.ValidEventID(id) {
		return nil, badRequest("invalid_id", "id %q must be 1-128 characters of letters, digits, '.', '_', ':' or '-', and not . or ..", id)
	}
	if ct := ce.DataContentType(); ct != "" && !pulsetype.IsJSONMediaType(ct) {
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
	e := &pulsetype.Event{ID: id, Topic: topic, Data: data, Headers: map[string]string{}}
	put := func(name, v string) {
		if v != "" {
			e.Headers[CEHeaderPrefix+name] = v
		}
	}
	put("source", published("source", ce.Source()))
	put("subject", published("subject", ce.Subject()))
	if t := ce.Time(); !t.IsZero() {
		put("time", t.UTC().Format(time.RFC3339Nano))
	}
	put("datacontenttype", ce.DataContentType())
	put("dataschema", published("dataschema", ce.DataSchema()))
	for name, v := range ce.Extensions() {
		s, err := types.Format(v)
		if err != nil {
			return nil, badRequest("invalid_cloudevent", "extension %s: %v", name, err)
		}
		s = published(name, s)
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
	if err := webhook.CheckCEHeaders(e); err != nil {
		return nil, badRequest("invalid_cloudevent", "%v", err)
	}
	return e, nil
}
