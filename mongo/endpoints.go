package mongo

import (
	"context"
	"errors"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// PutEndpoint creates or replaces the endpoint of e.ConsumerGroup (e must be normalized) and returns it as
// stored. created is true when the consumer group was new; a new group gets a fresh incarnation, a replaced
// one keeps its own. Concurrent registrations of one group by several replicas leave one subscription
// document (its _id is the group). A replacement that removes topics ends the group's pending deliveries of
// those topics as error/unsubscribed (see EndPending); one that changes only the URL, headers or policy
// keeps pending work, which the next attempts deliver with the new settings. A rotation's previous secret
// (RotateSecret) stays, with the end of its overlap, only when e keeps the current secret; any other PUT
// ends the overlap. e's own previous-secret fields are ignored, and so are its state fields: a replaced
// endpoint keeps its state (see SetEndpointState).
func (s *Store) PutEndpoint(ctx context.Context, e *pulsetype.Endpoint) (stored *pulsetype.Endpoint, created bool, err error) {
	now := s.now()
	// The previous registration is read without decrypting it: a PUT replaces values that no configured key
	// opens any more.
	prev, err := s.endpointDoc(ctx, e.ConsumerGroup)
	if err != nil && !errors.Is(err, pulsetype.ErrNotFound) {
		return nil, false, err
	}
	e = s.keepRotation(e, prev)
	set := bson.M{
		"url": e.URL, "topics": e.Topics, "filter": e.Filter, "delivery": e.Delivery, "ordered": e.Ordered, "format": e.Format,
		"offsetReset": e.OffsetReset, "maxRetries": *e.MaxRetries, "retryDelayMs": ms(e.RetryDelay),
		"retryBackoffMultiplier": *e.RetryBackoffMultiplier, "maxRetryDelayMs": ms(e.MaxRetryDelay),
		"timeoutMs": ms(e.Timeout), "maxConcurrency": *e.MaxConcurrency,
		"insecureSkipVerify": e.InsecureSkipVerify, "rateLimit": e.RateLimit,
		"disableAfterMs": time.Duration(e.DisableAfter).Milliseconds(), "updatedAt": now,
		"maxRetryDurationMs":  time.Duration(e.MaxRetryDuration).Milliseconds(),
		"backlogAlertAfterMs": time.Duration(e.BacklogAlertAfter).Milliseconds(),
	}
	secretSet, secretUnset, err := s.secretFields(e)
	if err != nil {
		return nil, false, err
	}
	maps.Copy(set, secretSet)
	setOnInsert := bson.M{"createdAt": now, "incarnation": uuid.Must(uuid.NewV7()).String()}
	if e.OffsetReset == pulsetype.OffsetEarliest {
		// A new earliest-offset group receives every retained event: the backfill walks them once. An existing
		// group that adds topics walks again (deliveries that exist already are duplicate-key no-ops).
		switch {
		case prev == nil:
			setOnInsert["backfill"] = backfillState{}
		case addsTopics(prev.Topics, e.Topics):
			set["backfill"] = backfillState{}
		}
	}
	update := bson.M{"$set": set, "$setOnInsert": setOnInsert, "$unset": secretUnset}
	for try := 0; ; try++ {
		res, err := s.subscriptions.UpdateOne(ctx, bson.M{"_id": e.ConsumerGroup}, update, options.UpdateOne().SetUpsert(true))
		if mongo.IsDuplicateKeyError(err) && try < 3 {
			continue // two upserts raced on a new _id: the loser retries as an update
		}
		if err != nil {
			return nil, false, wrap("put endpoint", err)
		}
		stored, err := s.GetEndpoint(ctx, e.ConsumerGroup)
		if err != nil {
			return nil, false, err
		}
		if prev != nil && prev.Incarnation == stored.Incarnation {
			if err := s.endUnwanted(ctx, prev, stored); err != nil {
				return nil, false, err
			}
		}
		return stored, res.UpsertedCount > 0, nil
	}
}

// endUnwanted ends the pending work of a replaced registration that the replacement no longer wants, as
// error/unsubscribed: with another filter, all of it (its deliveries were chosen by the old filter, and a
// filter is never evaluated after a delivery is made: replay brings back what the new one wants); else the
// work of the topics no longer subscribed (a topic removed while a pattern still matches it stays).
func (s *Store) endUnwanted(ctx context.Context, prev *subscriptionDoc, stored *pulsetype.Endpoint) error {
	if prev.Filter != stored.Filter {
		return s.EndPending(ctx, pulsetype.EndPendingParams{ConsumerGroup: stored.ConsumerGroup,
			Error: pulsetype.ErrorInfo{Code: pulsetype.CodeUnsubscribed, Message: "the consumer group's filter changed"}})
	}
	removed := missing(prev.Topics, stored.Topics)
	if len(removed) == 0 {
		return nil
	}
	p := pulsetype.EndPendingParams{ConsumerGroup: stored.ConsumerGroup, Topics: removed, Keep: stored.Subscribes,
		Error: pulsetype.ErrorInfo{Code: pulsetype.CodeUnsubscribed, Message: "the consumer group no longer subscribes to this topic"}}
	if slices.ContainsFunc(removed, func(t string) bool { return strings.HasSuffix(t, ".*") }) {
		p.Topics = nil // a pattern: the group's work of every topic, less what Keep keeps
	}
	return s.EndPending(ctx, p)
}

// keepRotation returns a copy of e whose previous secret is prev's, when prev (the stored registration, nil
// when there is none) is in the overlap of a rotation and e keeps its current secret; otherwise the copy has
// none. A prev that does not decrypt has no overlap to keep.
func (s *Store) keepRotation(e *pulsetype.Endpoint, prev *subscriptionDoc) *pulsetype.Endpoint {
	c := *e
	c.PreviousSecret, c.PreviousSecretExpiresAt = "", nil
	if prev == nil || c.Secret == "" {
		return &c
	}
	cur, err := prev.endpoint(s.opts.Keys)
	if err == nil && cur.Secret == c.Secret && cur.PreviousSecretAt(s.now()) != "" {
		c.PreviousSecret, c.PreviousSecretExpiresAt = cur.PreviousSecret, cur.PreviousSecretExpiresAt
	}
	return &c
}

// GetEndpoint returns the endpoint of a consumer group, its secret and header values decrypted, or
// pulsetype.ErrNotFound, or a *DecryptError naming the group.
func (s *Store) GetEndpoint(ctx context.Context, group string) (*pulsetype.Endpoint, error) {
	doc, err := s.endpointDoc(ctx, group)
	if err != nil {
		return nil, err
	}
	return doc.endpoint(s.opts.Keys)
}

// endpointDoc returns the subscription document of a consumer group as stored, or pulsetype.ErrNotFound.
func (s *Store) endpointDoc(ctx context.Context, group string) (*subscriptionDoc, error) {
	var doc subscriptionDoc
	err := s.subscriptions.FindOne(ctx, bson.M{"_id": group}).Decode(&doc)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil, pulsetype.ErrNotFound
	}
	if err != nil {
		return nil, wrap("get endpoint", err)
	}
	return &doc, nil
}

