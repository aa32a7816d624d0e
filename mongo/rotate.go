package mongo

import (
	"context"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// maxRotateTries bounds how often RotateSecret reads and writes again when the endpoint changed between its
// read and its write.
const maxRotateTries = 4

// RotateSecret replaces the signing secret of a consumer group's endpoint with secret and keeps the replaced
// one signing beside it for overlap (docs/delivery.md, "Rotating a secret"); the write is fenced by updatedAt
// and tried at most maxRotateTries times. It returns the endpoint as stored, pulsetype.ErrNotFound, a
// *pulsetype.FieldError for field "secret" when secret is the current one, or a *DecryptError when the
// current secret does not decrypt.
func (s *Store) RotateSecret(ctx context.Context, group, secret string, overlap time.Duration) (*pulsetype.Endpoint, error) {
	for range maxRotateTries {
		doc, err := s.endpointDoc(ctx, group)
		if err != nil {
			return nil, err
		}
		cur, err := doc.endpoint(s.opts.Keys)
		if err != nil {
			return nil, err
		}
		if cur.Secret == secret {
			return nil, &pulsetype.FieldError{Field: "secret", Message: "is the current secret; a rotation needs a new one"}
		}
		now := s.now()
		next := *cur
		next.Secret, next.PreviousSecret, next.PreviousSecretExpiresAt = secret, "", nil
		if overlap > 0 && cur.Secret != "" {
			until := now.Add(overlap)
			next.PreviousSecret, next.PreviousSecretExpiresAt = cur.Secret, &until
		}
		set, unset, err := s.secretFields(&next)
		if err != nil {
			return nil, err
		}
		set["updatedAt"] = now
		res, err := s.subscriptions.UpdateOne(ctx, bson.M{"_id": group, "updatedAt": doc.UpdatedAt}, bson.M{"$set": set, "$unset": unset})
		if err != nil {
			return nil, wrap("rotate secret", err)
		}
		if res.MatchedCount > 0 {
			return s.GetEndpoint(ctx, group)
		}
	}
	return nil, fmt.Errorf("rotate the secret of endpoint %q: it changed during each of %d tries", group, maxRotateTries)
}
