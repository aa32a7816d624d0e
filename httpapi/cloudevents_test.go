package httpapi_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/pulse-sidecar/pulse/httpapi"
	"github.com/pulse-sidecar/pulse/pulsetype"
)

// decodeOne decodes a single CloudEvent request and fails the test unless it decodes.
func decodeOne(t *testing.T, h http.Header, body string) *pulsetype.Event {
	t.Helper()
	events, _, err := httpapi.DecodeCloudEvents(h, []byte(body))
	if err != nil || len(events) != 1 {
		t.Fatalf("decode %v %s: %v (%d events)", h, body, err, len(events))
	}
	return events[0]
}

func binaryHeader(kv ...string) http.Header {
	h := http.Header{"Ce-Specversion": {"1.0"}, "Ce-Id": {"e-1"}, "Ce-Type": {"t"}, "Ce-Source": {"/s"}, "Content-Type": {"application/json"}}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
	return h
}

// The same event published in binary and in structured mode is stored the same: binary-mode header values are
// percent-decoded as the HTTP binding writes (§3.1.3.2), and source and id are kept as published, never
// re-encoded as a URL.
func TestCloudEventsBinaryAndStructuredStoreTheSame(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, header, structured, want string }{
		{"subject", "a%20b", `"a b"`, "a b"},
		{"pct", "100%25", `"100%"`, "100%"},
		{"subject", "caf%C3%A9 %22q%22", `"café \"q\""`, `café "q"`},
		{"subject", "  padded  ", `"padded"`, "padded"}, // header whitespace is trimmed (RFC 9110 §5.5)
		{"subject", "%20kept%20", `" kept "`, " kept "}, // encoded whitespace is the value's
		{"tenant", "%20eu", `" eu"`, " eu"},
		{"subject", "%61bc", `"abc"`, "abc"}, // an escape that was not needed is accepted
		{"source", "%20%20spaces%20%20", `"  spaces  "`, "  spaces  "},
		{"source", "https://Example.COM/Path/%20%C3%A9", `"https://Example.COM/Path/ é"`, "https://Example.COM/Path/ é"},
	} {
		bin := decodeOne(t, binaryHeader("Ce-"+c.name, c.header), `{}`)
		st := decodeOne(t, http.Header{"Content-Type": {"application/cloudevents+json"}},
			`{"specversion":"1.0","id":"e-1","type":"t","source":"/s","data":{},"`+c.name+`":`+c.structured+`}`)
		if got := bin.Headers["ce-"+c.name]; got != c.want {
			t.Errorf("binary ce-%s: %q stored %q, want %q", c.name, c.header, got, c.want)
		}
		if got := st.Headers["ce-"+c.name]; got != c.want {
			t.Errorf("structured %s: %s stored %q, want %q", c.name, c.structured, got, c.want)
		}
	}
}

