package dispatcher

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/pulse-sidecar/pulse/internal/tracing"
	"github.com/pulse-sidecar/pulse/lease"
	"github.com/pulse-sidecar/pulse/pulsetype"
	"github.com/pulse-sidecar/pulse/reconciler"
	"github.com/pulse-sidecar/pulse/webhook"
)

// endpointCacheTTL is how long an endpoint read from the database is reused; a change made through this
// process drops it at once (EndpointChanged), one made through another replica is seen within this time.
const endpointCacheTTL = time.Second

// writeTimeout bounds each database write that records results.
const writeTimeout = 10 * time.Second

func (d *Dispatcher) launch(j job) {
	a := j.a
	d.mu.Lock()
	d.inflight[a.ConsumerGroup]++
	d.total++
	d.mu.Unlock()
	d.running.Add(1)
	var done, overflowed bool // guarded by d.mu
	slow := time.AfterFunc(slowAfter, func() {
		d.mu.Lock()
		if done {
			d.mu.Unlock()
			return
		}
		d.slowUntil[a.ConsumerGroup] = time.Now().Add(slowMemory)
		if d.overflow < overflowShare*d.opts.Workers {
			overflowed = true
			d.overflow++
			d.total-- // the slot goes back to the pool (see fairness)
		}
		d.mu.Unlock()
		signal(d.kick)
	})
	go func() {
		defer func() {
			slow.Stop()
			d.mu.Lock()
			done = true
			if d.inflight[a.ConsumerGroup]--; d.inflight[a.ConsumerGroup] <= 0 {
				delete(d.inflight, a.ConsumerGroup)
			}
			if overflowed {
				d.overflow--
			} else {
				d.total--
			}
			d.orderedKick[a.ConsumerGroup] = true // an ordered group's next head may be claimable now
			d.mu.Unlock()
			d.running.Done()
			signal(d.kick) // a slot is free
		}()
		d.execute(j)
	}()
}

// execute runs one leased attempt: it POSTs the event while the heartbeat renews the lease, then hands the
// result to the recorder and waits until it is written (the lease is held until then).
func (d *Dispatcher) execute(j job) {
	a := j.a
	postCtx, cancel := context.WithCancelCause(d.execCtx)
	defer cancel(nil)
	d.keeper.Hold(a.Key(), cancel)
	defer d.keeper.Release(a.Key())

	log := d.log.With().Str("consumer_group", a.ConsumerGroup).Str("event_id", a.EventID).
		Str("delivery_id", a.DeliveryID).Int("attempt", a.Number).Logger()
	// A retry reads the subscription fresh (it follows a failure, often after a long wait: the group may have
	// changed meanwhile); a first attempt trusts a cache entry younger than endpointCacheTTL, unless the entry
	// says the attempt may not run.
	ep, err := d.endpoint(postCtx, a.ConsumerGroup, a.Number > 1)
	if err == nil && a.Number == 1 && unsubscribed(ep, a) != nil {
		ep, err = d.endpoint(postCtx, a.ConsumerGroup, true)
	}
	if err != nil {
		d.abandon(postCtx, a, log, err)
		return
	}
	var res pulsetype.AttemptResult
	policy := pulsetype.RetryPolicy{}
	// The subscription decides whether the attempt may run at all: a deleted group, a group deleted and
	// registered again (another incarnation), or a topic the group dropped end the delivery without a POST.
	if gone := unsubscribed(ep, a); gone != nil {
		res = pulsetype.AttemptResult{Status: pulsetype.StatusError, Terminal: true, Error: gone}
	} else {
		policy = ep.Policy()
		ev := j.ev
		if !j.evKnown {
			ev, err = d.store.GetEvent(postCtx, a.EventID)
			if errors.Is(err, pulsetype.ErrNotFound) {
				ev, err = nil, nil
			}
			if err != nil {
				d.abandon(postCtx, a, log, err)
				return
			}
		}
		// Retention is checked on every path (local fan-out, polling, retries, replay, head of line) right
		// before the POST: no POST starts at or after the event's expiresAt.
		if ev == nil || ev.ExpiredAt(d.opts.Now()) {
			res = failed(pulsetype.CodeEventExpired, "the event was removed by retention before this attempt ran", true)
		} else {
			res = d.post(postCtx, a, ep, ev)
		}
	}
	if cause := context.Cause(postCtx); cause != nil {
		d.abandon(postCtx, a, log, cause)
		return
	}
	next := reconciler.Decide(a.Number, res.Status, res.Error, res.Terminal, res.RetryAfter, policy)
	if next.Retry {
		// Before scheduling another attempt, make sure the group still wants the delivery: a delete or a PUT
		// dropping the topic while this POST ran ends the delivery now, not when the retry comes due.
		switch ep, err := d.endpoint(postCtx, a.ConsumerGroup, true); {
		case err != nil && context.Cause(postCtx) == nil:
			log.Warn().Err(err).Msg("re-reading the endpoint before a retry failed; the retry checks it again")
		case err == nil:
			if gone := unsubscribed(ep, a); gone != nil {
				next = pulsetype.NextStep{EndStatus: pulsetype.StatusError, EndError: gone}
			}
		}
	}
	c := &completion{
		c:   pulsetype.Completion{Attempt: a, Result: res, Next: next},
		log: log, done: make(chan struct{}),
	}
	d.completions <- c
	<-c.done
}

