package mongo

import (
	"context"
	"slices"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// The reads of ordered lines: the first queue document of each line of a (consumer group, topic), a line
// looked at alone, and the read again of the lines before their heads.

// headsOfLines returns the first queue document of each line of group's topic (the latest attempt of the
// line's oldest event, in lineOrder), of the lines whose ordering key sorts after *after (nil: from the line
// without a key; "": the lines with a key), by ordering key, at most MaxLineKeys of them, and the key the
// next read continues after when it stopped at its bound (nil when it read every line; "" when it stopped
// within the line without a key, which sorts first: a null orderingKey sorts before every string, and
// {$gt: ""} matches the strings only, so the next read takes up the keyed lines). With Capabilities.FirstOfGroups it is one
// aggregation that sorts the group's queue documents of the topic in the order of index pulse_queue_line
// and keeps the first of each key ($group with $first), which MongoDB serves from that index by reading one
// entry per key (a DISTINCT_SCAN; manual: "$group Performance Optimizations", the first document of each
// group), so its cost follows the number of lines, not of queued documents. Without it, see
// headsOfLinesByScan.
func (s *Store) headsOfLines(ctx context.Context, group, topic string, after *string) (firsts []queueDoc, next *string, err error) {
	match := bson.M{"consumerGroup": group, "topic": topic}
	if after != nil {
		match["orderingKey"] = bson.M{"$gt": *after}
	}
	if !s.caps.FirstOfGroups {
		return s.headsOfLinesByScan(ctx, match)
	}
	cur, err := s.aggregate(ctx, s.queue, headsPipeline(match), "")
	if err != nil {
		return nil, nil, wrap("find heads of lines", err)
	}
	var rows []struct {
		Head queueDoc `bson:"head"`
	}
	if err := cur.All(ctx, &rows); err != nil {
		return nil, nil, wrap("find heads of lines", err)
	}
	firsts = make([]queueDoc, len(rows))
	for i := range rows {
		firsts[i] = rows[i].Head
	}
	if len(firsts) == MaxLineKeys {
		next = new(firsts[len(firsts)-1].OrderingKey)
	}
	return firsts, next, nil
}

// headsPipeline is headsOfLines' aggregation of the queue documents match selects.
func headsPipeline(match bson.M) bson.A {
	return bson.A{
		bson.M{"$match": match},
		bson.M{"$sort": lineOrder},
		bson.M{"$group": bson.M{"_id": "$orderingKey", "head": bson.M{"$first": "$$ROOT"}}},
		bson.M{"$sort": bson.M{"_id": 1}},
		bson.M{"$limit": MaxLineKeys},
	}
}

// lineScanBound bounds the queue documents one headsOfLinesByScan reads.
const lineScanBound = 4 * MaxLineKeys

// headsOfLinesByScan is headsOfLines on a server whose $group lacks $first (FerretDB v1, which also scans
// its collections for such a filter, Capabilities.ScansFilters, so that one read beats a query per line): one
// query of the queue documents match selects, in lineOrder, at most lineScanBound of them, keeping the
// first of each ordering key. A line cut off by the bound had its first document read, so the lines it
// returns are whole as far as their heads go; the next read continues after the last of them, also when
// that is the line without a key holding lineScanBound documents or more (next "": the keyed lines).
func (s *Store) headsOfLinesByScan(ctx context.Context, match bson.M) (firsts []queueDoc, next *string, err error) {
	queued, err := findAll[queueDoc](ctx, s, s.queue, "find heads of lines", match, options.Find().SetSort(lineOrder).SetLimit(lineScanBound))
	if err != nil {
		return nil, nil, err
	}
	for i, q := range queued {
		if i > 0 && q.OrderingKey == queued[i-1].OrderingKey {
			continue
		}
		if len(firsts) == MaxLineKeys {
			return firsts, new(firsts[len(firsts)-1].OrderingKey), nil
		}
		firsts = append(firsts, q)
	}
	if len(queued) == lineScanBound {
		next = new(firsts[len(firsts)-1].OrderingKey)
	}
	return firsts, next, nil
}

// queuedBefore returns the heads (by the id of their queue documents) whose lines' queue now holds a document
// before them (by the event's createdAt, then id) other than those of ended deliveries that lineHead passed
// over: one query of the lines' documents before the heads, two branches of an $or per head, each served by
// index pulse_queue_line (the line's equalities, then a range of eventCreatedAt, or its equality and a
// range of eventId). The documents it reads are those before the heads: normally none, or the passed ones.
func (s *Store) queuedBefore(ctx context.Context, heads []*lineHeadDoc) (map[string]bool, error) {
	branches := make(bson.A, 0, 2*len(heads))
	for _, h := range heads {
		before := lineFilter(pulsetype.Line{ConsumerGroup: h.q.ConsumerGroup, Topic: h.q.Topic, OrderingKey: h.q.OrderingKey})
		before["eventCreatedAt"] = bson.M{"$lt": h.q.EventCreatedAt}
		tied := lineFilter(pulsetype.Line{ConsumerGroup: h.q.ConsumerGroup, Topic: h.q.Topic, OrderingKey: h.q.OrderingKey})
		tied["eventCreatedAt"], tied["eventId"] = h.q.EventCreatedAt, bson.M{"$lt": h.q.EventID}
		branches = append(branches, before, tied)
	}
	queued, err := findAll[queueDoc](ctx, s, s.queue, "read the heads of lines again", bson.M{"$or": branches},
		options.Find().SetProjection(bson.M{"orderingKey": 1}))
	if err != nil {
		return nil, err
	}
	moved := map[string]bool{}
	for _, h := range heads {
		for _, q := range queued {
			if q.OrderingKey == h.q.OrderingKey && !slices.Contains(h.passed, q.ID) {
				moved[h.q.ID] = true
			}
		}
	}
	return moved, nil
}

// lineFilter selects the queue documents of line.
func lineFilter(line pulsetype.Line) bson.M {
	return bson.M{"consumerGroup": line.ConsumerGroup, "topic": line.Topic, "orderingKey": keyFilter(line.OrderingKey)}
}

// lineOrder is the order of a line's queue documents (index pulse_queue_line): by the event's createdAt, then
// its id, the latest attempt of each first.
var lineOrder = bson.D{{Key: "consumerGroup", Value: 1}, {Key: "topic", Value: 1}, {Key: "orderingKey", Value: 1},
	{Key: "eventCreatedAt", Value: 1}, {Key: "eventId", Value: 1}, {Key: "attempt", Value: -1}}

// lineScan bounds the queue documents one look at a line's head reads: deliveries that ended while their
// queue documents wait to be removed come before the pending head.
const lineScan = 8

// lineHead returns the line's oldest pending delivery, the queue document of its latest attempt and the ids
// of the queue documents before it (of ended deliveries), or nil when the line has none among its first
// lineScan queue documents. It removes the queue documents it finds of ended deliveries whose attempts have
// ended (normally removed by the writer that ended them).
func (s *Store) lineHead(ctx context.Context, line pulsetype.Line) (*deliveryDoc, *queueDoc, []string, error) {
	head, q, ended, err := s.readLineHead(ctx, line)
	if err != nil {
		return nil, nil, nil, err
	}
	return head, q, ended, s.unqueueEnded(ctx, ended)
}

// LineHead returns the id of the line's oldest pending delivery, the one its ordered consumer group POSTs
// next (docs/delivery.md, "Ordered lines"), or "" when the line's first lineScan queue documents hold none.
// It only reads: one query of pulse_queue_line and one read of those documents' deliveries by id. The
// inspection API tells with it a delivery behind the head of its line.
func (s *Store) LineHead(ctx context.Context, line pulsetype.Line) (string, error) {
	head, _, _, err := s.readLineHead(ctx, line)
	if head == nil || err != nil {
		return "", err
	}
	return head.ID, nil
}

// readLineHead is lineHead without its removals.
func (s *Store) readLineHead(ctx context.Context, line pulsetype.Line) (*deliveryDoc, *queueDoc, []string, error) {
	queued, err := findAll[queueDoc](ctx, s, s.queue, "find head of line", lineFilter(line),
		options.Find().SetSort(lineOrder).SetLimit(lineScan))
	if err != nil || len(queued) == 0 {
		return nil, nil, nil, err
	}
	ids := make([]string, 0, len(queued))
	for _, q := range queued {
		if !slices.Contains(ids, q.DeliveryID) {
			ids = append(ids, q.DeliveryID)
		}
	}
	deliveries, err := findAll[deliveryDoc](ctx, s, s.deliveries, "read deliveries of a line", bson.M{"_id": bson.M{"$in": ids}})
	if err != nil {
		return nil, nil, nil, err
	}
	byID := map[string]*deliveryDoc{}
	for i := range deliveries {
		byID[deliveries[i].ID] = &deliveries[i]
	}
	var ended []string
	for i := range queued {
		q := &queued[i]
		d, ok := byID[q.DeliveryID]
		switch {
		case !ok:
			return nil, nil, nil, nil // its fan-out is under way (queued before written): wait for it
		case d.Status == pulsetype.StatusPending:
			return d, q, ended, nil // every document before it is of an ended delivery
		default:
			ended = append(ended, q.ID)
		}
	}
	return nil, nil, ended, nil
}

// unqueueEnded removes the queue documents ids (of deliveries that ended) whose attempts are not pending: one
// that is (the attempt of a cancelled delivery still in flight) stays queued for the reaper.
func (s *Store) unqueueEnded(ctx context.Context, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	running, err := findAll[attemptDoc](ctx, s, s.history, "find running attempts of ended deliveries",
		bson.M{"_id": bson.M{"$in": ids}, "status": pulsetype.StatusPending}, options.Find().SetProjection(bson.M{"_id": 1}))
	if err != nil {
		return err
	}
	ids = slices.DeleteFunc(ids, func(id string) bool {
		return slices.ContainsFunc(running, func(a attemptDoc) bool { return a.ID == id })
	})
	if len(ids) == 0 {
		return nil
	}
	if _, err := s.deleteMany(ctx, s.queue, bson.M{"_id": bson.M{"$in": ids}}); err != nil {
		return wrap("remove queue documents of ended deliveries", err)
	}
	return nil
}
