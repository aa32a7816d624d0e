package mongo

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// maxCancelTries bounds how often a cancel looks at a delivery's attempts again when another writer changed
// them between its read and its write (a claim, a retry created by a result or the repair scan).
const maxCancelTries = 4

// cancelled is the error of a cancelled delivery and of the attempt that records its cancel. The attempt's
// text stays in the delivery's history after a retry or replay, above the attempts that re-opened it, so it
// says what holds either way: nothing more is sent until then.
var cancelled = &pulsetype.ErrorInfo{Code: pulsetype.CodeCancelled, Message: "cancelled through the API: nothing more is sent unless the delivery is retried or replayed"}

// CancelDelivery ends a pending delivery as cancelled in two writes that keep every later attempt from being
// sent (docs/delivery.md, "Cancelling a delivery"); a POST leased before it may still finish
// (CancelResult.InFlight). It returns pulsetype.ErrNotFound when the delivery does not exist or has expired,
// and pulsetype.ErrTerminal (wrapped, naming the status) when it is terminal, also when its in-flight attempt
// ended it first.
func (s *Store) CancelDelivery(ctx context.Context, id string) (pulsetype.CancelResult, error) {
	d, err := s.deliveryDoc(ctx, id)
	if err != nil {
		return pulsetype.CancelResult{}, err
	}
	if d.Status != pulsetype.StatusPending {
		return pulsetype.CancelResult{}, fmt.Errorf("delivery %s is %s: %w", id, d.Status, pulsetype.ErrTerminal)
	}
	res, taken, err := s.stopAttempts(ctx, d.delivery())
	if err != nil {
		return pulsetype.CancelResult{}, err
	}
	now := s.now()
	upd, err := s.deliveries.UpdateOne(ctx, bson.M{"_id": id, "status": pulsetype.StatusPending},
		bson.M{"$set": endSet(pulsetype.StatusCancelled, res.FinalAttempt, cancelled, now, expiry(now, s.opts.HistoryRetention))})
	if err != nil {
		return pulsetype.CancelResult{}, wrap("cancel delivery", err)
	}
	if upd.ModifiedCount > 0 {
		if !res.InFlight { // no attempt of it is pending: nothing of it stays queued
			// Fenced by attempt number, as EndDelivery is: a retry that reopened the delivery between two tries
			// of this re-issued delete queued an attempt after FinalAttempt, which stays.
			if _, err := s.deleteMany(ctx, s.queue, bson.M{"deliveryId": id, "attempt": bson.M{"$lte": res.FinalAttempt}}); err != nil {
				return pulsetype.CancelResult{}, wrap("remove a cancelled delivery from the queue", err)
			}
		}
		return res, nil
	}
	// Ended meanwhile: by the repair scan finishing this very cancel from its attempt, by another cancel, or by
	// the result of the attempt in flight.
	d, err = s.deliveryDoc(ctx, id)
	if err != nil {
		return pulsetype.CancelResult{}, err
	}
	if d.Status == pulsetype.StatusCancelled && d.FinalAttempt == res.FinalAttempt {
		return res, nil
	}
	if taken != "" { // the number this cancel took records a cancel that did not happen
		if _, err := s.history.DeleteOne(ctx, bson.M{"_id": taken, "status": pulsetype.StatusError}); err != nil {
			return pulsetype.CancelResult{}, wrap("remove the attempt of a cancel that lost", err)
		}
	}
	return pulsetype.CancelResult{}, fmt.Errorf("delivery %s became %s while it was being cancelled: %w", id, d.Status, pulsetype.ErrTerminal)
}

// deliveryDoc returns a delivery document, or pulsetype.ErrNotFound when there is none or it has expired.
func (s *Store) deliveryDoc(ctx context.Context, id string) (*deliveryDoc, error) {
	var doc deliveryDoc
	err := s.deliveries.FindOne(ctx, bson.M{"_id": id}).Decode(&doc)
	if errors.Is(err, mongo.ErrNoDocuments) || (err == nil && expired(doc.ExpiresAt, s.now())) {
		return nil, pulsetype.ErrNotFound
	}
	if err != nil {
		return nil, wrap("get delivery", err)
	}
	return &doc, nil
}

