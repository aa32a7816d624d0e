package dispatcher

import (
	"context"
	"errors"
	"time"

	"github.com/rs/zerolog"

	"github.com/pulse-sidecar/pulse/lease"
	"github.com/pulse-sidecar/pulse/pulsetype"
	"github.com/pulse-sidecar/pulse/reconciler"
	"github.com/pulse-sidecar/pulse/webhook"
)

// endpointCacheTTL is how long an endpoint read from the database is reused; a change made through this
// process drops it at once (EndpointChanged), one made through another replica is seen within this time.
const endpointCacheTTL = time.Second

// writeTimeout bounds each database write that records an attempt's result.
const writeTimeout = 10 * time.Second

func (d *Dispatcher) launch(a *pulsetype.Attempt) {
	d.mu.Lock()
	d.inflight[a.ConsumerGroup]++
	d.total++
	d.mu.Unlock()
	d.running.Add(1)
	go func() {
		defer func() {
			d.mu.Lock()
			if d.inflight[a.ConsumerGroup]--; d.inflight[a.ConsumerGroup] <= 0 {
				delete(d.inflight, a.ConsumerGroup)
			}
			d.total--
			d.mu.Unlock()
			d.running.Done()
			d.Wake() // a slot is free
		}()
		d.execute(a)
	}()
}

// execute runs one leased attempt: it POSTs the event while the heartbeat renews the lease, then records the
// result with fenced writes and moves the delivery on.
func (d *Dispatcher) execute(a *pulsetype.Attempt) {
	postCtx, cancel := context.WithCancelCause(d.execCtx)
	defer cancel(nil)
	d.keeper.Hold(a.LockToken, cancel)
	defer d.keeper.Release(a.LockToken)

	log := d.log.With().Str("consumer_group", a.ConsumerGroup).Str("event_id", a.EventID).
		Str("delivery_id", a.DeliveryID).Int("attempt", a.Number).Logger()
	ep, err := d.endpoint(postCtx, a.ConsumerGroup)
	if err != nil {
		d.abandon(postCtx, a, log, err)
		return
	}
	var res pulsetype.AttemptResult
	policy := pulsetype.RetryPolicy{}
	switch {
	case ep == nil:
		res = failed(pulsetype.CodeHandlerError, "consumer group "+a.ConsumerGroup+" has no endpoint registered", true)
	default:
		policy = ep.Policy()
		ev, err := d.store.GetEvent(postCtx, a.EventID)
		switch {
		case errors.Is(err, pulsetype.ErrNotFound):
			res = failed(pulsetype.CodeEventExpired, "the event was removed by retention before this attempt ran", true)
		case err != nil:
			d.abandon(postCtx, a, log, err)
			return
		default:
			res = d.post(postCtx, a, ep, ev)
		}
	}
	if cause := context.Cause(postCtx); cause != nil {
		d.abandon(postCtx, a, log, cause)
		return
	}
	d.record(log, a, res, policy)
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
	r := d.sender.Send(ctx, webhook.Request{
		URL: ep.URL, Body: ev.Envelope(), EventID: ev.ID, Topic: ev.Topic, ConsumerGroup: a.ConsumerGroup,
		DeliveryID: a.DeliveryID, Attempt: a.Number, Headers: ep.Headers, Secret: ep.Secret,
		Timeout: time.Duration(*ep.Timeout), InsecureSkipVerify: ep.InsecureSkipVerify,
	})
	res := pulsetype.AttemptResult{HTTPStatus: r.HTTPStatus, Duration: r.Duration, ResponseBody: r.Body, RetryAfter: r.RetryAfter}
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

// record writes the attempt's result (fenced) and moves the delivery on.
func (d *Dispatcher) record(log zerolog.Logger, a *pulsetype.Attempt, res pulsetype.AttemptResult, policy pulsetype.RetryPolicy) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(d.execCtx), writeTimeout)
	defer cancel()
	if err := d.store.FinishAttempt(ctx, a, res); err != nil {
		if errors.Is(err, pulsetype.ErrLeaseLost) {
			if d.opts.Observer != nil {
				d.opts.Observer.LeaseLost(a.ConsumerGroup)
			}
			log.Error().Err(err).Msg("lease lost: another worker owns this attempt, its result is not recorded")
			return
		}
		log.Error().Err(err).Msg("recording the attempt failed: left to lease expiry")
		return
	}
	code := ""
	if res.Error != nil {
		code = res.Error.Code
	}
	step, err := reconciler.FollowUp(ctx, d.store, a, res.Status, res.Error, res.Terminal, res.RetryAfter, policy)
	if err != nil {
		log.Error().Err(err).Msg("moving the delivery on failed: the reconciler will repair it")
		return
	}
	outcome := "success"
	switch {
	case res.Status == pulsetype.StatusSuccess:
	case step.Retry:
		outcome = "retry"
		time.AfterFunc(step.Delay, d.Wake)
	default:
		outcome = "error"
		log.Error().Str("error_code", code).Str("error", res.Error.Message).Int("http_status", res.HTTPStatus).
			Msg("delivery failed terminally")
	}
	if d.opts.Observer != nil {
		d.opts.Observer.AttemptDone(a.ConsumerGroup, outcome, res.Duration)
	}
}

// endpoint returns the consumer group's endpoint (nil when it has none), cached for one poll interval.
func (d *Dispatcher) endpoint(ctx context.Context, group string) (*pulsetype.Endpoint, error) {
	d.mu.Lock()
	c, ok := d.eps[group]
	d.mu.Unlock()
	if ok && time.Since(c.fetched) < endpointCacheTTL {
		return c.ep, nil
	}
	ep, err := d.store.GetEndpoint(ctx, group)
	if errors.Is(err, pulsetype.ErrNotFound) {
		ep, err = nil, nil
	}
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.eps[group] = cachedEndpoint{ep: ep, fetched: time.Now()}
	d.mu.Unlock()
	return ep, nil
}

// EndpointChanged drops the cached endpoint of a consumer group after it was registered, replaced or deleted
// through this process.
func (d *Dispatcher) EndpointChanged(group string) {
	d.mu.Lock()
	if c, ok := d.eps[group]; ok {
		c.fetched = time.Time{} // re-read before use; the next turn re-lists every endpoint first
		d.eps[group] = c
	}
	d.orderedAt = time.Time{}
	d.mu.Unlock()
	d.Wake()
}
