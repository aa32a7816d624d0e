package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"
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
	if err := exactMembers(raw, reflect.TypeOf(v)); err != nil {
		return err
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

// exactMembers checks the JSON value raw, already decoded into a value of type t without error, for what
// encoding/json lets through: a member whose name matches a field only when case is ignored ("URL" for
// "url", which json would store into url), and a member repeated in one object (json keeps the last). Either
// is an error in the form of json's own, naming the member: `json: unknown field "URL"`, `json: duplicate
// member "topics"`. Objects are checked as deep as t gives them fields; a value of a type with its own
// UnmarshalJSON, an interface or json.RawMessage (an event's data) is not looked into.
func exactMembers(raw []byte, t reflect.Type) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	return walkMembers(dec, t)
}

var (
	unmarshalerType = reflect.TypeFor[json.Unmarshaler]()
	rawMessageType  = reflect.TypeFor[json.RawMessage]()
)

// walkMembers reads the next JSON value of dec, checking it against t as exactMembers says.
func walkMembers(dec *json.Decoder, t reflect.Type) error {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	opaque := t == nil || t == rawMessageType || t.Kind() == reflect.Interface ||
		reflect.PointerTo(t).Implements(unmarshalerType) || t.Implements(unmarshalerType)
	if opaque {
		var skip json.RawMessage
		return dec.Decode(&skip)
	}
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch tok {
	case json.Delim('{'):
		var fields map[string]reflect.Type
		if t.Kind() == reflect.Struct {
			fields = jsonFields(t)
		}
		seen := map[string]bool{}
		for dec.More() {
			tok, err := dec.Token()
			if err != nil {
				return err
			}
			key, _ := tok.(string)
			if seen[key] {
				return fmt.Errorf("json: duplicate member %q", key)
			}
			seen[key] = true
			var elem reflect.Type
			switch t.Kind() {
			case reflect.Struct:
				ft, ok := fields[key]
				if !ok {
					return fmt.Errorf("json: unknown field %q", key)
				}
				elem = ft
			case reflect.Map:
				elem = t.Elem()
			}
			if err := walkMembers(dec, elem); err != nil {
				return err
			}
		}
		_, err = dec.Token() // '}'
		return err
	case json.Delim('['):
		var elem reflect.Type
		if t.Kind() == reflect.Slice || t.Kind() == reflect.Array {
			elem = t.Elem()
		}
		for dec.More() {
			if err := walkMembers(dec, elem); err != nil {
				return err
			}
		}
		_, err = dec.Token() // ']'
		return err
	}
	return nil // a scalar
}

// jsonFields returns the member names encoding/json decodes into struct type t (a field's json tag name, or
// its Go name; the fields of embedded structs included), each with its field's type.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" && f.Tag.Get("json") == "-" {
			continue
		}
		if f.Anonymous && name == "" {
			et := f.Type
			if et.Kind() == reflect.Pointer {
				et = et.Elem()
			}
			if et.Kind() == reflect.Struct {
				for k, v := range jsonFields(et) {
					if _, ok := out[k]; !ok {
						out[k] = v
					}
				}
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Type
	}
	return out
}
