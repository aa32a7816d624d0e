package pulsetype_test

import (
	"testing"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

func TestSameJSON(t *testing.T) {
	t.Parallel()
	tests := []struct {
		a, b string
		same bool
	}{
		{`{"a":1,"b":[1,2]}`, `{"b":[1,2],"a":1}`, true},
		{`{"a":1,"b":[1,2]}`, " {\n \"a\" : 1 , \"b\" : [ 1 , 2 ] } ", true},
		{`{"a":{"x":1,"y":2}}`, `{"a":{"y":2,"x":1}}`, true},
		{`"\u00e9"`, `"é"`, true},
		{`1`, `1.0`, true},
		{`1`, `1e0`, true},
		{`1`, `10e-1`, true},
		{`0.5`, `5E-1`, true},
		{`120`, `1.2e+2`, true},
		{`-0`, `0`, true},
		{`0.000`, `0e10`, true},
		{`1e1000000000`, `10e999999999`, true},
		{`9007199254740993`, `9007199254740992`, false},
		{`{"a":1}`, `{"a":2}`, false},
		{`[1,2]`, `[2,1]`, false},
		{`{"a":1}`, `{"a":1,"b":null}`, false},
		{`{"a":null}`, `{"b":null}`, false},
		{`1`, `"1"`, false},
		{`true`, `1`, false},
		{`null`, `false`, false},
		{`1`, `-1`, false},
		{`0.1`, `0.01`, false},
		{`{"a":1}`, `{"a":1} {}`, false},
		{`{"a":`, `{"a":`, false},
	}
	for _, tt := range tests {
		if got := pulsetype.SameJSON([]byte(tt.a), []byte(tt.b)); got != tt.same {
			t.Errorf("SameJSON(%s, %s) = %v, want %v", tt.a, tt.b, got, tt.same)
		}
		if got := pulsetype.SameJSON([]byte(tt.b), []byte(tt.a)); got != tt.same {
			t.Errorf("SameJSON(%s, %s) = %v, want %v", tt.b, tt.a, got, tt.same)
		}
	}
}
