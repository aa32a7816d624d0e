package mongo

import (
	"context"
	"slices"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// Stats returns the figures of each consumer group of groups, in that order, at the store's clock (GET
// /v1/stats). A group without deliveries reads zeros; it need not be registered. The window of the attempt
// figures is pulsetype.StatsWindow, shortened to the history retention when that is shorter (an attempt that
// ended before now - retention has expired and is not counted).
//
// On MongoDB each group costs five queries bounded by an index on the group and a status (groupStats). A
// server that evaluates filters by scanning its collections (Capabilities.ScansFilters: FerretDB) would scan
// them five times per group; there all groups cost two scans together (statsByScan): one of the pending
// deliveries, one of the attempts ended in the window.
func (s *Store) Stats(ctx context.Context, groups []string) ([]*pulsetype.GroupStats, error) {
	now, since := s.statsWindow()
	if s.caps.ScansFilters {
		return s.statsByScan(ctx, groups, now, since)
	}
	out := make([]*pulsetype.GroupStats, 0, len(groups))
	for _, g := range groups {
		st, err := s.groupStats(ctx, g, now, since)
		if err != nil {
			return nil, err
		}
		out = append(out, st)
	}
	return out, nil
}

// statsWindow returns the store's now and the start of the stats window (excluded).
func (s *Store) statsWindow() (now, since time.Time) {
	now = s.now()
	window := pulsetype.StatsWindow
	if r := s.opts.HistoryRetention; r > 0 && r < window {
		window = r
	}
	return now, now.Add(-window)
}

// endedCodes are the error codes for which pulsetype.ErrorCode.Ended is true: attempts ended for a reason that is not
// the receiver's (most without a POST), which count neither as failures nor for latency.
var endedCodes = bson.A{pulsetype.CodeEventExpired, pulsetype.CodeEndpointDeleted, pulsetype.CodeUnsubscribed, pulsetype.CodeCancelled}

// groupStats computes one group's figures with five indexed queries:
//   - pending count and oldest pending delivery: pulse_deliveries_group_status_created (a count of index
//     keys, and one key);
//   - attempts ended after since by status, and the durations of the latest pulsetype.LatencySampleSize of
//     those answered with an HTTP status: pulse_history_group_status_ended.
func (s *Store) groupStats(ctx context.Context, group string, now, since time.Time) (*pulsetype.GroupStats, error) {
	out := &pulsetype.GroupStats{ConsumerGroup: group}
	n, oldest, err := s.pendingOf(ctx, group)
	if err != nil {
		return nil, err
	}
	out.Pending = n
	if oldest != nil {
		setOldest(out, *oldest, now)
	}

	ended := func(status pulsetype.Status) bson.M {
		return bson.M{"consumerGroup": group, "status": status, "endedAt": bson.M{"$gt": since}}
	}
	if out.Succeeded1h, err = s.history.CountDocuments(ctx, ended(pulsetype.StatusSuccess),
		options.Count().SetHint("pulse_history_group_status_ended")); err != nil {
		return nil, wrap("count succeeded attempts", err)
	}
	failed := ended(pulsetype.StatusError)
	failed["error.code"] = bson.M{"$nin": endedCodes}
	if out.Failed1h, err = s.history.CountDocuments(ctx, failed, options.Count().SetHint("pulse_history_group_status_ended")); err != nil {
		return nil, wrap("count failed attempts", err)
	}
	// The sample is of answered POSTs (an HTTP status): a refused connection or a reaped attempt (worker_lost,
	// no durationMs) says nothing of the receiver's latency.
	sample, err := findAll[endedAttempt](ctx, s, s.history, "find attempt durations",
		bson.M{"consumerGroup": group, "status": bson.M{"$in": bson.A{pulsetype.StatusSuccess, pulsetype.StatusError}},
			"endedAt": bson.M{"$gt": since}, "error.code": bson.M{"$nin": endedCodes}, "httpStatus": bson.M{"$gt": 0}, "durationMs": bson.M{"$exists": true}},
		options.Find().SetSort(bson.D{{Key: "endedAt", Value: -1}}).SetLimit(pulsetype.LatencySampleSize).
			SetProjection(bson.M{"durationMs": 1, "endedAt": 1}).SetHint("pulse_history_group_status_ended"))
	if err != nil {
		return nil, err
	}
	setLatency(out, sample)
	return out, nil
}

// endedAttempt is the part of an attempt document the figures read.
type endedAttempt struct {
	ConsumerGroup string               `bson:"consumerGroup"`
	Status        pulsetype.Status     `bson:"status"`
	Error         *pulsetype.ErrorInfo `bson:"error"`
	DurationMs    *int64               `bson:"durationMs"`
	HTTPStatus    int                  `bson:"httpStatus"`
	EndedAt       time.Time            `bson:"endedAt"`
}

// statsByScan computes every group's figures with two queries whatever the number of groups: the pending
// deliveries (consumer group and createdAt only) and the attempts ended after since, counted and sampled here.
func (s *Store) statsByScan(ctx context.Context, groups []string, now, since time.Time) ([]*pulsetype.GroupStats, error) {
	out := make([]*pulsetype.GroupStats, len(groups))
	by := make(map[string]*pulsetype.GroupStats, len(groups))
	for i, g := range groups {
		out[i] = &pulsetype.GroupStats{ConsumerGroup: g}
		by[g] = out[i]
	}
	pending, err := findAll[deliveryDoc](ctx, s, s.deliveries, "scan pending deliveries", bson.M{"status": pulsetype.StatusPending},
		options.Find().SetProjection(bson.M{"consumerGroup": 1, "createdAt": 1}))
	if err != nil {
		return nil, err
	}
	for _, d := range pending {
		if st := by[d.ConsumerGroup]; st != nil {
			st.Pending++
			if st.OldestPendingAt == nil || d.CreatedAt.Before(*st.OldestPendingAt) {
				setOldest(st, d.CreatedAt, now)
			}
		}
	}
	ended, err := findAll[endedAttempt](ctx, s, s.history, "scan ended attempts", bson.M{"endedAt": bson.M{"$gt": since}},
		options.Find().SetProjection(bson.M{"consumerGroup": 1, "status": 1, "error": 1, "durationMs": 1, "httpStatus": 1, "endedAt": 1}))
	if err != nil {
		return nil, err
	}
	samples := make(map[string][]endedAttempt, len(groups))
	for _, a := range ended {
		st := by[a.ConsumerGroup]
		if st == nil || (a.Error != nil && a.Error.Code.Ended()) {
			continue
		}
		switch a.Status {
		case pulsetype.StatusSuccess:
			st.Succeeded1h++
		case pulsetype.StatusError:
			st.Failed1h++
		default:
			continue
		}
		if a.DurationMs != nil && a.HTTPStatus > 0 {
			samples[a.ConsumerGroup] = append(samples[a.ConsumerGroup], a)
		}
	}
	for g, sample := range samples {
		slices.SortFunc(sample, func(a, b endedAttempt) int { return b.EndedAt.Compare(a.EndedAt) })
		setLatency(by[g], sample[:min(len(sample), pulsetype.LatencySampleSize)])
	}
	return out, nil
}

func setOldest(st *pulsetype.GroupStats, at, now time.Time) {
	at = at.UTC()
	st.OldestPendingAt = &at
	st.OldestPendingAgeMs = max(0, now.Sub(at).Milliseconds())
}

// setLatency sets the median duration of sample (nil when it is empty) and its size.
func setLatency(st *pulsetype.GroupStats, sample []endedAttempt) {
	ms := make([]int64, 0, len(sample))
	for _, a := range sample {
		if a.DurationMs != nil {
			ms = append(ms, *a.DurationMs)
		}
	}
	if len(ms) == 0 {
		return
	}
	p50 := median(ms)
	st.LatencyP50Ms, st.LatencySample = &p50, len(ms)
}

// median returns the nearest-rank median of a non-empty list (the lower middle of an even count); it sorts
// the list.
func median(v []int64) int64 {
	slices.Sort(v)
	return v[(len(v)-1)/2]
}
