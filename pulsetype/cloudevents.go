package pulsetype

import (
	"errors"
	"fmt"
	"mime"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// The CloudEvents rules shared by ingest (package httpapi) and the binary-mode webhook request (Event.CloudEvent).
//
// Header values: CloudEvents 1.0's HTTP protocol binding (§3.1.3.2) percent-encodes every attribute value sent
// as a ce-* header: each UTF-8 byte of a space, '"', '%' or a character outside printable ASCII (U+0021-U+007E)
// becomes %XX (upper-case hex). A receiver trims the value of whitespace and percent-decodes it; an escape that
// decodes to invalid UTF-8 is refused. Encoding once on the way out and decoding once on the way in makes an
// event published in binary mode the same event as one published in structured mode.
//
// String values: the core spec's String type disallows the control characters U+0000-U+001F and
// U+007F-U+009F and the Unicode noncharacters; ValidCEString checks that.
//
// Size: the binding sets no bound, but receivers do (nginx refuses a header line over 8 KiB by default, Node.js
// all headers over 16 KiB), so an event whose attributes could never be sent as headers is refused at ingest:
// each ce-* header value at most MaxCEHeaderValue bytes and all of them, names included, at most
// MaxCEHeaderBytes, counted percent-encoded as they are sent.
const (
	// MaxCEHeaderValue is the longest percent-encoded value of one ce-* header, in bytes.
	MaxCEHeaderValue = 4096
	// MaxCEHeaderBytes bounds the ce-* headers of one binary-mode request together, in bytes: for each,
	// len(name) + 2 + len(encoded value).
	MaxCEHeaderBytes = 8192
)

// PercentEncodeHeader returns v percent-encoded as the HTTP binding writes a ce-* header value (see above).
// A value that needs no escape is returned as it is.
func PercentEncodeHeader(v string) string {
	if encodedLen(v) == len(v) {
		return v
	}
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(encodedLen(v))
	for i := 0; i < len(v); i++ {
		c := v[i]
		if needsEscape(c) {
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// needsEscape reports whether the binding percent-encodes byte c of a UTF-8 value: a space, '"', '%', or
// anything outside printable ASCII (every byte of a multi-byte character among them).
func needsEscape(c byte) bool { return c <= ' ' || c == '"' || c == '%' || c >= 0x7f }

// encodedLen is len(PercentEncodeHeader(v)).
func encodedLen(v string) int {
	n := len(v)
	for i := 0; i < len(v); i++ {
		if needsEscape(v[i]) {
			n += 2
		}
	}
	return n
}

// ErrBadPercentEncoding is returned by PercentDecodeHeader for a '%' not followed by two hex digits, or escapes
// that decode to invalid UTF-8.
var ErrBadPercentEncoding = errors.New("bad percent-encoding")

// PercentDecodeHeader returns a received ce-* header value as the binding reads it: trimmed of spaces and tabs
// (RFC 9110 §5.5), then percent-decoded. Escapes of characters that needed none are accepted. It returns
// ErrBadPercentEncoding (wrapped, with the position) for a malformed escape or a result that is not valid UTF-8
// (an overlong encoding such as %C0%A0 among them).
func PercentDecodeHeader(v string) (string, error) {
	v = strings.Trim(v, " \t")
	if !strings.Contains(v, "%") {
		if !utf8.ValidString(v) {
			return "", fmt.Errorf("%w: not valid UTF-8", ErrBadPercentEncoding)
		}
		return v, nil
	}
	b := make([]byte, 0, len(v))
	for i := 0; i < len(v); i++ {
		if v[i] != '%' {
			b = append(b, v[i])
			continue
		}
		if i+2 >= len(v) || !isHex(v[i+1]) || !isHex(v[i+2]) {
			return "", fmt.Errorf("%w: '%%' at byte %d is not followed by two hex digits", ErrBadPercentEncoding, i)
		}
		b = append(b, unhex(v[i+1])<<4|unhex(v[i+2]))
		i += 2
	}
	if !utf8.Valid(b) {
		return "", fmt.Errorf("%w: the escapes decode to invalid UTF-8", ErrBadPercentEncoding)
	}
	return string(b), nil
}

func isHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' }

func unhex(c byte) byte {
	switch {
	case c >= 'a':
		return c - 'a' + 10
	case c >= 'A':
		return c - 'A' + 10
	}
	return c - '0'
}

// ValidCEString reports why v is not a CloudEvents String (core spec, "Type System"): "" when it is valid
// UTF-8 without control characters (U+0000-U+001F, U+007F-U+009F) and without noncharacters (U+FDD0-U+FDEF and
// every code point ending in FFFE or FFFF), else what the first offending character is.
func ValidCEString(v string) string {
	if !utf8.ValidString(v) {
		return "not valid UTF-8"
	}
	for _, r := range v {
		switch {
		case r <= 0x1f || r >= 0x7f && r <= 0x9f:
			return fmt.Sprintf("control character %U", r)
		case r >= 0xfdd0 && r <= 0xfdef || r&0xfffe == 0xfffe:
			return fmt.Sprintf("noncharacter %U", r)
		}
	}
	return ""
}

// ceSetBySidecar are the attributes a binary-mode request takes from the event itself (id, topic, ordering
// key) or fixes (specversion): an event header of the same name would be replaced, so none may be kept.
var ceSetBySidecar = map[string]string{"id": "the event's id", "type": "the topic", "specversion": `"1.0"`, "partitionkey": "orderingKey"}

// CheckCEHeaders returns an error naming the first attribute of e that could not be sent as a ce-* header
// of a binary-mode request (see Event.CloudEvent), or that a receiver's CloudEvents SDK would refuse: an event
// header "ce-<name>" whose name is not lower-case letters and digits (case aside), is one the request sets
// itself (id, type, specversion, partitionkey), or is given twice in other letter cases; a time that is not RFC 3339, a source that is not a URI
// reference, a dataschema that is not an absolute URI, a datacontenttype that is not JSON; a value that is not a
// CloudEvents String, longer than MaxCEHeaderValue bytes percent-encoded, or headers that together pass
// MaxCEHeaderBytes. Publishing checks it for every event, whatever its format, so that no stored event is
// undeliverable to a cloudevents endpoint.
func (e *Event) CheckCEHeaders() error {
	seen := map[string]string{}
	for _, k := range sortedKeys(e.Headers) {
		v := e.Headers[k]
		attr, ok := strings.CutPrefix(strings.ToLower(k), "ce-")
		if !ok {
			continue
		}
		if other, dup := seen[attr]; dup {
			return fmt.Errorf("headers %q and %q name the same CloudEvents attribute (header names ignore case)", other, k)
		}
		seen[attr] = k
		if attr == "" || strings.Trim(attr, "abcdefghijklmnopqrstuvwxyz0123456789") != "" {
			return fmt.Errorf("header %q names no CloudEvents attribute: after ce- come lower-case letters and digits", k)
		}
		if what, set := ceSetBySidecar[attr]; set {
			return fmt.Errorf("header %q: the CloudEvents %s is set from %s", k, attr, what)
		}
		if why := ceFormat(attr, v); why != "" {
			return fmt.Errorf("attribute %s: %s", attr, why)
		}
	}
	headers, _ := e.CloudEvent()
	total := 0
	for _, name := range sortedKeys(headers) {
		attr, ok := strings.CutPrefix(name, "ce-")
		if !ok {
			continue
		}
		raw := e.ceValue(attr, headers[name])
		if why := ValidCEString(raw); why != "" {
			return fmt.Errorf("attribute %s: %s", attr, why)
		}
		n := len(headers[name])
		if n > MaxCEHeaderValue {
			return fmt.Errorf("attribute %s: %d bytes as a ce-%s header (percent-encoded); at most %d", attr, n, attr, MaxCEHeaderValue)
		}
		total += len(name) + 2 + n
	}
	if total > MaxCEHeaderBytes {
		return fmt.Errorf("attributes: %d bytes as ce-* headers (percent-encoded); at most %d together", total, MaxCEHeaderBytes)
	}
	return nil
}

// ceValue returns the unencoded value of attribute attr, whose header value is sent.
func (e *Event) ceValue(attr, sent string) string {
	switch attr {
	case "id":
		return e.ID
	case "type":
		return e.Topic
	case "partitionkey":
		return e.OrderingKey
	}
	for k, v := range e.Headers {
		if strings.EqualFold(k, "ce-"+attr) {
			return v
		}
	}
	return sent // a default of CloudEvent (source, time): ASCII
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// ceFormat says why v is not a value of the typed attribute attr (core spec, "Context Attributes"), or "".
func ceFormat(attr, v string) string {
	switch attr {
	case "time":
		if _, err := time.Parse(time.RFC3339Nano, v); err != nil {
			return "not an RFC 3339 time"
		}
	case "source":
		if _, err := url.Parse(v); err != nil || v == "" {
			return "not a URI reference"
		}
	case "dataschema":
		if u, err := url.Parse(v); err != nil || !u.IsAbs() {
			return "not an absolute URI"
		}
	case "datacontenttype":
		if !IsJSONMediaType(v) {
			return "not a JSON media type (application/json, text/json or a +json type): the data is stored as JSON"
		}
	}
	return ""
}

// IsJSONMediaType reports whether media type ct holds JSON: application/json, text/json or any +json type,
// with or without parameters.
func IsJSONMediaType(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && (mt == "application/json" || mt == "text/json" || strings.HasSuffix(mt, "+json"))
}