// ListEndpoints returns every endpoint, ordered by consumer group; a *DecryptError when one endpoint's
// secret or header value does not decrypt.
func (s *Store) ListEndpoints(ctx context.Context) ([]*pulsetype.Endpoint, error) {
	docs, err := findAll[subscriptionDoc](ctx, s, s.subscriptions, "list endpoints", bson.M{}, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		return nil, err
	}
	out := make([]*pulsetype.Endpoint, len(docs))
	for i := range docs {
		if out[i], err = docs[i].endpoint(s.opts.Keys); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// DeleteEndpoint removes a consumer group's endpoint and ends its pending deliveries as
// error/endpoint_deleted (see EndPending): the first page of Options.PageSize at once, the rest by the
// repair scan, which ends the work of a deleted group, so the call's time is bounded whatever the backlog.
// It returns how many it ended and how many stayed pending (pulsetype.Deleted), or pulsetype.ErrNotFound when
// the group has no endpoint (after ending whatever the group still had pending).
func (s *Store) DeleteEndpoint(ctx context.Context, group string) (pulsetype.Deleted, error) {
	res, err := s.subscriptions.DeleteOne(ctx, bson.M{"_id": group})
	if err != nil {
		return pulsetype.Deleted{}, wrap("delete endpoint", err)
	}
	// Ended also when the group was already gone: a delete that failed (or crashed) between its two steps is
	// finished by deleting again. Only the first page here, so the request is answered in a bounded time
	// whatever the backlog: the repair scan ends the rest of a deleted group's work (reconciler, KindDeletedGroup),
	// and nothing of the group is POSTed meanwhile, its endpoint being gone.
	ended, err := s.endPending(ctx, pulsetype.EndPendingParams{ConsumerGroup: group,
		Error: pulsetype.ErrorInfo{Code: pulsetype.CodeEndpointDeleted, Message: "the consumer group was deleted"}}, 1)
	if err != nil {
		return pulsetype.Deleted{}, err
	}
	// What is left for the repair scan: a count of index keys (pulse_deliveries_group_status_created), as
	// GET /v1/stats counts a group's pending deliveries.
	left, err := s.deliveries.CountDocuments(ctx, bson.M{"consumerGroup": group, "status": pulsetype.StatusPending},
		options.Count().SetHint("pulse_deliveries_group_status_created"))
	if err != nil {
		return pulsetype.Deleted{}, wrap("count the deleted group's pending deliveries", err)
	}
	if res.DeletedCount == 0 {
		return pulsetype.Deleted{}, pulsetype.ErrNotFound
	}
	return pulsetype.Deleted{Ended: ended, Remaining: left}, nil
}

// EndPending ends the pending work of p.ConsumerGroup (of p.Topics only, when given) that its subscription
// no longer wants, with p.Error (docs/delivery.md, "Ending a consumer group's work"), found through the queue,
// which holds every pending delivery. It walks the group's queue documents with one cursor (the driver's
// batches) and ends them a page of Options.PageSize at a time: per page one update of the waiting attempts,
// one read of them, one update of the deliveries without a POST in flight and one delete of the ended
// attempts' queue documents, each naming at most PageSize ids, so no command grows with the backlog (MongoDB
// refuses a command over 16 MiB: about 340,000 ids in one $in). A POST in flight is left to its worker.
// Running it twice, or again after it stopped part-way, is harmless: every write is conditional on what it
// ends still being pending. It logs one info line when it ended any.
func (s *Store) EndPending(ctx context.Context, p pulsetype.EndPendingParams) error {
	_, err := s.endPending(ctx, p, 0)
	return err
}

// endPending is EndPending stopping after maxPages pages (0: none left), the rest left pending. It returns
// how many deliveries it ended.
func (s *Store) endPending(ctx context.Context, p pulsetype.EndPendingParams, maxPages int) (int64, error) {
	scope := bson.M{"consumerGroup": p.ConsumerGroup}
	if p.Topics != nil {
		scope["topic"] = bson.M{"$in": p.Topics}
	}
	// In the order of pulse_queue_line, which puts a delivery's queue documents next to each other (one
	// delivery is one event of one line), so a page never splits a delivery: its POST in flight is seen
	// with its other queue document.
	cur, err := s.find(ctx, s.queue, scope, options.Find().SetProjection(bson.M{"deliveryId": 1, "topic": 1}).SetSort(queueLineOrder).
		SetBatchSize(int32(s.pageSize())))
	if err != nil {
		return 0, wrap("find queued attempts of a group", err)
	}
	defer cur.Close(context.WithoutCancel(ctx))
	var total endedPage
	pages := 0
	page := make([]queueDoc, 0, s.pageSize())
	flush := func() error {
		pages++
		got, err := s.endPendingPage(ctx, page, &p.Error)
		total.ended += got.ended
		total.busy += got.busy
		page = page[:0]
		return err
	}
	for cur.Next(ctx) {
		var q queueDoc
		if err := cur.Decode(&q); err != nil {
			return total.ended, wrap("find queued attempts of a group", err)
		}
		if p.Keep != nil && p.Keep(q.Topic) {
			continue // a topic the group still subscribes to (through a pattern)
		}
		if len(page) >= s.pageSize() && page[len(page)-1].DeliveryID != q.DeliveryID {
			if err := flush(); err != nil {
				return total.ended, err
			}
			if maxPages > 0 && pages == maxPages {
				break
			}
		}
		page = append(page, q)
	}
	if err := cur.Err(); err != nil {
		return total.ended, wrap("find queued attempts of a group", err)
	}
	if len(page) > 0 {
		if err := flush(); err != nil {
			return total.ended, err
		}
	}
	if total.ended > 0 || total.busy > 0 {
		s.log.Info().Str("consumer_group", p.ConsumerGroup).Strs("topics", p.Topics).Str("error_code", string(p.Error.Code)).
			Int64("ended", total.ended).Int("in_flight", total.busy).Msg("pending deliveries ended")
	}
	return total.ended, nil
}

// queueLineOrder is the key order of index pulse_queue_line: a consumer group's queue documents by line,
// event and attempt (the latest first).
var queueLineOrder = bson.D{{Key: "consumerGroup", Value: 1}, {Key: "topic", Value: 1}, {Key: "orderingKey", Value: 1},
	{Key: "eventCreatedAt", Value: 1}, {Key: "eventId", Value: 1}, {Key: "attempt", Value: -1}}

// endedPage counts what endPendingPage did: deliveries ended, and attempts left to their POST in flight.
type endedPage struct {
	ended int64
	busy  int
}

// endPendingPage is one page of EndPending: the queue documents queued (Options.PageSize of them, a few
// more to finish the last delivery's), every queue document of each of their deliveries among them, ended
// with info in four commands naming at most len(queued) ids each.
func (s *Store) endPendingPage(ctx context.Context, queued []queueDoc, info *pulsetype.ErrorInfo) (endedPage, error) {
	var out endedPage
	now := s.now()
	exp := expiry(now, s.opts.HistoryRetention)
	ids := idsOf(queued, func(q queueDoc) string { return q.ID })
	attemptSet := bson.M{"status": pulsetype.StatusError, "endedAt": now, "terminal": true, "error": info}
	if exp != nil {
		attemptSet["expiresAt"] = exp
	}
	if _, err := s.updateMany(ctx, s.history, unleased(bson.M{"$in": ids}),
		bson.M{"$set": attemptSet}); err != nil {
		return out, wrap("end pending attempts", err)
	}
	attempts, err := findAll[attemptDoc](ctx, s, s.history, "find leased attempts", bson.M{"_id": bson.M{"$in": ids}},
		options.Find().SetProjection(bson.M{"deliveryId": 1, "status": 1}))
	if err != nil {
		return out, err
	}
	busy := map[string]bool{}
	var unqueue []string
	for _, a := range attempts {
		if a.Status == pulsetype.StatusPending {
			busy[a.DeliveryID] = true
		} else {
			unqueue = append(unqueue, a.ID)
		}
	}
	out.busy = len(busy)
	seen := map[string]bool{}
	var ending []string
	for _, q := range queued {
		if !busy[q.DeliveryID] && !seen[q.DeliveryID] {
			seen[q.DeliveryID] = true
			ending = append(ending, q.DeliveryID)
		}
	}
	set := bson.M{"status": pulsetype.StatusError, "endedAt": now, "updatedAt": now, "error": info}
	if exp != nil {
		set["expiresAt"] = exp
	}
	if len(ending) > 0 {
		res, err := s.updateMany(ctx, s.deliveries, bson.M{"_id": bson.M{"$in": ending}, "status": pulsetype.StatusPending}, bson.M{"$set": set})
		if err != nil {
			return out, wrap("end pending deliveries", err)
		}
		out.ended = res.ModifiedCount
	}
	// Only ended attempts leave the queue: one being created meanwhile (a retry) stays, so the dispatcher
	// claims it and ends it without a POST.
	if len(unqueue) > 0 {
		if _, err := s.deleteMany(ctx, s.queue, bson.M{"_id": bson.M{"$in": unqueue}}); err != nil {
			return out, wrap("remove ended attempts from the queue", err)
		}
	}
	return out, nil
}

// subscriptionsFor returns the subscriptions that list one of topics or its pattern (pulsetype.TopicPatternOf:
// "payment.*" for "payment.captured"), with the fields pulsetype.Endpoint.WantsInput reads.
func (s *Store) subscriptionsFor(ctx context.Context, topics []string) ([]subscriptionDoc, error) {
	entries := slices.Clone(topics)
	for _, t := range topics {
		if p := pulsetype.TopicPatternOf(t); p != "" && !slices.Contains(entries, p) {
			entries = append(entries, p)
		}
	}
	return findAll[subscriptionDoc](ctx, s, s.subscriptions, "find subscriptions", bson.M{"topics": bson.M{"$in": entries}},
		options.Find().SetProjection(bson.M{"_id": 1, "topics": 1, "filter": 1, "offsetReset": 1, "createdAt": 1, "incarnation": 1}))
}

// withTopics adds to filter (which has neither a topic nor an $or) the condition that its documents' field
// topic one of the subscription entries matches (pulsetype.TopicMatches): topic $in the exact topics, or an
// $or of that and one regex per pattern "p.*" (p, a dot, one segment without a dot). It returns filter.
func withTopics(filter bson.M, entries []string) bson.M {
	var exact []string
	var or bson.A
	for _, t := range entries {
		if p, ok := strings.CutSuffix(t, ".*"); ok {
			or = append(or, bson.M{"topic": bson.M{"$regex": "^" + regexp.QuoteMeta(p) + `\.[^.]+$`}})
		} else {
			exact = append(exact, t)
		}
	}
	switch {
	case len(or) == 0:
		filter["topic"] = bson.M{"$in": exact}
	case len(exact) > 0:
		filter["$or"] = append(or, bson.M{"topic": bson.M{"$in": exact}})
	default:
		filter["$or"] = or
	}
	return filter
}

// missing returns the topics of old that new lacks.
func missing(old, new []string) []string {
	var out []string
	for _, t := range old {
		if !slices.Contains(new, t) {
			out = append(out, t)
		}
	}
	return out
}

func addsTopics(old, new []string) bool {
	for _, t := range new {
		if !slices.Contains(old, t) {
			return true
		}
	}
	return false
}