// What could never be sent back as a ce-* header is refused at ingest with 400 naming the attribute: a control
// character (the core spec's String type excludes them), one attribute over MaxCEHeaderValue bytes
// percent-encoded, all of them over MaxCEHeaderBytes together, and a malformed or non-UTF-8 escape.
func TestCloudEventsRefuseWhatCannotBeDelivered(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("a", pulsetype.MaxCEHeaderValue+1)
	spaced := strings.Repeat("é", pulsetype.MaxCEHeaderValue/6+1) // fits as bytes, not once encoded (%C3%A9)
	many := `"x1":"` + strings.Repeat("a", 3000) + `","x2":"` + strings.Repeat("a", 3000) + `","x3":"` + strings.Repeat("a", 3000) + `"`
	for _, c := range []struct {
		name   string
		header http.Header
		body   string
		says   string
	}{
		{"CRLF subject", nil, `{"specversion":"1.0","id":"e","type":"t","source":"/s","subject":"a\r\nb"}`, "attribute subject: control character U+000D"},
		{"NUL extension", nil, `{"specversion":"1.0","id":"e","type":"t","source":"/s","ext":"a\u0000"}`, "attribute ext: control character U+0000"},
		{"C1 source", nil, `{"specversion":"1.0","id":"e","type":"t","source":"/s\u0085"}`, "attribute source: control character U+0085"},
		{"noncharacter", nil, `{"specversion":"1.0","id":"e","type":"t","source":"/s","subject":"\uffff"}`, "attribute subject: noncharacter U+FFFF"},
		{"long extension", nil, `{"specversion":"1.0","id":"e","type":"t","source":"/s","big":"` + long + `"}`, "attribute big: 4097 bytes"},
		{"long once encoded", nil, `{"specversion":"1.0","id":"e","type":"t","source":"/s","subject":"` + spaced + `"}`, "attribute subject: 4098 bytes"},
		{"too many together", nil, `{"specversion":"1.0","id":"e","type":"t","source":"/s",` + many + `}`, "at most 8192 together"},
		{"binary CRLF", binaryHeader("Ce-Subject", "a%0D%0Ab"), `{}`, "attribute subject: control character U+000D"},
		{"malformed escape", binaryHeader("Ce-Subject", "100%"), `{}`, "header ce-subject: bad percent-encoding"},
		{"overlong escape", binaryHeader("Ce-Subject", "%C0%A0"), `{}`, "header ce-subject: bad percent-encoding"},
		{"binary specversion", binaryHeader("Ce-Specversion", "2.0"), `{}`, `ce-specversion "2.0" is not supported`},
		{"structured specversion", nil, `{"specversion":"2.0","id":"e","type":"t","source":"/s"}`, `specversion "2.0" is not supported`},
		{"batch specversion", http.Header{"Content-Type": {"application/cloudevents-batch+json"}},
			`[{"specversion":"1.0","id":"a","type":"t","source":"/s"},{"specversion":"0.3","id":"b","type":"t","source":"/s"}]`, `events[1]: specversion "0.3"`},
		{"batch specversion 2.0", http.Header{"Content-Type": {"application/cloudevents-batch+json"}},
			`[{"specversion":"2.0","id":"a","type":"t","source":"/s"}]`, `events[0]: specversion "2.0" is not supported`},
		{"specversion a number", nil, `{"specversion":1.0,"id":"e","type":"t","source":"/s"}`, `specversion 1.0 is not supported`},
		{"no specversion", nil, `{"id":"e","type":"t","source":"/s"}`, `specversion is required`},
		{"ce- alone", binaryHeader("Ce-", "x"), `{}`, `header "Ce-" names no CloudEvents attribute`},
		{"ce-a_b", binaryHeader("Ce-A_b", "x"), `{}`, `header "Ce-A_b" names no CloudEvents attribute`},
		{"binary id padded once decoded", binaryHeader("Ce-Id", "%20e-1%20"), `{}`, ""},
		{"no specversion header", http.Header{"Ce-Id": {"e"}, "Ce-Type": {"t"}, "Content-Type": {"application/json"}}, `{}`, "no ce-specversion"},
		{"repeated header", http.Header{"Ce-Specversion": {"1.0"}, "Ce-Id": {"e"}, "Ce-Type": {"t"}, "Ce-Source": {"/s"}, "Ce-Subject": {"one", "two"},
			"Content-Type": {"application/json"}}, `{}`, "header ce-subject is given 2 times"},
		{"id ..", nil, `{"specversion":"1.0","id":"..","type":"t","source":"/s"}`, ""},
	} {
		h := c.header
		if h == nil {
			h = http.Header{"Content-Type": {"application/cloudevents+json"}}
		}
		_, _, err := httpapi.DecodeCloudEvents(h, []byte(c.body))
		var br *httpapi.BadRequestError
		if c.says == "" { // a bad id
			if !errors.As(err, &br) || br.Code != "invalid_id" {
				t.Errorf("%s: got %v, want 400 invalid_id", c.name, err)
			}
			continue
		}
		if !errors.As(err, &br) || br.Status != 400 || br.Code != "invalid_cloudevent" || !strings.Contains(br.Message, c.says) || strings.Contains(br.Message, "\n") {
			t.Errorf("%s: got %q, want 400 invalid_cloudevent saying %q on one line", c.name, err, c.says)
		}
	}
	// A JSON event's ce-* headers go out as the attributes they name, so they follow the attributes' rules.
	for _, c := range []struct{ headers, says string }{
		{`{"ce-time":"yesterday"}`, "attribute time: not an RFC 3339 time"},
		{`{"ce-dataschema":"::not a uri"}`, "attribute dataschema: not an absolute URI"},
		{`{"ce-dataschema":"/relative"}`, "attribute dataschema: not an absolute URI"},
		{`{"ce-datacontenttype":"text/plain"}`, "attribute datacontenttype: not a JSON media type"},
		{`{"ce-a_b":"x"}`, `header "ce-a_b" names no CloudEvents attribute`},
		{`{"ce-":"x"}`, `header "ce-" names no CloudEvents attribute`},
		{`{"ce-id":"other"}`, `header "ce-id": the CloudEvents id is set from the event's id`},
		{`{"Ce-Specversion":"2.0"}`, `header "Ce-Specversion": the CloudEvents specversion is set from "1.0"`},
		{`{"ce-partitionkey":"k"}`, `the CloudEvents partitionkey is set from orderingKey`},
		{`{"ce-x":"ok","CE-X":"bad"}`, `name the same CloudEvents attribute`},
	} {
		_, _, err := httpapi.DecodeEvents([]byte(`{"topic":"t","data":1,"headers":` + c.headers + `}`))
		var br *httpapi.BadRequestError
		if !errors.As(err, &br) || br.Code != "invalid_headers" || !strings.Contains(br.Message, c.says) {
			t.Errorf("JSON event with headers %s: got %v, want 400 invalid_headers saying %q", c.headers, err, c.says)
		}
	}
	if _, _, err := httpapi.DecodeEvents([]byte(`{"topic":"t","data":1,"orderingKey":"a\nb"}`)); err == nil || err.(*httpapi.BadRequestError).Code != "invalid_ordering_key" {
		t.Errorf("orderingKey with a newline: got %v, want 400 invalid_ordering_key", err)
	}
	// The same rule holds for the ce-* headers of a JSON publish, which go out the same way.
	_, _, err := httpapi.DecodeEvents([]byte(`{"topic":"t","data":1,"headers":{"ce-subject":"a\r\nb"}}`))
	var br *httpapi.BadRequestError
	if !errors.As(err, &br) || br.Code != "invalid_headers" || !strings.Contains(br.Message, "attribute subject: control character U+000D") {
		t.Errorf("JSON publish with a CRLF ce-subject: got %v, want 400 invalid_headers naming subject", err)
	}
}

