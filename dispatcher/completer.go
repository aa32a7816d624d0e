package dispatcher

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/pulse-sidecar/pulse/internal/startstop"
	"github.com/pulse-sidecar/pulse/pulsetype"
)

// writeTimeout bounds each database write of the executor (a release, a disable) and, unless the lease
// timeout is longer, each write that records results.
const writeTimeout = 10 * time.Second

// completionStore is the part of Store the completer writes with.
type completionStore interface {
	FinishAttempts(ctx context.Context, cs []pulsetype.Completion) ([]bool, error)
	FollowUps(ctx context.Context, cs []pulsetype.Completion) error
	RecordHealth(ctx context.Context, failed map[string]time.Duration, succeeded []string) ([]string, error)
}

// completer records the results of attempts group-commit style: every result that arrived while the
// previous batch was being written goes into the next one (at most maxRecordBatch), written with one
// FinishAttempts and one FollowUps. It is safe for concurrent use.
type completer struct {
	store    completionStore
	observer Observer // may be nil
	retryDue func()   // called when a retry the completer scheduled comes due
	// endpoints gives each group's disableAfter and is told of the groups the failing streak disabled.
	endpoints *endpointCache
	log       zerolog.Logger
	// timeout bounds the writes of one batch: at least the lease timeout, for the heartbeat keeps the
	// batch's leases while they wait, and a result given up on a live lease would be POSTed again after
	// the reaper took it. Zero: writeTimeout.
	timeout time.Duration
	// writing, when set, is told when each batch's first write is sent, and then whether it answered
	// (lease.Keeper.Writing: the lag the dispatcher's backpressure reads counts it while it waits).
	writing func() (done func(answered bool))

	more chan struct{} // the queue grew

	mu    sync.Mutex
	queue []*completion
	stop  chan struct{} // nil unless running; closed by Stop
	done  chan struct{} // closed when the goroutine returned
}

// completion is a result waiting for the completer; done is closed once it was written (or given up).
type completion struct {
	c    pulsetype.Completion
	log  zerolog.Logger
	done chan struct{}
}

func newCompleter(store completionStore, observer Observer, retryDue func(), endpoints *endpointCache, log zerolog.Logger) *completer {
	return &completer{store: store, observer: observer, retryDue: retryDue, endpoints: endpoints, log: log, more: make(chan struct{}, 1)}
}

// Start runs the completer in a goroutine and returns at once; it returns startstop.ErrStarted while the
// completer runs. Writes outlive ctx (Stop flushes the queue); each is bounded by writeTimeout.
func (c *completer) Start(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stop != nil {
		return startstop.ErrStarted
	}
	c.stop, c.done = make(chan struct{}), make(chan struct{})
	go c.run(context.WithoutCancel(ctx), c.stop, c.done)
	return nil
}

// Stop refuses new results, records those queued, and blocks until the goroutine returned. It is safe twice
// and before Start.
func (c *completer) Stop() {
	c.mu.Lock()
	stop, done := c.stop, c.done
	c.stop = nil
	c.mu.Unlock()
	if stop != nil {
		close(stop)
	}
	if done != nil {
		<-done
	}
}

// complete queues one result and blocks until it was written or given up (the lease is held until then).
// It reports false, having written nothing, when the completer is not running.
func (c *completer) complete(cp pulsetype.Completion, log zerolog.Logger) bool {
	w := &completion{c: cp, log: log, done: make(chan struct{})}
	c.mu.Lock()
	if c.stop == nil {
		c.mu.Unlock()
		return false
	}
	c.queue = append(c.queue, w)
	c.mu.Unlock()
	signal(c.more)
	<-w.done
	return true
}

// run records batches until stop is closed and the queue is empty; base is the parent of every write.
func (c *completer) run(base context.Context, stop, done chan struct{}) {
	defer close(done)
	for {
		if batch := c.next(); len(batch) > 0 {
			c.record(base, batch)
			continue
		}
		select {
		case <-c.more:
		case <-stop:
			for batch := c.next(); len(batch) > 0; batch = c.next() {
				c.record(base, batch)
			}
			return
		}
	}
}

// next removes up to maxRecordBatch results from the queue.
func (c *completer) next() []*completion {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := min(len(c.queue), maxRecordBatch)
	batch := c.queue[:n:n]
	c.queue = c.queue[n:]
	return batch
}

