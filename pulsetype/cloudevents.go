package pulsetype

import (
	"errors"
	"fmt"
	"mime"
	"strings"
	"unicode/utf8"
)

// The CloudEvents rules shared by ingest (package httpapi) and the binary-mode webhook request (webhook.Body).
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

// IsJSONMediaType reports whether media type ct holds JSON: application/json, text/json or any +json type,
// with or without parameters.
func IsJSONMediaType(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && (mt == "application/json" || mt == "text/json" || strings.HasSuffix(mt, "+json"))
}
