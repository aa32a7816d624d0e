package mongo

import (
	"context"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/pulse-sidecar/pulse/internal/sealing"
	"github.com/pulse-sidecar/pulse/pulsetype"
)

// Fields of a subscription document that hold an endpoint's secrets: in clear ("secret", "headers") without
// an encryption key, sealed ("secretSealed", "headersSealed") with one. A document holds one form or the
// other; one written before a key was set keeps its clear form until its endpoint is next written.
const (
	fieldSecret        = "secret"
	fieldHeaders       = "headers"
	fieldSecretSealed  = "secretSealed"
	fieldHeadersSealed = "headersSealed"
	// The secret a rotation replaced, in one form or the other, and the end of its overlap.
	fieldPreviousSecret          = "previousSecret"
	fieldPreviousSecretSealed    = "previousSecretSealed"
	fieldPreviousSecretExpiresAt = "previousSecretExpiresAt"
)

// DecryptError is returned when an endpoint's secret or a header value is stored encrypted and cannot be
// decrypted: no key is configured, the key that encrypted it is not configured, or the value does not
// authenticate. The endpoint is never used with the value missing.
type DecryptError struct {
	ConsumerGroup string
	Field         string // "secret", "previousSecret", or "headers.<name>"
	Err           error
}

func (e *DecryptError) Error() string {
	return fmt.Sprintf("endpoint %q: cannot decrypt its %s: %v; set PULSE_ENCRYPTION_KEY to a list that holds the key it was written with, or register the endpoint again",
		e.ConsumerGroup, e.Field, e.Err)
}

func (e *DecryptError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, pulsetype.ErrUndecryptable) true.
func (e *DecryptError) Is(target error) bool { return target == pulsetype.ErrUndecryptable }

// sealAD is the associated data of one sealed value: the consumer group, the field and, for a header, its
// name. A value moved to another endpoint, field or header does not decrypt.
func sealAD(group, field, header string) []byte {
	return []byte("pulse-endpoint\x00" + group + "\x00" + field + "\x00" + header)
}

// secretFields returns the $set and $unset parts of a write of e's secret, previous secret (with the end of
// its overlap; all removed when e has none) and headers: sealed with the Store's keys when it has any, in
// clear otherwise; the other form is removed.
func (s *Store) secretFields(e *pulsetype.Endpoint) (set, unset bson.M, err error) {
	set, unset = bson.M{}, bson.M{}
	previous := e.PreviousSecret != "" && e.PreviousSecretExpiresAt != nil
	if previous {
		set[fieldPreviousSecretExpiresAt] = e.PreviousSecretExpiresAt
	} else {
		unset[fieldPreviousSecret], unset[fieldPreviousSecretSealed], unset[fieldPreviousSecretExpiresAt] = "", "", ""
	}
	if !s.opts.Keys.Enabled() {
		set[fieldSecret], set[fieldHeaders] = e.Secret, e.Headers
		unset[fieldSecretSealed], unset[fieldHeadersSealed] = "", ""
		if previous {
			set[fieldPreviousSecret], unset[fieldPreviousSecretSealed] = e.PreviousSecret, ""
		}
		return set, unset, nil
	}
	unset[fieldSecret], unset[fieldHeaders] = "", ""
	if e.Secret == "" {
		unset[fieldSecretSealed] = ""
	} else {
		sealed, err := s.opts.Keys.Seal([]byte(e.Secret), sealAD(e.ConsumerGroup, fieldSecret, ""))
		if err != nil {
			return nil, nil, fmt.Errorf("encrypt the secret of endpoint %q: %w", e.ConsumerGroup, err)
		}
		set[fieldSecretSealed] = sealed
	}
	if previous {
		sealed, err := s.opts.Keys.Seal([]byte(e.PreviousSecret), sealAD(e.ConsumerGroup, fieldPreviousSecret, ""))
		if err != nil {
			return nil, nil, fmt.Errorf("encrypt the previous secret of endpoint %q: %w", e.ConsumerGroup, err)
		}
		set[fieldPreviousSecretSealed], unset[fieldPreviousSecret] = sealed, ""
	}
	if len(e.Headers) == 0 {
		unset[fieldHeadersSealed] = ""
	} else {
		h := make(map[string]sealing.Sealed, len(e.Headers))
		for name, v := range e.Headers {
			sealed, err := s.opts.Keys.Seal([]byte(v), sealAD(e.ConsumerGroup, fieldHeaders, name))
			if err != nil {
				return nil, nil, fmt.Errorf("encrypt header %q of endpoint %q: %w", name, e.ConsumerGroup, err)
			}
			h[name] = sealed
		}
		set[fieldHeadersSealed] = h
	}
	return set, unset, nil
}

// openSecrets fills ep's secret, previous secret and headers from d's sealed form, when d has one. It
// returns a *DecryptError naming the endpoint and field when a value does not decrypt.
func (d *subscriptionDoc) openSecrets(ep *pulsetype.Endpoint, keys *sealing.Keyring) error {
	if d.SecretSealed != nil {
		v, err := keys.Open(*d.SecretSealed, sealAD(d.ID, fieldSecret, ""))
		if err != nil {
			return &DecryptError{ConsumerGroup: d.ID, Field: fieldSecret, Err: err}
		}
		ep.Secret = string(v)
	}
	if d.PreviousSecretSealed != nil {
		v, err := keys.Open(*d.PreviousSecretSealed, sealAD(d.ID, fieldPreviousSecret, ""))
		if err != nil {
			return &DecryptError{ConsumerGroup: d.ID, Field: fieldPreviousSecret, Err: err}
		}
		ep.PreviousSecret = string(v)
	}
	if len(d.HeadersSealed) > 0 {
		h := make(map[string]string, len(d.HeadersSealed)+len(ep.Headers))
		for name, v := range ep.Headers {
			h[name] = v
		}
		for name, sealed := range d.HeadersSealed {
			v, err := keys.Open(sealed, sealAD(d.ID, fieldHeaders, name))
			if err != nil {
				return &DecryptError{ConsumerGroup: d.ID, Field: fieldHeaders + "." + name, Err: err}
			}
			h[name] = string(v)
		}
		ep.Headers = h
	}
	return nil
}

// CheckSecrets reads every endpoint and returns the first *DecryptError, so a sidecar started without the
// key of a stored value stops at once, naming the endpoint. It also returns how many endpoints still hold
// secrets in clear or under an older key (rewritten, and so re-encrypted, when next registered).
func (s *Store) CheckSecrets(ctx context.Context) (stale int, err error) {
	docs, err := findAll[subscriptionDoc](ctx, s, s.subscriptions, "check endpoint secrets", bson.M{}, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		return 0, err
	}
	primary := s.opts.Keys.PrimaryKeyID()
	for i := range docs {
		d := &docs[i]
		if _, err := d.endpoint(s.opts.Keys); err != nil {
			return 0, err
		}
		if primary == "" {
			continue
		}
		old := d.Secret != "" || d.PreviousSecret != "" || len(d.Headers) > 0 ||
			(d.SecretSealed != nil && d.SecretSealed.KeyID != primary) ||
			(d.PreviousSecretSealed != nil && d.PreviousSecretSealed.KeyID != primary)
		for _, h := range d.HeadersSealed {
			old = old || h.KeyID != primary
		}
		if old {
			stale++
		}
	}
	return stale, nil
}
