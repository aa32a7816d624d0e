// Package sealing encrypts small values at rest with AES-256-GCM (crypto/cipher), each bound to where it is
// stored by associated data, so a sealed value copied to another document or field does not open.
//
// A Keyring holds one or more keys: the first seals, every one opens (key rotation). A sealed value names
// its key by KeyID, a fingerprint of the key (not the key), so opening picks the right key at once and a
// missing key is reported as such rather than as a corrupt value.
package sealing

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
)

// KeySize is the size of a key in bytes (AES-256).
const KeySize = 32

// ErrNoKeys is returned by Open on a nil Keyring: the value is sealed but no key is configured.
var ErrNoKeys = errors.New("the value is encrypted but no encryption key is configured")

// ErrTampered is returned by Open when the value does not authenticate with its key and associated data: it
// was altered, or moved from another document or field.
var ErrTampered = errors.New("the encrypted value does not authenticate (altered, or moved from another endpoint or field)")

// UnknownKeyError is returned by Open when the value was sealed with a key the Keyring does not hold.
type UnknownKeyError struct {
	KeyID string // fingerprint of the key that sealed the value
}

func (e *UnknownKeyError) Error() string {
	return fmt.Sprintf("the value was encrypted with key %s, which is not among the configured keys", e.KeyID)
}

// Sealed is a value sealed by a Keyring: the KeyID of its key and the nonce followed by the ciphertext.
type Sealed struct {
	KeyID string `bson:"k"`
	Data  []byte `bson:"d"`
}

type key struct {
	id   string
	aead cipher.AEAD
}

// Keyring seals with its first key and opens with any of its keys. A nil *Keyring seals nothing (Enabled
// reports false) and opens nothing (ErrNoKeys). It is safe for concurrent use.
type Keyring struct {
	keys []key
}

// New returns a Keyring of keys (each KeySize bytes), the first one sealing; nil keys give a nil Keyring.
func New(keys [][]byte) (*Keyring, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	kr := &Keyring{}
	for i, k := range keys {
		if len(k) != KeySize {
			return nil, fmt.Errorf("key %d is %d bytes, want %d", i+1, len(k), KeySize)
		}
		block, err := aes.NewCipher(k)
		if err != nil {
			return nil, err
		}
		aead, err := cipher.NewGCM(block)
		if err != nil {
			return nil, err
		}
		kr.keys = append(kr.keys, key{id: KeyID(k), aead: aead})
	}
	return kr, nil
}

// KeyID returns the fingerprint of k that sealed values carry: 8 hex digits of a SHA-256 of the key.
func KeyID(k []byte) string {
	sum := sha256.Sum256(append([]byte("pulse-sealing-key-id\x00"), k...))
	return hex.EncodeToString(sum[:4])
}

// Enabled reports whether the Keyring has a key to seal with.
func (kr *Keyring) Enabled() bool { return kr != nil && len(kr.keys) > 0 }

// PrimaryKeyID returns the KeyID of the sealing key, or "" for a nil Keyring.
func (kr *Keyring) PrimaryKeyID() string {
	if !kr.Enabled() {
		return ""
	}
	return kr.keys[0].id
}

// Seal encrypts plaintext with the first key, a random nonce and the associated data ad.
func (kr *Keyring) Seal(plaintext, ad []byte) (Sealed, error) {
	if !kr.Enabled() {
		return Sealed{}, ErrNoKeys
	}
	k := kr.keys[0]
	nonce := make([]byte, k.aead.NonceSize(), k.aead.NonceSize()+len(plaintext)+k.aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return Sealed{}, fmt.Errorf("read a nonce: %w", err)
	}
	return Sealed{KeyID: k.id, Data: k.aead.Seal(nonce, nonce, plaintext, ad)}, nil
}

// Open decrypts s with the key it names and the associated data it was sealed with. It returns ErrNoKeys,
// an *UnknownKeyError or ErrTampered.
func (kr *Keyring) Open(s Sealed, ad []byte) ([]byte, error) {
	if !kr.Enabled() {
		return nil, ErrNoKeys
	}
	for _, k := range kr.keys {
		if k.id != s.KeyID {
			continue
		}
		if len(s.Data) < k.aead.NonceSize() {
			return nil, ErrTampered
		}
		n := k.aead.NonceSize()
		out, err := k.aead.Open(nil, s.Data[:n], s.Data[n:], ad)
		if err != nil {
			return nil, ErrTampered
		}
		return out, nil
	}
	return nil, &UnknownKeyError{KeyID: s.KeyID}
}
