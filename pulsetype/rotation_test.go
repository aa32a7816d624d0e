package pulsetype_test

import (
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// A generated secret is whsec_ and the base64 of 32 bytes, passes CheckSecret and differs every time.
func TestGenerateSecret(t *testing.T) {
	t.Parallel()
	a, b := pulsetype.GenerateSecret(), pulsetype.GenerateSecret()
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(a, "whsec_"))
	if !strings.HasPrefix(a, "whsec_") || err != nil || len(key) != 32 || pulsetype.CheckSecret(a) != nil || a == b {
		t.Fatalf("GenerateSecret = %q, %q", a, b)
	}
	for _, bad := range []string{"", "whsec_", "whsec_c2hvcnQ=", "c2VjcmV0LWJlZm9yZS10aGUtcm90YXRpb24=", "whsec_!!!!"} {
		if err := pulsetype.CheckSecret(bad); err == nil {
			t.Errorf("CheckSecret(%q) = nil, want an error", bad)
		}
	}
}

// The previous secret signs only while the overlap lasts, only beside a current secret that differs from
// it (httpapi's TestRedactedEndpointJSON: it never shows in a read).
func TestPreviousSecretAt(t *testing.T) {
	t.Parallel()
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	until := now.Add(time.Hour)
	e := pulsetype.Endpoint{Secret: "whsec_new", PreviousSecret: "whsec_old", PreviousSecretExpiresAt: &until}
	for _, tc := range []struct {
		name string
		e    pulsetype.Endpoint
		at   time.Time
		want string
	}{
		{"within the overlap", e, now, "whsec_old"},
		{"at its end", e, until, ""},
		{"after it", e, until.Add(time.Millisecond), ""},
		{"no end", pulsetype.Endpoint{Secret: "whsec_new", PreviousSecret: "whsec_old"}, now, ""},
		{"same secret", pulsetype.Endpoint{Secret: "whsec_old", PreviousSecret: "whsec_old", PreviousSecretExpiresAt: &until}, now, ""},
		{"unsigned", pulsetype.Endpoint{PreviousSecret: "whsec_old", PreviousSecretExpiresAt: &until}, now, ""},
	} {
		if got := tc.e.PreviousSecretAt(tc.at); got != tc.want {
			t.Errorf("%s: PreviousSecretAt = %q, want %q", tc.name, got, tc.want)
		}
	}
}
