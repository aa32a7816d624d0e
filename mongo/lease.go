package mongo

import (
	"context"
	"time"

	"github.com/google/uuid"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// The lease: its stored fields, the one fence filter of every write only its holder may make, the one
// minting of fencing tokens, and the queue's copy of it.

// The stored names of a lease's fields. An attempt's history document holds the whole lease, its queue
// document a copy of fieldLeasedUntil and fieldFencingToken (so that claims skip it and the reaper finds it
// once it expires), and a subscription's backfill its discovery lease under "backfill.". The names keep the
// earlier spelling (see attemptDoc); the struct tags of attemptDoc, queueDoc and backfillDoc spell them too.
const (
	fieldLeaseOwner   = "lockOwner"   // who holds the lease (a dispatcher's owner id)
	fieldFencingToken = "lockToken"   // the fencing token of every write its holder makes
	fieldLeasedAt     = "lockedAt"    // when the lease was taken
	fieldLeasedUntil  = "lockedUntil" // when the lease expires unless renewed; absent when nobody holds it
	fieldHeartbeatAt  = "heartbeatAt" // the holder's latest renewal
	fieldStartedAt    = "startedAt"   // when the attempt's run began (the claim)
)

// newFencingToken mints a fencing token: a fresh UUIDv7, so that tokens of later leases sort later.
func newFencingToken() string { return uuid.Must(uuid.NewV7()).String() }

// lease is one lease as it is written: held by owner under token, taken at and valid until until.
type lease struct {
	owner, token string
	at, until    time.Time
}

// newLease returns a lease for owner under a fresh fencing token, taken now, for one lease timeout.
func (s *Store) newLease(owner string) lease {
	now := s.now()
	return lease{owner: owner, token: newFencingToken(), at: now, until: now.Add(s.opts.LeaseTimeout)}
}

// historySet is the $set that leases an attempt's history document: its lease fields, heartbeatAt and
// startedAt the time the lease was taken.
func (l lease) historySet() bson.M {
	return bson.M{fieldLeaseOwner: l.owner, fieldFencingToken: l.token, fieldLeasedAt: l.at, fieldLeasedUntil: l.until,
		fieldHeartbeatAt: l.at, fieldStartedAt: l.at}
}

// queueSet is the $set of the lease's copy in a queue document.
func (l lease) queueSet() bson.M { return queueLeaseSet(l.until, l.token) }

// queueLeaseSet is the $set of a lease's copy (expiring at until, under token) in a queue document.
func queueLeaseSet(until any, token string) bson.M {
	return bson.M{fieldLeasedUntil: until, fieldFencingToken: token}
}

// apply writes the lease into the fields of an attempt's history document and of its queue document, as
// historySet and queueSet write them.
func (l lease) apply(a *attemptDoc, q *queueDoc) {
	a.LeaseOwner, a.FencingToken, a.LeasedAt, a.LeasedUntil, a.HeartbeatAt, a.StartedAt = l.owner, l.token, &l.at, &l.until, &l.at, &l.at
	q.LeasedUntil, q.FencingToken = &l.until, l.token
}

// historyLeaseUnset is the $unset that gives an attempt's lease back (its history document).
var historyLeaseUnset = bson.M{fieldLeaseOwner: "", fieldFencingToken: "", fieldLeasedAt: "", fieldLeasedUntil: "", fieldHeartbeatAt: "",
	fieldStartedAt: ""}

// queueLeaseUnset is the $unset that removes a queue document's copy of a lease.
var queueLeaseUnset = bson.M{fieldLeasedUntil: "", fieldFencingToken: ""}

// fence is the filter of a write to the history that only the leases' holder may make: the
// attempts' ids, their fencing tokens and status pending. For more than one key it matches by $in on each
// (one claim leases its batch under one token, so the tokens are few).
func fence(keys ...pulsetype.LeaseKey) bson.M {
	if len(keys) == 1 {
		return bson.M{"_id": keys[0].AttemptID, fieldFencingToken: keys[0].Token, "status": pulsetype.StatusPending}
	}
	ids, tokens := make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		ids[i], tokens[i] = k.AttemptID, k.Token
	}
	return bson.M{"_id": bson.M{"$in": ids}, fieldFencingToken: bson.M{"$in": distinct(tokens)}, "status": pulsetype.StatusPending}
}

// unleased is the filter of a write to the history that only an attempt nobody holds may take: the ids
// (one, or an {"$in": …}), status pending and no lease.
func unleased(ids any) bson.M {
	return bson.M{"_id": ids, "status": pulsetype.StatusPending, fieldLeasedUntil: nil}
}

// hintQueue corrects the queue documents of attempts found otherwise than the queue said: a leased one
// gets its lease copied, an ended one is marked ended (claims skip it; the repair scan finishes it), one
// pending and unleased loses its lease copy. It costs one bulk update.
func (s *Store) hintQueue(ctx context.Context, attempts []*attemptDoc) error {
	if len(attempts) == 0 {
		return nil
	}
	models := make([]mongo.WriteModel, len(attempts))
	for i, a := range attempts {
		var update bson.M
		switch {
		case a.Status != pulsetype.StatusPending:
			update = bson.M{"$set": bson.M{"ended": true}}
		case a.LeasedUntil != nil:
			update = bson.M{"$set": queueLeaseSet(a.LeasedUntil, a.FencingToken)}
		default:
			update = bson.M{"$unset": queueLeaseUnset}
		}
		models[i] = mongo.NewUpdateOneModel().SetFilter(bson.M{"_id": a.ID}).SetUpdate(update)
	}
	if _, err := s.bulkUpdate(ctx, s.queue, models); err != nil {
		return wrap("correct queue documents", err)
	}
	return nil
}

// leaseCopyStale reports whether queue document q's copy of the lease (lockedUntil, lockToken) differs from
// the lease of its pending attempt a.
func leaseCopyStale(q *queueDoc, a *attemptDoc) bool {
	if q.LeasedUntil == nil || a.LeasedUntil == nil {
		return q.LeasedUntil != a.LeasedUntil
	}
	return !q.LeasedUntil.Equal(*a.LeasedUntil) || q.FencingToken != a.FencingToken
}

// distinct returns the distinct values of vs, in first-seen order.
func distinct(vs []string) []string {
	seen := make(map[string]bool, len(vs))
	out := vs[:0:0]
	for _, v := range vs {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}
