package mongo

import (
	"context"
	"maps"
	"slices"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// The check of earlier events of ordered lines: an event of a line before its head that the group will
// receive may still lack its delivery (docs/delivery.md, "Ordered lines").

// maxOrderCheck bounds how many unfinished fan-outs of one line the check examines in one query: the query
// of several lines reads up to that many for each of them.
const maxOrderCheck = 100

// outboxByLine is the order of the outbox's documents by line (index pulse_outbox_line).
var outboxByLine = bson.D{{Key: "topic", Value: 1}, {Key: "orderingKey", Value: 1}, {Key: "createdAt", Value: 1}}

// unfinishedBefore returns the unfinished fan-outs (outbox documents) of the lines of topic that heads (queue
// documents, one per line) head, up to their events' createdAt, and for each line's ordering key the
// createdAt of a head up to which they are all read. An outbox document carries the createdAt its publisher
// estimated before the commit stamped the event's, which may be later by that estimate's error: the reads
// go OrderSettle past the heads, the margin that bounds that error. It costs one query of the lines'
// fan-outs up to the latest head (index pulse_outbox_line: the topic, the keys by $in, then a range of
// createdAt), at most maxOrderCheck for each head, by line; when that reaches its bound, the lines from the last
// one it read on are read alone, each with one more query of at most maxOrderCheck fan-outs up to its head.
func (s *Store) unfinishedBefore(ctx context.Context, topic string, heads []*queueDoc) ([]outboxDoc, map[string]time.Time, error) {
	covered := map[string]time.Time{}
	if len(heads) == 0 {
		return nil, covered, nil
	}
	keys := make([]any, 0, len(heads))
	latest := heads[0].EventCreatedAt
	for _, q := range heads {
		keys = append(keys, keyFilter(q.OrderingKey))
		if q.EventCreatedAt.After(latest) {
			latest = q.EventCreatedAt
		}
	}
	marks, err := findAll[outboxDoc](ctx, s, s.outbox, "find earlier unfinished fan-outs",
		bson.M{"topic": topic, "orderingKey": bson.M{"$in": keys}, "createdAt": bson.M{"$lte": latest.Add(OrderSettle)}},
		options.Find().SetSort(outboxByLine).SetLimit(int64(maxOrderCheck*len(heads))))
	if err != nil {
		return nil, nil, err
	}
	full := len(marks) == maxOrderCheck*len(heads)
	last := ""
	if full { // the lines from the last one read on may have more
		last = marks[len(marks)-1].OrderingKey
		marks = slices.DeleteFunc(marks, func(m outboxDoc) bool { return m.OrderingKey >= last })
	}
	for _, q := range heads {
		if !full || q.OrderingKey < last {
			covered[q.OrderingKey] = latest
			continue
		}
		more, err := findAll[outboxDoc](ctx, s, s.outbox, "find earlier unfinished fan-outs of a line",
			bson.M{"topic": topic, "orderingKey": keyFilter(q.OrderingKey), "createdAt": bson.M{"$lte": q.EventCreatedAt.Add(OrderSettle)}},
			options.Find().SetSort(outboxByLine).SetLimit(maxOrderCheck))
		if err != nil {
			return nil, nil, err
		}
		marks = append(marks, more...)
		covered[q.OrderingKey] = q.EventCreatedAt
	}
	return marks, covered, nil
}

// earlierMayAppear returns the heads (by the id of their queue documents; pending deliveries of the lines of
// one topic) before whose events (createdAt, then id) an event of the same line that the group of sub will
// receive may still lack its delivery (blocked): the group's backfill is unfinished, or an event of marks
// (the lines' unfinished fan-outs, see unfinishedBefore) before the head has no delivery for the group,
// is committed and the group receives it; and the heads before which such an event's delivery is pending
// (earlier: its fan-out finished during the look, after the lines were read). It runs beside queuedBefore,
// which may read the lines before such a fan-out writes its queue documents, so it holds the line on what
// it finds itself: an earlier event's delivery found pending, or missing while the event is committed and
// wanted, whether or not its fanout mark is still set (a fan-out that finished after the read of the
// deliveries clears it). It costs, when marks hold other events than the heads' up to OrderSettle past
// them (see unfinishedBefore), one read of the group's deliveries of them by id and, for those that lack
// one, one read of their events, whose committed createdAt decides. An outbox document whose event is not
// committed yet (staged) counts for nothing: its commit stamps a createdAt later than this check.
func (s *Store) earlierMayAppear(ctx context.Context, sub *subscriptionDoc, heads []*lineHeadDoc, marks []outboxDoc) (blocked, earlier map[string]bool, err error) {
	blocked, earlier = map[string]bool{}, map[string]bool{}
	if sub.Backfill != nil {
		for _, h := range heads {
			blocked[h.q.ID] = true
		}
		return blocked, earlier, nil
	}
	headOf := make(map[string]*lineHeadDoc, len(heads)) // by ordering key
	for _, h := range heads {
		headOf[h.q.OrderingKey] = h
	}
	type earlierEvent struct {
		id   string       // the event's
		head *lineHeadDoc // the head of its line
	}
	candidates := map[string]earlierEvent{} // by the group's delivery id of the event
	for _, m := range marks {
		h := headOf[m.OrderingKey]
		if h != nil && m.ID != h.q.EventID && !m.CreatedAt.After(h.q.EventCreatedAt.Add(OrderSettle)) {
			candidates[DeliveryID(sub.ID, m.ID)] = earlierEvent{id: m.ID, head: h}
		}
	}
	if len(candidates) == 0 {
		return blocked, earlier, nil
	}
	found, err := findAll[deliveryDoc](ctx, s, s.deliveries, "find deliveries of earlier events",
		bson.M{"_id": bson.M{"$in": slices.Collect(maps.Keys(candidates))}}, options.Find().SetProjection(bson.M{"status": 1, "eventCreatedAt": 1}))
	if err != nil {
		return nil, nil, err
	}
	for _, d := range found {
		c := candidates[d.ID]
		delete(candidates, d.ID)
		before := d.EventCreatedAt.Before(c.head.q.EventCreatedAt) || d.EventCreatedAt.Equal(c.head.q.EventCreatedAt) && c.id < c.head.q.EventID
		if before && d.Status == pulsetype.StatusPending {
			earlier[c.head.q.ID] = true
		}
	}
	if len(candidates) == 0 {
		return blocked, earlier, nil
	}
	missing := make(map[string]*lineHeadDoc, len(candidates)) // by event id
	for _, c := range candidates {
		missing[c.id] = c.head
	}
	events, err := s.findEvents(ctx, slices.Collect(maps.Keys(missing)))
	if err != nil {
		return nil, nil, err
	}
	for id, e := range events {
		h := missing[id]
		before := e.CreatedAt.Before(h.q.EventCreatedAt) || e.CreatedAt.Equal(h.q.EventCreatedAt) && e.ID < h.q.EventID
		if before && !e.Staged && sub.wants(pulsetype.InputOf(e.event()), &s.filters) { // the whole event: a filter reads its data
			blocked[h.q.ID] = true
		}
	}
	return blocked, earlier, nil
}
