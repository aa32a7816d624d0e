package sealing_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/pulse-sidecar/pulse/internal/sealing"
)

func testKey(b byte) []byte { return bytes.Repeat([]byte{b}, sealing.KeySize) }

func TestSealOpenRotate(t *testing.T) {
	t.Parallel()
	old, err := sealing.New([][]byte{testKey(1)})
	if err != nil {
		t.Fatal(err)
	}
	s, err := old.Seal([]byte("whsec_abc"), []byte("billing/secret"))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(s.Data, []byte("whsec_abc")) || s.KeyID != sealing.KeyID(testKey(1)) {
		t.Fatalf("sealed = %+v", s)
	}
	rotated, _ := sealing.New([][]byte{testKey(2), testKey(1)})
	if got, err := rotated.Open(s, []byte("billing/secret")); err != nil || string(got) != "whsec_abc" {
		t.Fatalf("Open after rotation = %q, %v", got, err)
	}
	if s2, _ := rotated.Seal([]byte("x"), nil); s2.KeyID != rotated.PrimaryKeyID() || s2.KeyID == s.KeyID {
		t.Errorf("rotated keyring seals with %s, want its first key %s", s2.KeyID, rotated.PrimaryKeyID())
	}
	if _, err := old.Open(s, []byte("shipping/secret")); !errors.Is(err, sealing.ErrTampered) {
		t.Errorf("Open with other associated data = %v, want ErrTampered", err)
	}
	newOnly, _ := sealing.New([][]byte{testKey(2)})
	var uk *sealing.UnknownKeyError
	if _, err := newOnly.Open(s, []byte("billing/secret")); !errors.As(err, &uk) || uk.KeyID != s.KeyID {
		t.Errorf("Open without the key = %v, want UnknownKeyError naming %s", err, s.KeyID)
	}
	var none *sealing.Keyring
	if _, err := none.Open(s, nil); !errors.Is(err, sealing.ErrNoKeys) || none.Enabled() {
		t.Errorf("nil keyring Open = %v, want ErrNoKeys", err)
	}
	if _, err := sealing.New([][]byte{[]byte("short")}); err == nil {
		t.Error("New accepted a 5-byte key")
	}
}