// Insignificant whitespace of a structured body is insignificant: the SDK's reader alone refused
// `"data_base64": "e30="` with a space after the colon.
func TestCloudEventsStructuredWhitespace(t *testing.T) {
	t.Parallel()
	for _, body := range []string{
		`{"specversion":"1.0","id":"e","type":"t","source":"/s","data_base64":"e30="}`,
		`{"specversion":"1.0","id":"e","type":"t","source":"/s","data_base64": "e30="}`,
		"{ \"specversion\" : \"1.0\" ,\n\t\"id\" : \"e\", \"type\": \"t\", \"source\": \"/s\", \"data_base64\" :\n \"e30=\" }",
	} {
		if e := decodeOne(t, http.Header{"Content-Type": {"application/cloudevents+json"}}, body); string(e.Data) != "{}" {
			t.Errorf("%s stored data %s, want {}", body, e.Data)
		}
		// The Content-Type decides structured mode, whatever ce-* headers come with it.
		h := http.Header{"Content-Type": {"application/cloudevents+json"}, "Ce-Specversion": {"2.0"}, "Ce-Id": {"other"}}
		if e := decodeOne(t, h, body); string(e.Data) != "{}" || e.ID != "e" {
			t.Errorf("%s with ce-* headers stored id %s data %s, want e and {}", body, e.ID, e.Data)
		}
	}
}

// A binary-mode ce-* header whose value has a byte outside ASCII, raw UTF-8 or Latin-1 as an SDK that does not
// percent-encode sends it, answers 400 saying that header values must be percent-encoded UTF-8 (HTTP binding
// §3.1.3.2), not a misleading "bad percent-encoding", and not a value stored as it happened to arrive.
func TestCloudEventsRefuseRawNonASCIIHeader(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"Zürich – 東京", "Z\xfcrich", "/shop/\xe6\x9d\xb1"} {
		_, _, err := httpapi.DecodeCloudEvents(binaryHeader("Ce-Subject", v), []byte(`{}`))
		var br *httpapi.BadRequestError
		if !errors.As(err, &br) || br.Status != 400 || br.Code != "invalid_cloudevent" ||
			!strings.Contains(br.Message, "header ce-subject: byte ") || !strings.Contains(br.Message, "header values must be percent-encoded UTF-8") {
			t.Errorf("ce-subject %q: got %v, want 400 invalid_cloudevent saying header values must be percent-encoded UTF-8", v, err)
		}
	}
	// The same characters percent-encoded are read.
	evs, _, err := httpapi.DecodeCloudEvents(binaryHeader("Ce-Subject", pulsetype.PercentEncodeHeader("Zürich – 東京")), []byte(`{}`))
	if err != nil || evs[0].Headers["ce-subject"] != "Zürich – 東京" {
		t.Errorf("percent-encoded subject: %v %v", evs, err)
	}
}
