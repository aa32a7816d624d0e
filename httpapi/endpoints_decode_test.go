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
