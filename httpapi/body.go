package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
)

// readBody reads r's body, at most limit bytes. Over the limit it answers 413 body_too_large ("<what> is at
// most <limit> bytes") and returns false.
func readBody(w http.ResponseWriter, r *http.Request, limit int64, what string) ([]byte, bool) {
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		writeError(w, http.StatusRequestEntityTooLarge, "body_too_large", fmt.Sprintf("%s is at most %d bytes", what, limit))
		return nil, false
	}
	return raw, true
}

// decodeStrict decodes the one JSON value of raw into v as the spec's additionalProperties: false says: a
// member v has no field for is an error naming it (`json: unknown field "stauts"`), and so is a second
// value after the first. An empty body (only white space) decodes nothing and is no error. The error's
// text names the field of a wrong type (describeJSONError).
func decodeStrict(raw []byte, v any) error {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return errors.New(describeJSONError(err))
	}
	if dec.More() {
		return errTrailingData
	}
	return nil
}

// noBody is the body of a route that takes none but may be sent one (the POSTs retry, cancel, pause and
// resume, and DELETE): nothing, or an empty object. Any member is an unknown field, refused like a typo in a body that has fields.
type noBody struct{}

// refuseBody reads the body of a route that takes none and answers 400 invalid_json ("<route> takes no
// body: json: unknown field \"x\"") when it holds anything but white space or {}, or 413 over
// maxEndpointBody; it reports whether the handler may go on.
func refuseBody(w http.ResponseWriter, r *http.Request, route string) bool {
	raw, ok := readBody(w, r, maxEndpointBody, route+" takes no body; a body")
	if !ok {
		return false
	}
	if err := decodeStrict(raw, &noBody{}); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_json", route+" takes no body (nothing, or {}): "+err.Error())
		return false
	}
	return true
}
