package httpapi

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// activity answers GET /v1/endpoints/{consumerGroup}/activity: the group's last hour minute by minute
// (pulsetype.GroupActivity), {"consumerGroup", "bucketMs": 60000, "from", "to", "buckets": [{"start",
// "succeeded", "failed"}, ...60, oldest first], "pending", "oldestPendingAt"?, "truncatedBefore"?}; 404
// endpoint_not_found when the group has no endpoint. The console draws its chart from it. See
// mongo.Store.Activity for what it costs.
func (s *Server) activity(w http.ResponseWriter, r *http.Request) {
	g := pathParam(r, "consumerGroup")
	if !s.groupRegistered(w, r, g) {
		return
	}
	a, err := s.store.Activity(r.Context(), g)
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, groupActivityOf(a))
}

// activityAll answers GET /v1/activity: every registered consumer group's last hour, {"groups": [<the
// answer of GET /v1/endpoints/{consumerGroup}/activity>, ...]} in consumer group order, with one bounded
// read of the hour for all groups (mongo.Store.ActivityAll). The console draws its charts from it, one
// call for the page however many groups.
func (s *Server) activityAll(w http.ResponseWriter, r *http.Request) {
	all, err := s.store.ActivityAll(r.Context())
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	groups := make([]groupActivity, len(all))
	for i, a := range all {
		groups[i] = groupActivityOf(a)
	}
	writeJSON(w, http.StatusOK, map[string]any{"groups": groups})
}

// groupActivityOf is a's answer.
func groupActivityOf(a *pulsetype.GroupActivity) groupActivity {
	body := groupActivity{ConsumerGroup: a.ConsumerGroup, BucketMs: pulsetype.ActivityBucket.Milliseconds(), From: Timestamp(a.From),
		To: Timestamp(a.To), Buckets: make([]activityBucket, len(a.Buckets)), Pending: a.Pending,
		OldestPendingAt: timestampPtr(a.OldestPendingAt), TruncatedBefore: timestampPtr(a.TruncatedBefore)}
	for i, b := range a.Buckets {
		body.Buckets[i] = activityBucket{Start: Timestamp(a.From.Add(time.Duration(i) * pulsetype.ActivityBucket)), Succeeded: b.Succeeded, Failed: b.Failed}
	}
	return body
}

// groupActivity is the answer of GET /v1/endpoints/{consumerGroup}/activity.
type groupActivity struct {
	ConsumerGroup   string           `json:"consumerGroup"`
	BucketMs        int64            `json:"bucketMs"`
	From            Timestamp        `json:"from"`
	To              Timestamp        `json:"to"`
	Buckets         []activityBucket `json:"buckets"`
	Pending         int64            `json:"pending"`
	OldestPendingAt *Timestamp       `json:"oldestPendingAt,omitempty"`
	TruncatedBefore *Timestamp       `json:"truncatedBefore,omitempty"`
}

// activityBucket is one minute of groupActivity: the attempts that ended in [start, start + bucketMs).
type activityBucket struct {
	Start     Timestamp `json:"start"`
	Succeeded int64     `json:"succeeded"`
	Failed    int64     `json:"failed"`
}

// pendingReason says why the pending delivery d waits (pulsetype.PendingReasonOf), from its latest attempt,
// its group's endpoint and, for an ordered endpoint, the head of its line (mongo.Store.LineHead). It returns
// nil when the endpoint cannot be read for its encrypted values (the reason would guess), and the store's
// other errors.
func (s *Server) pendingReason(ctx context.Context, d *pulsetype.Delivery, attempts []*pulsetype.Attempt) (*pendingReason, error) {
	ep, err := s.store.GetEndpoint(ctx, d.ConsumerGroup)
	switch {
	case errors.Is(err, pulsetype.ErrNotFound):
		ep = nil
	case errors.Is(err, pulsetype.ErrUndecryptable):
		return nil, nil
	case err != nil:
		return nil, err
	}
	in := pulsetype.PendingInput{DeliveryID: d.ID, Endpoint: ep, Now: time.Now()}
	if len(attempts) > 0 {
		in.Attempt = attempts[len(attempts)-1]
	}
	if ep != nil && ep.Ordered {
		if in.LineHead, err = s.store.LineHead(ctx, pulsetype.Line{ConsumerGroup: d.ConsumerGroup, Topic: d.Topic, OrderingKey: d.OrderingKey}); err != nil {
			return nil, err
		}
	}
	pr := pulsetype.PendingReasonOf(in)
	return &pendingReason{Code: pr.Code, Message: pr.Message, At: timestampPtr(pr.At), Head: pr.Head}, nil
}