// abandon leaves an attempt to lease expiry: shutdown aborted it, its lease was lost, or the database failed.
func (d *Dispatcher) abandon(ctx context.Context, a *pulsetype.Attempt, log zerolog.Logger, err error) {
	switch cause := context.Cause(ctx); {
	case errors.Is(cause, lease.ErrLost):
		if d.opts.Observer != nil {
			d.opts.Observer.LeaseLost(a.ConsumerGroup)
		}
		log.Error().Err(lease.ErrLost).Msg("lease lost while the webhook ran: the result is not recorded")
	case cause != nil: // shutdown grace ran out
		log.Warn().Msg("attempt aborted by shutdown: left to lease expiry")
	default:
		log.Error().Err(err).Msg("attempt abandoned: left to lease expiry")
	}
}

func (d *Dispatcher) post(ctx context.Context, a *pulsetype.Attempt, ep *pulsetype.Endpoint, ev *pulsetype.Event) pulsetype.AttemptResult {
	body, bodyHeaders := ev.Envelope(), map[string]string{}
	if ep.Format == pulsetype.FormatCloudEvents {
		bodyHeaders, body = ev.CloudEvent()
	}
	tracer := d.opts.Tracer
	if tracer == nil {
		tracer = tracing.Tracer(nil)
	}
	_, span := tracer.Start(tracing.Resume(ctx, ev.TraceParent, ev.TraceState), "deliver "+ev.Topic,
		trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
			attribute.String("pulse.consumer_group", a.ConsumerGroup), attribute.Int("pulse.attempt", a.Number),
			attribute.String("pulse.topic", ev.Topic), attribute.String("pulse.event_id", ev.ID)))
	defer span.End()
	if tp, ts := tracing.Carried(trace.ContextWithSpan(ctx, span)); tp != "" {
		bodyHeaders["traceparent"] = tp
		if ts != "" {
			bodyHeaders["tracestate"] = ts
		}
	}
	r := d.sender.Send(ctx, webhook.Request{
		URL: ep.URL, Body: body, BodyHeaders: bodyHeaders, EventID: ev.ID, Topic: ev.Topic, ConsumerGroup: a.ConsumerGroup,
		DeliveryID: a.DeliveryID, Attempt: a.Number, Headers: ep.Headers, Secret: ep.Secret, PreviousSecret: ep.PreviousSecretAt(d.opts.Now()),
		Timeout: time.Duration(*ep.Timeout), InsecureSkipVerify: ep.InsecureSkipVerify,
	})
	res := pulsetype.AttemptResult{HTTPStatus: r.HTTPStatus, Duration: r.Duration, ResponseBody: r.Body, RetryAfter: r.RetryAfter}
	span.SetAttributes(attribute.Int("http.response.status_code", r.HTTPStatus), attribute.String("pulse.outcome", r.Outcome.String()))
	if r.Outcome != webhook.OutcomeSuccess {
		span.SetStatus(codes.Error, r.Message)
	}
	if r.Outcome == webhook.OutcomeSuccess {
		res.Status = pulsetype.StatusSuccess
		return res
	}
	res.Status = pulsetype.StatusError
	res.Terminal = r.Outcome == webhook.OutcomeTerminal
	res.Error = &pulsetype.ErrorInfo{Code: pulsetype.CodeHandlerError, Message: r.Message}
	return res
}

func failed(code, msg string, terminal bool) pulsetype.AttemptResult {
	return pulsetype.AttemptResult{Status: pulsetype.StatusError, Terminal: terminal, Error: &pulsetype.ErrorInfo{Code: code, Message: msg}}
}

// completion is a result waiting for the recorder; done is closed once it was written (or given up).
type completion struct {
	c    pulsetype.Completion
	log  zerolog.Logger
	done chan struct{}
}

// recorder writes results as they come, group-commit style: every result that arrived while the previous
// batch was being written goes into the next one (at most maxRecordBatch).
func (d *Dispatcher) recorder() {
	defer close(d.recorded)
	for c := range d.completions {
		batch := []*completion{c}
	drain:
		for len(batch) < maxRecordBatch {
			select {
			case c, ok := <-d.completions:
				if !ok {
					break drain
				}
				batch = append(batch, c)
			default:
				break drain
			}
		}
		d.record(batch)
		for _, c := range batch {
			close(c.done)
		}
	}
}

