package mongo

import (
	"bytes"
	"errors"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/pulse-sidecar/pulse/internal/sealing"
	"github.com/pulse-sidecar/pulse/pulsetype"
)

func testKeyring(t *testing.T, keys ...byte) *sealing.Keyring {
	t.Helper()
	var raw [][]byte
	for _, k := range keys {
		raw = append(raw, bytes.Repeat([]byte{k}, sealing.KeySize))
	}
	kr, err := sealing.New(raw)
	if err != nil {
		t.Fatal(err)
	}
	return kr
}

// rawSubscription returns the stored bytes of a subscription document.
func (b *bundle) rawSubscription(group string) bson.Raw {
	b.t.Helper()
	raw, err := b.coll("subscriptions").FindOne(b.ctx, bson.M{"_id": group}).Raw()
	if err != nil {
		b.t.Fatalf("find subscription %s: %v", group, err)
	}
	return raw
}

// With a key the stored document holds neither the secret nor a header value in clear; a document written
// before the key still reads and is encrypted when next written; a rotated key list (new first, old after)
// reads both generations; a missing key or a value moved to another endpoint is a DecryptError naming it.
func testEndpointSecretsEncryptedAtRest(t *testing.T, e *env) {
	b := e.setup(t)
	const secret, auth = "whsec_c2VjcmV0LXNpZ25pbmcta2V5LWZvci10ZXN0", "Bearer tok-4f9a1c77e2"
	withSecrets := func(group string) *pulsetype.Endpoint {
		e := b.endpoint(group, "t")
		e.Secret, e.Headers = secret, map[string]string{"Authorization": auth}
		return e
	}
	clear := b.store(nil, nil)
	if _, _, err := clear.PutEndpoint(b.ctx, withSecrets("legacy")); err != nil {
		t.Fatal(err)
	}
	if raw := b.rawSubscription("legacy"); !bytes.Contains(raw, []byte(secret)) {
		t.Fatal("without a key the secret is not stored as given (test premise)")
	}

	k1 := b.store(nil, func(o *Options) { o.Keys = testKeyring(t, 1) })
	for _, group := range []string{"legacy", "fresh"} {
		if group == "legacy" {
			if ep, err := k1.GetEndpoint(b.ctx, group); err != nil || ep.Secret != secret || ep.Headers["Authorization"] != auth {
				t.Fatalf("legacy clear endpoint read with a key = %+v, %v", ep, err)
			}
		}
		stored, _, err := k1.PutEndpoint(b.ctx, withSecrets(group))
		if err != nil || stored.Secret != secret || stored.Headers["Authorization"] != auth {
			t.Fatalf("PutEndpoint(%s) with a key = %+v, %v", group, stored, err)
		}
		raw := b.rawSubscription(group)
		if bytes.Contains(raw, []byte(secret)) || bytes.Contains(raw, []byte(auth)) || bytes.Contains(raw, []byte("tok-4f9a")) {
			t.Fatalf("%s: the stored document holds a secret in clear: %s", group, raw)
		}
		if _, err := raw.LookupErr("secret"); err == nil {
			t.Errorf("%s: the clear secret field is still there", group)
		}
	}
	if n, err := k1.CheckSecrets(b.ctx); err != nil || n != 0 {
		t.Errorf("CheckSecrets = %d, %v; want 0 stale, nil", n, err)
	}

	// Rotation: the new key first, the old one after. Both generations read; a write re-encrypts with the new.
	k21 := b.store(nil, func(o *Options) { o.Keys = testKeyring(t, 2, 1) })
	if n, err := k21.CheckSecrets(b.ctx); err != nil || n != 2 {
		t.Errorf("CheckSecrets after rotation = %d, %v; want 2 stale, nil", n, err)
	}
	if _, _, err := k21.PutEndpoint(b.ctx, withSecrets("fresh")); err != nil {
		t.Fatal(err)
	}
	eps, err := k21.ListEndpoints(b.ctx)
	if err != nil || len(eps) != 2 {
		t.Fatalf("ListEndpoints after rotation = %v, %v", eps, err)
	}
	for _, ep := range eps {
		if ep.Secret != secret || ep.Headers["Authorization"] != auth {
			t.Errorf("%s after rotation = %q %v", ep.ConsumerGroup, ep.Secret, ep.Headers)
		}
	}

	// Only the new key: "fresh" (rewritten) reads, "legacy" (old key) is a clear error naming it.
	k2 := b.store(nil, func(o *Options) { o.Keys = testKeyring(t, 2) })
	if _, err := k2.GetEndpoint(b.ctx, "fresh"); err != nil {
		t.Errorf("rewritten endpoint with the new key only: %v", err)
	}
	var de *DecryptError
	if _, err := k2.GetEndpoint(b.ctx, "legacy"); !errors.As(err, &de) || de.ConsumerGroup != "legacy" {
		t.Errorf("endpoint sealed with a dropped key: %v, want a DecryptError naming legacy", err)
	}
	var uk *sealing.UnknownKeyError
	if _, err := k2.CheckSecrets(b.ctx); !errors.As(err, &uk) {
		t.Errorf("CheckSecrets with a dropped key = %v, want UnknownKeyError", err)
	}
	if _, err := clear.GetEndpoint(b.ctx, "fresh"); !errors.As(err, &de) || !errors.Is(err, sealing.ErrNoKeys) {
		t.Errorf("encrypted endpoint read without a key: %v, want a DecryptError (ErrNoKeys), never an empty secret", err)
	}
	// A PUT replaces values no key opens any more.
	if _, _, err := k2.PutEndpoint(b.ctx, withSecrets("legacy")); err != nil {
		t.Errorf("PUT over an endpoint sealed with a dropped key: %v", err)
	}

	// A sealed value copied to another endpoint does not decrypt there.
	sealed, _ := b.rawSubscription("fresh").LookupErr("secretSealed")
	if _, err := b.coll("subscriptions").UpdateOne(b.ctx, bson.M{"_id": "legacy"}, bson.M{"$set": bson.M{"secretSealed": sealed}}); err != nil {
		t.Fatal(err)
	}
	if _, err := k2.GetEndpoint(b.ctx, "legacy"); !errors.Is(err, sealing.ErrTampered) {
		t.Errorf("secret moved from another endpoint: %v, want ErrTampered", err)
	}
}