// stopAttempts is step 1 of CancelDelivery. It returns what it did and, when it inserted the ended attempt
// that takes the next number, that attempt's id.
func (s *Store) stopAttempts(ctx context.Context, d *pulsetype.Delivery) (res pulsetype.CancelResult, taken string, err error) {
	for range maxCancelTries {
		attempts, err := s.queuedAttemptsOf(ctx, d.ID)
		if err != nil {
			return res, "", err
		}
		now := s.now()
		ended := s.outcomeSet(pulsetype.AttemptResult{Status: pulsetype.StatusError, Terminal: true, Error: cancelled}, now)
		// A reopened delivery's attempt may not exist yet: its number is reopenedAttempt.
		next, inFlight := max(1, d.ReopenedAttempt), false
		if len(attempts) > 0 {
			last := attempts[len(attempts)-1]
			if last.Status == pulsetype.StatusPending && last.LeasedUntil == nil {
				upd, err := s.history.UpdateOne(ctx, unleased(last.ID),
					bson.M{"$set": ended})
				if err != nil {
					return res, "", wrap("end the waiting attempt of a cancelled delivery", err)
				}
				if upd.MatchedCount > 0 {
					return pulsetype.CancelResult{FinalAttempt: last.Number}, "", nil
				}
				continue // leased meanwhile: its POST is in flight now
			}
			// Leased (also with an expired lease, which the reaper ends), or ended with its follow-up not
			// written yet.
			inFlight = last.Status == pulsetype.StatusPending
			next = max(next, last.Number+1)
		}
		doc := newAttemptDoc(d.Ref(), next, now, now)
		doc.Status, doc.EndedAt, doc.Terminal, doc.Error = pulsetype.StatusError, &now, true, cancelled
		doc.ExpiresAt = expiry(now, s.opts.HistoryRetention)
		_, err = s.history.InsertOne(ctx, doc)
		if mongo.IsDuplicateKeyError(err) {
			continue // created meanwhile (a retry, a repair): look again
		}
		if err != nil {
			return res, "", wrap("take the next attempt of a cancelled delivery", err)
		}
		return pulsetype.CancelResult{FinalAttempt: next, InFlight: inFlight}, doc.ID, nil
	}
	return res, "", fmt.Errorf("cancel delivery %s: its attempts changed during each of %d tries", d.ID, maxCancelTries)
}

// queuedAttemptsOf returns the attempts of a pending delivery that the queue holds (its latest, and an
// ended one whose next step is being written), by number: one query of the queue and one read of the
// attempts by id. A delivery without queue documents (written before the queue existed, and not migrated)
// gets all its attempts (AttemptsOf).
func (s *Store) queuedAttemptsOf(ctx context.Context, deliveryID string) ([]*pulsetype.Attempt, error) {
	queued, err := findAll[queueDoc](ctx, s, s.queue, "find queued attempts", bson.M{"deliveryId": deliveryID},
		options.Find().SetProjection(bson.M{"_id": 1}))
	if err != nil {
		return nil, err
	}
	if len(queued) == 0 {
		byDelivery, err := s.AttemptsOf(ctx, []string{deliveryID})
		return byDelivery[deliveryID], err
	}
	ids := idsOf(queued, func(q queueDoc) string { return q.ID })
	docs, err := findAll[attemptDoc](ctx, s, s.history, "read queued attempts", bson.M{"_id": bson.M{"$in": ids}})
	if err != nil {
		return nil, err
	}
	out := make([]*pulsetype.Attempt, len(docs))
	for i := range docs {
		out[i] = docs[i].attempt()
	}
	slices.SortFunc(out, func(a, b *pulsetype.Attempt) int { return a.Number - b.Number })
	return out, nil
}
