package httpapi

import (
	"encoding/json"
	"math"
	"reflect"
	"strconv"
)

// Integer is an int in JSON that reads any JSON number whose value is integral, as JSON (RFC 8259 §6) and the
// spec's {type: integer} mean it: 100, 1e2 and 100.0 are all 100. A number with a fraction (1.5), one
// beyond the range of int, or a value of another JSON type is a *json.UnmarshalTypeError ("must be an
// integer, not number 1.5"). It is written as a plain integer.
type Integer int

// UnmarshalJSON reads an integral JSON number.
func (n *Integer) UnmarshalJSON(b []byte) error {
	s := string(b)
	if s == "null" {
		return nil // as encoding/json leaves a number field alone for null
	}
	if v, err := strconv.ParseInt(s, 10, 0); err == nil {
		*n = Integer(v)
		return nil
	}
	typeErr := &json.UnmarshalTypeError{Value: jsonValueKind(b), Type: reflect.TypeFor[int]()}
	var f float64
	if err := json.Unmarshal(b, &f); err != nil {
		return typeErr
	}
	if f != math.Trunc(f) || f < math.MinInt64 || f >= math.MaxInt64 {
		typeErr.Value = "number " + s
		return typeErr
	}
	*n = Integer(int64(f))
	return nil
}

// jsonValueKind names the JSON type of the value b as encoding/json's type errors do: "string", "bool",
// "array", "object" or "number".
func jsonValueKind(b []byte) string {
	if len(b) == 0 {
		return "number"
	}
	switch b[0] {
	case '"':
		return "string"
	case 't', 'f':
		return "bool"
	case '[':
		return "array"
	case '{':
		return "object"
	}
	return "number"
}

func intPtr(p *Integer) *int {
	if p == nil {
		return nil
	}
	v := int(*p)
	return &v
}

func integerPtr(p *int) *Integer {
	if p == nil {
		return nil
	}
	v := Integer(*p)
	return &v
}