// record writes a batch of results fenced by each attempt's id and fencing token, then moves the deliveries
// on (each completion's Next), and releases the waiting executors.
func (c *completer) record(base context.Context, batch []*completion) {
	defer func() {
		for _, w := range batch {
			close(w.done)
		}
	}()
	ctx, cancel := context.WithTimeout(base, max(c.timeout, writeTimeout))
	defer cancel()
	cs := make([]pulsetype.Completion, len(batch))
	for i, w := range batch {
		cs[i] = w.c
	}
	done := func(bool) {}
	if c.writing != nil {
		done = c.writing()
	}
	recorded, err := c.store.FinishAttempts(ctx, cs)
	done(err == nil)
	if err != nil {
		for _, w := range batch {
			w.log.Error().Err(err).Msg("recording the attempt failed: left to lease expiry")
		}
		return
	}
	var ok []pulsetype.Completion
	var okLogs []zerolog.Logger
	for i, w := range batch {
		if !recorded[i] {
			if c.observer != nil {
				c.observer.LeaseLost(w.c.Attempt.ConsumerGroup)
			}
			w.log.Error().Err(pulsetype.ErrLeaseLost).Msg("lease lost: another worker owns this attempt, its result is not recorded")
			continue
		}
		ok = append(ok, w.c)
		okLogs = append(okLogs, w.log)
	}
	if len(ok) == 0 {
		return
	}
	if err := c.store.FollowUps(ctx, ok); err != nil {
		for _, log := range okLogs {
			log.Error().Err(err).Msg("moving the delivery on failed: the reconciler will repair it")
		}
		return
	}
	for i, done := range ok {
		outcome := "success"
		switch res := done.Result; {
		case res.Status == pulsetype.StatusSuccess:
		case done.Next.Retry:
			outcome = "retry"
			time.AfterFunc(done.Next.Delay, c.retryDue)
		case res.Error.Code == pulsetype.CodeEndpointDeleted || res.Error.Code == pulsetype.CodeUnsubscribed:
			outcome = "error" // the subscription ended: a normal outcome, not a failure of the receiver
			okLogs[i].Info().Str("error_code", string(res.Error.Code)).Str("error", res.Error.Message).Msg("delivery ended: no longer subscribed")
		default:
			outcome = "error"
			okLogs[i].Error().Str("error_code", string(res.Error.Code)).Str("error", res.Error.Message).Int("http_status", res.HTTPStatus).
				Msg("delivery failed terminally")
			if fo, ok := c.observer.(FailureObserver); ok && done.Next.EndStatus == pulsetype.StatusError {
				fo.DeliveryFailed(done.Attempt, res, cmp.Or(done.Next.EndError, res.Error))
			}
		}
		if c.observer != nil {
			c.observer.AttemptDone(done.Attempt.ConsumerGroup, outcome, done.Result.Duration)
		}
	}
	c.recordHealth(ctx, ok)
}

// recordHealth keeps the failing streaks of the groups with a disableAfter (see Store.RecordHealth): a POST
// that failed (handler_error) extends its group's streak, a success ends it; a group whose streak lasted its
// disableAfter is disabled (reason failing). A failed write is logged; the next batch tries again.
func (c *completer) recordHealth(ctx context.Context, done []pulsetype.Completion) {
	if c.endpoints == nil {
		return
	}
	failed := map[string]time.Duration{}
	var succeeded []string
	for _, d := range done {
		g := d.Attempt.ConsumerGroup
		after := c.endpoints.disableAfter(g)
		switch {
		case after <= 0:
		case d.Result.Status == pulsetype.StatusSuccess:
			if !slices.Contains(succeeded, g) {
				succeeded = append(succeeded, g)
			}
		case d.Result.Error.CodeOrEmpty() == pulsetype.CodeHandlerError:
			failed[g] = after
		}
	}
	for _, g := range succeeded {
		delete(failed, g)
	}
	if len(failed) == 0 && len(succeeded) == 0 {
		return
	}
	disabled, err := c.store.RecordHealth(ctx, failed, succeeded)
	if err != nil {
		c.log.Warn().Err(err).Msg("recording endpoint failing streaks failed")
	}
	for _, g := range disabled {
		c.endpoints.stopped(g)
		if c.observer != nil {
			c.observer.EndpointDisabled(g, pulsetype.ReasonFailing)
		}
		c.log.Warn().Str("consumer_group", g).Str("reason", string(pulsetype.ReasonFailing)).Dur("disable_after", failed[g]).
			Msg("endpoint disabled: every attempt failed for its disableAfter; POST .../resume re-enables it")
	}
}
