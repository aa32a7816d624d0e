package mongo

import (
	"context"
	"errors"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// Ordered lines: the head of a (consumer group, topic, ordering key) line is claimed only when no earlier
// event of the line can still appear (docs/delivery.md, "Ordered lines"). The heads of many lines are
// claimed in one round (ClaimHeads); the reads of the lines are in lineheads.go, the check of earlier
// events in linechecks.go.

// OrderSettle is how long after its createdAt an event may be POSTed at the head of an ordered consumer
// group. createdAt is stamped by the database inside the write that makes the event visible (see
// Publish), so an event with an earlier createdAt can become visible later only while such a write is
// still running on the server; OrderSettle bounds that, and the error of this process's estimate of the
// database clock, with a wide margin.
const OrderSettle = 100 * time.Millisecond

// MaxLineKeys bounds the lines (ordering keys) of one (consumer group, topic) that one ClaimHeads reads; a
// group with more is read on in the next claims (HeadClaims.Next).
const MaxLineKeys = 1000

// ClaimHeads leases the heads of many lines of an ordered consumer group's topic in one round
// (docs/delivery.md, "Ordered lines"): the current attempt of each line's oldest pending delivery, when it
// is unleased and due, the group is active, the event is past its settle window (OrderSettle) and no earlier
// event of the line can still appear (earlierMayAppear, queuedBefore); at most p.Limit of them, the lines
// looked at picked at random among the due ones (the others wait for a later round). A head of an earlier registration of the group is ended instead
// (endStaleHead), only when a read of the subscription after the head's tells so (staleAfterLook). It is safe for concurrent use, also by replicas: the lease is ClaimAttempts' fenced
// updateMany, so a head is leased once, and a look at a line changes nothing that a racing look relies on.
//
// A round costs, however many lines it looks at: one read of the lines' first queue documents
// (headsOfLines), and nothing more when none is due, ended or waiting for a retry; then at once one read of
// the subscription, one of those documents' deliveries by id, one of the picked due lines' unfinished
// fan-outs (unfinishedBefore) and one of their events (HeadClaims.Events); then at once one read of the
// group's deliveries of the earlier events found there (and after it of their events, only when some lack
// one) and one read of the picked heads' lines before them (queuedBefore); and the claim (two updateMany, and a read-back when
// another replica won some): nine commands when every line passes (claimRoundCommands in the tests). A line whose first queue document
// is of an ended delivery is looked at alone (lineHead: two or three commands more for it, and one read of
// the subscription again when its head's incarnation differs from the round's: staleAfterLook), and so are the
// lines past the bound of the fan-out query. A line whose first document carries a lease is running and is
// not looked at: if that lease is a stale copy (its claimer died between the two writes of an end), the
// reaper or the repair scan corrects it. It returns what it leased, possibly nothing, and when to look again,
// with the heads still settling (HeadClaims); errors are the database's, wrapped.
func (s *Store) ClaimHeads(ctx context.Context, p pulsetype.ClaimHeadsParams) (pulsetype.HeadClaims, error) {
	var out pulsetype.HeadClaims
	if p.Limit <= 0 {
		return out, nil
	}
	firsts, next, err := s.headsOfLines(ctx, p.ConsumerGroup, p.Topic, p.After)
	if err != nil {
		return out, err
	}
	out.Next = next
	now := s.now()
	var look, due []*queueDoc // the first documents whose deliveries are read; those of them due and settled
	for i := range firsts {
		q := &firsts[i]
		switch settled := q.EventCreatedAt.Add(OrderSettle); {
		case q.Ended, q.NextAttemptAt.After(now) && q.LeasedUntil == nil:
			look = append(look, q) // its delivery may have ended, or be of an earlier registration (see pendingHeads)
		case q.LeasedUntil != nil:
			// Running: its worker moves the line on.
		case now.Before(settled):
			settling(&out, q.EventID, settled.Sub(now))
		default:
			due = append(due, q)
		}
	}
	rand.Shuffle(len(due), func(i, j int) { due[i], due[j] = due[j], due[i] })
	due = due[:min(len(due), p.Limit)] // picked at random: a line past the limit waits for a later round
	look = append(look, due...)
	if len(look) == 0 {
		return out, nil
	}
	var (
		sub                             subscriptionDoc
		deliveries                      []deliveryDoc
		marks                           []outboxDoc
		covered                         map[string]time.Time
		subErr, readErr, markErr, evErr error
		wg                              sync.WaitGroup
	)
	wg.Go(func() {
		subErr = s.subscriptions.FindOne(ctx, bson.M{"_id": p.ConsumerGroup},
			options.FindOne().SetProjection(bson.M{"backfill": 1, "topics": 1, "filter": 1, "offsetReset": 1, "createdAt": 1, "incarnation": 1, "state": 1})).Decode(&sub)
	})
	wg.Go(func() {
		ids := distinct(idsOf(look, func(q *queueDoc) string { return q.DeliveryID }))
		deliveries, readErr = findAll[deliveryDoc](ctx, s, s.deliveries, "read deliveries of lines", bson.M{"_id": bson.M{"$in": ids}})
	})
	if len(due) > 0 {
		wg.Go(func() { marks, covered, markErr = s.unfinishedBefore(ctx, p.Topic, due) })
		wg.Go(func() {
			out.Events, evErr = s.GetEvents(ctx, idsOf(due, func(q *queueDoc) string { return q.EventID }))
		})
	}
	wg.Wait()
	if errors.Is(subErr, mongo.ErrNoDocuments) {
		return out, nil // deleted: its pending deliveries are being ended
	}
	if err := errors.Join(wrap("read subscription", subErr), readErr, markErr, evErr); err != nil {
		return out, err
	}
	for _, q := range due { // read, and not visible or expired any more: known to be gone
		if _, ok := out.Events[q.EventID]; !ok {
			out.Events[q.EventID] = nil
		}
	}
	heads, stale, err := s.pendingHeads(ctx, look, deliveries, &sub, now, &out)
	if err != nil {
		return out, err
	}
	if stale, err = s.staleAfterLook(ctx, p.ConsumerGroup, stale, &out); err != nil {
		return out, err
	}
	if len(stale) > 0 {
		// Deliveries of an earlier registration of the group (deleted and registered again while their POSTs
		// ran): they must not hold up the new registration's lines, whenever their retries would come due.
		if err := s.endStaleHeads(ctx, stale); err != nil {
			return out, err
		}
		out.Wait = pulsetype.MinWait(out.Wait, time.Millisecond)
	}
	if len(heads) == 0 || sub.State != "" && sub.State != pulsetype.EndpointActive {
		return out, nil // paused or disabled: the lines wait for resume
	}
	// Heads found behind documents of ended deliveries (lineHead) come later than what the fan-out query
	// covered: their lines' fan-outs are read up to them.
	var later []*queueDoc
	for _, h := range heads {
		if bound, ok := covered[h.q.OrderingKey]; !ok || h.q.EventCreatedAt.After(bound) {
			later = append(later, h.q)
		}
	}
	if len(later) > 0 {
		more, _, err := s.unfinishedBefore(ctx, p.Topic, later)
		if err != nil {
			return out, err
		}
		marks = append(marks, more...)
	}
	heads = heads[:min(len(heads), p.Limit)] // those found behind ended deliveries come last
	// The check of the earlier events the fan-outs name and one more read of the lines, at once. The read
	// again finds an earlier event whose fan-out finished between the lines' read and the fan-outs' (the
	// repair of an interrupted fan-out: its queue documents written, then its outbox document removed): its
	// queue document is written first. An earlier event whose fan-out finishes during these two reads holds
	// its line in earlierMayAppear (see there).
	var (
		blocked, earlier, moved map[string]bool
		checkErr, lineErr       error
	)
	wg.Go(func() { blocked, earlier, checkErr = s.earlierMayAppear(ctx, &sub, heads, marks) })
	wg.Go(func() { moved, lineErr = s.queuedBefore(ctx, heads) })
	wg.Wait()
	if err := errors.Join(checkErr, lineErr); err != nil {
		return out, err
	}
	if len(moved) > 0 || len(earlier) > 0 {
		out.Wait = pulsetype.MinWait(out.Wait, time.Millisecond) // the line moved during the look: look again at once
	}
	heads = slices.DeleteFunc(heads, func(h *lineHeadDoc) bool { return blocked[h.q.ID] || earlier[h.q.ID] || moved[h.q.ID] })
	if len(heads) == 0 {
		return out, nil
	}
	attempts := make([]*pulsetype.Attempt, len(heads))
	for i, h := range heads {
		attempts[i] = h.q.attempt()
	}
	out.Attempts, err = s.ClaimAttempts(ctx, p.Owner, attempts) // the leases run from now, after the checks' round trips
	maps.DeleteFunc(out.Events, func(id string, _ *pulsetype.Event) bool {
		return !slices.ContainsFunc(out.Attempts, func(a *pulsetype.Attempt) bool { return a.EventID == id })
	})
	return out, err
}

// settling notes in out the head of event id inside its settle window for d more: in Settling, and in Wait.
func settling(out *pulsetype.HeadClaims, id string, d time.Duration) {
	if out.Settling == nil {
		out.Settling = map[string]time.Duration{}
	}
	out.Settling[id] = d
	out.Wait = pulsetype.MinWait(out.Wait, d)
}

// lineHeadDoc is the pending head of a line as a look at it found it: the delivery, the queue document of
// its latest attempt, and the ids of the queue documents before it in the line (of ended deliveries; set
// only when the line was looked at alone, by lineHead).
type lineHeadDoc struct {
	d      *deliveryDoc
	q      *queueDoc
	passed []string
	alone  bool // found by lineHead, whose read came after the round's read of the subscription
}

// pendingHeads returns, of the lines' first queue documents look and their deliveries (as read), the
// pending heads that may be claimed (unleased, due and settled; a later settle is noted in out.Wait) and
// those of an earlier registration than sub's. A document whose delivery does not exist yet is of a fan-out
// under way (queued before written): its line waits. A document whose delivery ended heads a line that is
// looked at alone (lineHead): the pending head behind it is found there. One whose attempt ended while its
// delivery is pending waits for the delivery's next step, and one waiting for its retry for the retry
// (polling finds it when it is due).
func (s *Store) pendingHeads(ctx context.Context, look []*queueDoc, deliveries []deliveryDoc, sub *subscriptionDoc, now time.Time,
	out *pulsetype.HeadClaims) (heads, stale []*lineHeadDoc, err error) {
	byID := make(map[string]*deliveryDoc, len(deliveries))
	for i := range deliveries {
		byID[deliveries[i].ID] = &deliveries[i]
	}
	for _, q := range look {
		h := &lineHeadDoc{d: byID[q.DeliveryID], q: q}
		switch {
		case h.d == nil:
			continue // its fan-out is under way: wait for it
		case h.d.Status != pulsetype.StatusPending:
			line := pulsetype.Line{ConsumerGroup: q.ConsumerGroup, Topic: q.Topic, OrderingKey: q.OrderingKey}
			if h.d, h.q, h.passed, err = s.lineHead(ctx, line); err != nil {
				return nil, nil, err
			}
			h.alone = true
			if h.d == nil {
				continue
			}
		}
		switch settled := h.q.EventCreatedAt.Add(OrderSettle); {
		case h.d.Incarnation != sub.Incarnation:
			stale = append(stale, h)
		case h.q.Ended, h.q.LeasedUntil != nil, h.q.NextAttemptAt.After(now):
		case now.Before(settled):
			settling(out, h.q.EventID, settled.Sub(now))
		default:
			heads = append(heads, h)
		}
	}
	return heads, stale, nil
}

// staleAfterLook returns the heads of stale that are known to be of an earlier registration of group than
// the current one, and defers the others to the next round (out.Wait). A head is known stale when its
// delivery's incarnation differs from a read of the subscription made after the head was read: that
// delivery was fanned out from a registration that existed when its queue document was read, so the
// subscription read later is of that registration or a later one, and incarnations differ only across a
// delete and register again. The round's subscription read comes after the read of the lines' first queue
// documents (headsOfLines), so it decides for the heads found there; lineHead reads its line after it
// (pendingHeads), and in between the group may have been deleted and registered again and an event fanned
// out to the new registration on that line: that head's incarnation is newer than the round's read, not
// older. For those heads the subscription's incarnation is read again (one more command, only when
// such a head differs): one that still differs is stale; one that now matches belongs to the registration
// the round did not read (its filter, state, backfill), and waits for the next round, which reads it; when
// the group is gone the deletion ends its pending deliveries.
func (s *Store) staleAfterLook(ctx context.Context, group string, stale []*lineHeadDoc, out *pulsetype.HeadClaims) ([]*lineHeadDoc, error) {
	if !slices.ContainsFunc(stale, func(h *lineHeadDoc) bool { return h.alone }) {
		return stale, nil
	}
	var now subscriptionDoc
	err := s.subscriptions.FindOne(ctx, bson.M{"_id": group}, options.FindOne().SetProjection(bson.M{"incarnation": 1})).Decode(&now)
	gone := errors.Is(err, mongo.ErrNoDocuments)
	if err != nil && !gone {
		return nil, wrap("read subscription again", err)
	}
	return slices.DeleteFunc(stale, func(h *lineHeadDoc) bool {
		if !h.alone {
			return false
		}
		if gone || h.d.Incarnation == now.Incarnation {
			out.Wait = pulsetype.MinWait(out.Wait, time.Millisecond)
			return true
		}
		return false
	}), nil
}

// endStaleHeads reads the current attempts of the heads of an earlier registration (one query by id) and
// ends each delivery with endStaleHead. An attempt not found is being created (the repair scan creates it
// after a crash): its delivery waits.
func (s *Store) endStaleHeads(ctx context.Context, stale []*lineHeadDoc) error {
	ids := idsOf(stale, func(h *lineHeadDoc) string { return h.q.ID })
	attempts, err := findAll[attemptDoc](ctx, s, s.history, "find head attempts of an earlier registration", bson.M{"_id": bson.M{"$in": ids}})
	if err != nil {
		return err
	}
	for _, h := range stale {
		i := slices.IndexFunc(attempts, func(a attemptDoc) bool { return a.ID == h.q.ID })
		if i < 0 {
			continue
		}
		if err := s.endStaleHead(ctx, h.d, &attempts[i]); err != nil {
			return err
		}
	}
	return nil
}

// endStaleHead ends a pending delivery that belongs to an earlier registration of its group, and its current
// attempt unless a worker holds its lease (that worker ends the delivery when its POST returns): error
// endpoint_deleted, with endedAt and expiresAt.
func (s *Store) endStaleHead(ctx context.Context, d *deliveryDoc, at *attemptDoc) error {
	now := s.now()
	info := &pulsetype.ErrorInfo{Code: pulsetype.CodeEndpointDeleted, Message: "the consumer group " + d.ConsumerGroup +
		" was deleted and registered again; this delivery belongs to the earlier registration"}
	if at.Status == pulsetype.StatusPending {
		res, err := s.history.UpdateOne(ctx, unleased(at.ID),
			bson.M{"$set": s.outcomeSet(pulsetype.AttemptResult{Status: pulsetype.StatusError, Terminal: true, Error: info}, now)})
		if err != nil {
			return wrap("end attempt of an earlier registration", err)
		}
		if res.MatchedCount == 0 {
			return nil // leased meanwhile: its worker ends the delivery
		}
	}
	_, err := s.EndDelivery(ctx, pulsetype.EndDeliveryParams{DeliveryID: d.ID, Status: pulsetype.StatusError, FinalAttempt: at.Attempt, Error: info})
	return err
}

// keyFilter matches an ordering key in a query: the key itself, or for "" documents without one (a null
// equality, which an index on orderingKey serves).
func keyFilter(key string) any {
	if key == "" {
		return nil
	}
	return key
}
