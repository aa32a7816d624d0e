package httpapi

import (
	"strings"
	"testing"
)

// encoding/json matches member names case-insensitively and keeps the last of a repeated member, so
// DisallowUnknownFields alone let `"URL"` override `"url"` and a second `"topics"` replace the first: every
// body is checked for exact, unrepeated members too (exactMembers).
func TestBodiesRefuseCaseVariantsAndRepeatedMembers(t *testing.T) {
	t.Parallel()
	const ep = `"url":"http://127.0.0.1:9/p","topics":["t"]`
	for _, tc := range []struct{ body, want string }{
		{`{` + ep + `,"URL":"http://evil/"}`, `unknown field "URL"`},
		{`{` + ep + `,"Filter":"false"}`, `unknown field "Filter"`},
		{`{` + ep + `,"topics":["u"]}`, `duplicate member "topics"`},
		{`{` + ep + `,"headers":{"X-A":"1","X-A":"2"}}`, `duplicate member "X-A"`},
	} {
		_, err := DecodeEndpoint([]byte(tc.body))
		if err == nil {
			t.Errorf("DecodeEndpoint(%s) = nil error, want one", tc.body)
			continue
		}
		if tc.want != "" && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("DecodeEndpoint(%s) = %v, want %q", tc.body, err, tc.want)
		}
	}
	if _, err := DecodeEndpoint([]byte(`{` + ep + `,"headers":{"X-A":"1","x-a":"2"}}`)); err != nil {
		t.Errorf("two headers that differ in case: %v, want them kept (they are two map keys)", err)
	}
	var r replayBody
	if err := decodeStrict([]byte(`{"Status":"error"}`), &r); err == nil || !strings.Contains(err.Error(), `unknown field "Status"`) {
		t.Errorf("replay body with Status = %v, want unknown field", err)
	}
	for _, body := range []string{`{"topic":"t","Topic":"u","data":1}`, `{"topic":"t","data":1,"data":2}`} {
		var e inputEvent
		if err := strictUnmarshal([]byte(body), &e); err == nil {
			t.Errorf("event %s accepted, want refused", body)
		}
	}
	var e inputEvent // the event's data is the application's: a repeated member inside it is not looked into
	if err := strictUnmarshal([]byte(`{"topic":"t","data":{"a":1,"a":2,"A":3}}`), &e); err != nil {
		t.Errorf("event with repeated members inside its data: %v, want accepted", err)
	}
}
