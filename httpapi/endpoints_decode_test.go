package httpapi

import (
	"errors"
	"strings"
	"testing"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// A value a duration or time field refuses is answered with that field's name; other JSON errors keep the
// encoding/json message, which names the field or offset itself.
func TestDecodeEndpointNamesTheBadField(t *testing.T) {
	const base = `"url":"http://127.0.0.1:9/x","topics":["t"]`
	for _, c := range []struct {
		body  string
		field string // the *pulsetype.FieldError's field, or "" for another error
		want  string // a substring of the error
	}{
		{`{` + base + `,"disableAfter":"abc"}`, "disableAfter", `want a duration such as "1s", got "abc"`},
		{`{` + base + `,"retryDelay":true}`, "retryDelay", `want a duration such as "1s"`},
		{`{` + base + `,"timeout":"1s","maxRetryDelay":"soon"}`, "maxRetryDelay", `got "soon"`},
		{`{` + base + `,"createdAt":"yesterday"}`, "createdAt", `"yesterday"`},
		// encoding/json matches member names ignoring case; the field keeps its own name.
		{`{` + base + `,"DisableAfter":"abc"}`, "disableAfter", `got "abc"`},
		{`{` + base + `,"TIMEOUT":"soon"}`, "timeout", `got "soon"`},
		// The first bad member in the body's order, also when a later duplicate is good.
		{`{` + base + `,"disableAfter":"abc","disableAfter":"1s"}`, "disableAfter", `got "abc"`},
		{`{` + base + `,"disableAfter":"abc","timeout":"soon"}`, "disableAfter", `got "abc"`},
		{`{` + base + `,"disableAfter":"abc","topics":"t"}`, "disableAfter", `got "abc"`},
		{`{"url":"http://127.0.0.1:9/x","timeout":"soon","topics":"t"}`, "timeout", `got "soon"`},
		{`{` + base + `,"bogus":1}`, "", `unknown field "bogus"`},
		{`{"url":"http://127.0.0.1:9/x","topics":"t"}`, "", `topics`},
		{`{"url":`, "", `unexpected EOF`},
	} {
		_, err := DecodeEndpoint([]byte(c.body))
		var fe *pulsetype.FieldError
		switch {
		case err == nil:
			t.Errorf("DecodeEndpoint(%s) succeeded", c.body)
		case errors.As(err, &fe) != (c.field != "") || fe != nil && fe.Field != c.field:
			t.Errorf("DecodeEndpoint(%s) = %#v, want a field error on %q", c.body, err, c.field)
		case !strings.Contains(err.Error(), c.want):
			t.Errorf("DecodeEndpoint(%s) = %q, want it to contain %q", c.body, err, c.want)
		}
	}
}

// null leaves a duration as if it were left out, as encoding/json does for other fields.
func TestDecodeEndpointNullDuration(t *testing.T) {
	ep, err := DecodeEndpoint([]byte(`{"url":"http://127.0.0.1:9/x","topics":["t"],"disableAfter":null,"retryDelay":null}`))
	if err != nil || ep.DisableAfter != 0 || ep.RetryDelay != nil {
		t.Fatalf("DecodeEndpoint with null durations = %+v, %v; want them unset", ep, err)
	}
}
