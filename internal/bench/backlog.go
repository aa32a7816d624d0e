package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// progressEvery is how often a long phase prints its progress on stderr.
const progressEvery = 5 * time.Second

// progress prints "bench: <label> n of total (r/s)" to w every progressEvery while the phase runs, n being
// count(); the returned function ends it (and blocks until it has). Phases shorter than progressEvery print
// nothing.
func progress(w io.Writer, label string, total int, count func() int) (stop func()) {
	if w == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(progressEvery)
		defer t.Stop()
		start, last, lastAt := time.Now(), count(), time.Now()
		for {
			select {
			case <-done:
				return
			case now := <-t.C:
				n := count()
				fmt.Fprintf(w, "bench: %s %d of %d (%.1f/s now, %.0f s in)\n", label, n, total,
					float64(n-last)/now.Sub(lastAt).Seconds(), now.Sub(start).Seconds())
				last, lastAt = n, now
			}
		}
	})
	var once sync.Once
	return func() { once.Do(func() { close(done); wg.Wait() }) }
}

// backlog makes the backlog that --pending drains: it pauses groups through api, publishes o.pending events
// with ids pend-<i> (arrays of historyBatch, o.concurrency clients, untimed), and waits until every group
// has o.pending deliveries pending (GET /v1/stats), so that the drain measured starts from a fanned-out
// backlog. The groups stay paused: the measured run resumes them.
func backlog(ctx context.Context, o flags, api string, groups []string, pub *publisher) error {
	for _, g := range groups {
		if err := request(ctx, "POST", fmt.Sprintf("%s/v1/endpoints/%s/pause", api, g), "", http.StatusOK); err != nil {
			return err
		}
	}
	stop := progress(o.progress, "backlog: events published", o.pending, func() int { return int(pub.sent.Load()) })
	err := pub.history(ctx, "pend", o.pending, o.concurrency)
	stop()
	if err != nil {
		return fmt.Errorf("bench: publishing the backlog: %w", err)
	}
	var pending atomic.Int64
	stop = progress(o.progress, "backlog: deliveries fanned out", o.pending*len(groups), func() int { return int(pending.Load()) })
	defer stop()
	for {
		n, err := pendingDeliveries(ctx, api)
		if err != nil {
			return err
		}
		var sum int64
		full := true
		for _, g := range groups {
			sum += n[g]
			full = full && n[g] >= int64(o.pending)
		}
		pending.Store(sum)
		if full {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("bench: waiting for the backlog's fan-out: %w (%d of %d deliveries)", ctx.Err(), sum, o.pending*len(groups))
		case <-time.After(2 * time.Second):
		}
	}
}

// pendingDeliveries returns each group's pending deliveries as GET /v1/stats counts them.
func pendingDeliveries(ctx context.Context, api string) (map[string]int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, api+"/v1/stats", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("bench: GET /v1/stats answered %d", resp.StatusCode)
	}
	var body struct {
		Groups []struct {
			ConsumerGroup string `json:"consumerGroup"`
			Pending       int64  `json:"pending"`
		} `json:"groups"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, fmt.Errorf("bench: GET /v1/stats: %w", err)
	}
	out := make(map[string]int64, len(body.Groups))
	for _, g := range body.Groups {
		out[g.ConsumerGroup] = g.Pending
	}
	return out, nil
}