// record writes a batch of results with writes fenced by each attempt's id and lock token, then moves the
// deliveries on (reconciler.Decide's step for each).
func (d *Dispatcher) record(batch []*completion) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(d.execCtx), writeTimeout)
	defer cancel()
	cs := make([]pulsetype.Completion, len(batch))
	for i, c := range batch {
		cs[i] = c.c
	}
	recorded, err := d.store.FinishAttempts(ctx, cs)
	if err != nil {
		for _, c := range batch {
			c.log.Error().Err(err).Msg("recording the attempt failed: left to lease expiry")
		}
		return
	}
	var ok []pulsetype.Completion
	var okLogs []zerolog.Logger
	for i, c := range batch {
		if !recorded[i] {
			if d.opts.Observer != nil {
				d.opts.Observer.LeaseLost(c.c.Attempt.ConsumerGroup)
			}
			c.log.Error().Err(pulsetype.ErrLeaseLost).Msg("lease lost: another worker owns this attempt, its result is not recorded")
			continue
		}
		ok = append(ok, c.c)
		okLogs = append(okLogs, c.log)
	}
	if len(ok) == 0 {
		return
	}
	if err := d.store.FollowUps(ctx, ok); err != nil {
		for _, log := range okLogs {
			log.Error().Err(err).Msg("moving the delivery on failed: the reconciler will repair it")
		}
		return
	}
	for i, c := range ok {
		outcome := "success"
		switch res := c.Result; {
		case res.Status == pulsetype.StatusSuccess:
		case c.Next.Retry:
			outcome = "retry"
			time.AfterFunc(c.Next.Delay, d.Wake)
		case res.Error.Code == pulsetype.CodeEndpointDeleted || res.Error.Code == pulsetype.CodeUnsubscribed:
			outcome = "error" // the subscription ended: a normal outcome, not a failure of the receiver
			okLogs[i].Info().Str("error_code", res.Error.Code).Str("error", res.Error.Message).Msg("delivery ended: no longer subscribed")
		default:
			outcome = "error"
			okLogs[i].Error().Str("error_code", res.Error.Code).Str("error", res.Error.Message).Int("http_status", res.HTTPStatus).
				Msg("delivery failed terminally")
		}
		if d.opts.Observer != nil {
			d.opts.Observer.AttemptDone(c.Attempt.ConsumerGroup, outcome, c.Result.Duration)
		}
	}
}

// subscribed reports whether attempt a may run for endpoint ep: the group exists in the registration a was
// created for and still subscribes to a's topic.
func subscribed(ep *pulsetype.Endpoint, a *pulsetype.Attempt) bool { return unsubscribed(ep, a) == nil }

// unsubscribed returns why attempt a may not run for endpoint ep (the group's current registration, nil
// when it has none), or nil when it may: endpoint_deleted when the group was deleted, or deleted and
// registered again (another incarnation); unsubscribed when it no longer subscribes to a's topic.
func unsubscribed(ep *pulsetype.Endpoint, a *pulsetype.Attempt) *pulsetype.ErrorInfo {
	switch {
	case ep == nil:
		return &pulsetype.ErrorInfo{Code: pulsetype.CodeEndpointDeleted, Message: "the consumer group " + a.ConsumerGroup + " was deleted"}
	case ep.Incarnation != a.Incarnation:
		return &pulsetype.ErrorInfo{Code: pulsetype.CodeEndpointDeleted,
			Message: "the consumer group " + a.ConsumerGroup + " was deleted and registered again; this delivery belongs to the earlier registration"}
	case !slices.Contains(ep.Topics, a.Topic):
		return &pulsetype.ErrorInfo{Code: pulsetype.CodeUnsubscribed, Message: "the consumer group " + a.ConsumerGroup + " no longer subscribes to topic " + a.Topic}
	}
	return nil
}

// endpoint returns the consumer group's endpoint (nil when it has none), cached for endpointCacheTTL unless
// fresh is set.
func (d *Dispatcher) endpoint(ctx context.Context, group string, fresh bool) (*pulsetype.Endpoint, error) {
	d.mu.Lock()
	c, ok := d.eps[group]
	d.mu.Unlock()
	if ok && !fresh && time.Since(c.fetched) < endpointCacheTTL {
		return c.ep, nil
	}
	start := time.Now()
	ep, err := d.store.GetEndpoint(ctx, group)
	if errors.Is(err, pulsetype.ErrNotFound) {
		ep, err = nil, nil
	}
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.cacheLocked(group, ep, start)
	d.mu.Unlock()
	return ep, nil
}

// cacheLocked caches ep as group's endpoint read at readStart, unless the group changed through this
// process after readStart (the read may predate the change); d.mu is held.
func (d *Dispatcher) cacheLocked(group string, ep *pulsetype.Endpoint, readStart time.Time) {
	if c, ok := d.eps[group]; ok && c.changedAt.After(readStart) {
		return
	}
	d.eps[group] = cachedEndpoint{ep: ep, fetched: readStart}
}

// EndpointChanged drops the cached endpoint of a consumer group after it was registered, replaced or deleted
// through this process.
func (d *Dispatcher) EndpointChanged(group string) {
	d.mu.Lock()
	c := d.eps[group]
	c.fetched, c.changedAt = time.Time{}, time.Now() // re-read before use; reads begun earlier are not cached
	d.eps[group] = c
	d.orderedNext = time.Time{}
	d.mu.Unlock()
	d.Wake()
}
