package webhook

import (
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// ceSetBySidecar are the attributes a binary-mode request takes from the event itself (id, topic, ordering
// key) or fixes (specversion): an event header of the same name would be replaced, so none may be kept.
var ceSetBySidecar = map[string]string{"id": "the event's id", "type": "the topic", "specversion": `"1.0"`, "partitionkey": "orderingKey"}

// CheckCEHeaders returns an error naming the first attribute of e that could not be sent as a ce-* header
// of a binary-mode request (Body in pulsetype.FormatCloudEvents), or that a receiver's CloudEvents SDK would
// refuse: an event header "ce-<name>" whose name is not lower-case letters and digits (case aside), is one
// the request sets itself (id, type, specversion, partitionkey), or is given twice in other letter cases; a
// time that is not RFC 3339, a source that is not a URI reference, a dataschema that is not an absolute URI,
// a datacontenttype that is not JSON; a value that is not a CloudEvents String, longer than
// pulsetype.MaxCEHeaderValue bytes percent-encoded, or headers that together pass
// pulsetype.MaxCEHeaderBytes. Publishing (package httpapi) checks it for every event, whatever its format,
// so that no stored event is undeliverable to a cloudevents endpoint.
func CheckCEHeaders(e *pulsetype.Event) error {
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
	headers, _ := cloudEvent(e)
	total := 0
	for _, name := range sortedKeys(headers) {
		attr, ok := strings.CutPrefix(name, "ce-")
		if !ok {
			continue
		}
		raw := ceValue(e, attr, headers[name])
		if why := pulsetype.ValidCEString(raw); why != "" {
			return fmt.Errorf("attribute %s: %s", attr, why)
		}
		n := len(headers[name])
		if n > pulsetype.MaxCEHeaderValue {
			return fmt.Errorf("attribute %s: %d bytes as a ce-%s header (percent-encoded); at most %d", attr, n, attr, pulsetype.MaxCEHeaderValue)
		}
		total += len(name) + 2 + n
	}
	if total > pulsetype.MaxCEHeaderBytes {
		return fmt.Errorf("attributes: %d bytes as ce-* headers (percent-encoded); at most %d together", total, pulsetype.MaxCEHeaderBytes)
	}
	return nil
}

// ceValue returns the unencoded value of attribute attr, whose header value is sent.
func ceValue(e *pulsetype.Event, attr, sent string) string {
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
	return sent // a default of cloudEvent (source, time): ASCII
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
		if !pulsetype.IsJSONMediaType(v) {
			return "not a JSON media type (application/json, text/json or a +json type): the data is stored as JSON"
		}
	}
	return ""
}
