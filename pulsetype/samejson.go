package pulsetype

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math/big"
	"strings"
)

// SameJSON reports whether a and b hold the same JSON value, the rule of idempotent publish: whitespace and
// member order do not matter, strings compare unescaped, numbers by exact decimal value (1, 1.0 and 10e-1
// are equal, -0 is 0, large integers are not rounded), arrays in order, and of repeated member names the
// last counts. Input that is not exactly one JSON value is never the same as anything.
func SameJSON(a, b []byte) bool {
	va, err := decodeValue(a)
	if err != nil {
		return false
	}
	vb, err := decodeValue(b)
	if err != nil {
		return false
	}
	return sameValue(va, vb)
}

func decodeValue(b []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("more than one JSON value")
	}
	return v, nil
}

func sameValue(a, b any) bool {
	switch x := a.(type) {
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for k, xv := range x {
			yv, ok := y[k]
			if !ok || !sameValue(xv, yv) {
				return false
			}
		}
		return true
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !sameValue(x[i], y[i]) {
				return false
			}
		}
		return true
	case json.Number:
		y, ok := b.(json.Number)
		return ok && sameNumber(string(x), string(y))
	default: // string, bool, nil
		return a == b
	}
}

// sameNumber compares two JSON number literals by exact decimal value, without allocating digits for a
// large exponent (1e1000000000 costs no more than 1e1).
func sameNumber(a, b string) bool {
	na, nb := normalizeNumber(a), normalizeNumber(b)
	return na.neg == nb.neg && na.digits == nb.digits && na.exp.Cmp(nb.exp) == 0
}

// decimal is a number as ±0.digits × 10^exp with no leading or trailing zero in digits (zero: digits "",
// exp 0, not negative).
type decimal struct {
	neg    bool
	digits string
	exp    *big.Int
}

func normalizeNumber(s string) decimal {
	var d decimal
	if strings.HasPrefix(s, "-") {
		d.neg, s = true, s[1:]
	}
	mant, expPart, _ := strings.Cut(strings.ToLower(s), "e")
	intPart, frac, _ := strings.Cut(mant, ".")
	d.exp = new(big.Int)
	if expPart != "" {
		d.exp.SetString(strings.TrimPrefix(expPart, "+"), 10) // valid JSON: an optionally signed integer
	}
	digits := intPart + frac
	// digits × 10^(exp - len(frac)) = 0.digits × 10^(exp - len(frac) + len(digits)) = 0.digits × 10^(exp + len(intPart))
	d.exp.Add(d.exp, big.NewInt(int64(len(intPart))))
	trimmed := strings.TrimLeft(digits, "0")
	d.exp.Sub(d.exp, big.NewInt(int64(len(digits)-len(trimmed))))
	d.digits = strings.TrimRight(trimmed, "0")
	if d.digits == "" {
		return decimal{exp: new(big.Int)}
	}
	return d
}
