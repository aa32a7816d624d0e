package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/pulse-sidecar/pulse/internal/tracing"
	"github.com/pulse-sidecar/pulse/lease"
	"github.com/pulse-sidecar/pulse/pulsetype"
	"github.com/pulse-sidecar/pulse/webhook"
)

// eventStore is the part of Store the executor reads and writes (besides results, which go through the
// completer).
type eventStore interface {
	GetEvent(ctx context.Context, id string) (*pulsetype.Event, error)
	ReleaseAttempt(ctx context.Context, a *pulsetype.Attempt) error
	DisableEndpoint(ctx context.Context, group string, reason pulsetype.StateReason, failingBefore time.Time) (bool, error)
}

// executor runs leased attempts, one goroutine each: it checks the subscription and the event's expiresAt,
// POSTs the event while the keeper renews the lease, decides what follows with the group's retry policy
// and hands the result to the completer. It is safe for concurrent use.
type executor struct {
	store     eventStore
	sender    Sender
	endpoints *endpointCache
	gate      *stateGate // nil: the cached state alone counts (unit tests)
	keeper    *lease.Keeper
	completer *completer
	slots     *slots
	tracer    trace.Tracer
	now       func() time.Time // the database's clock, against which expiresAt is checked
	observer  Observer         // may be nil
	ended     func(group string)
	log       zerolog.Logger
	// windowGrace is how late past its retry window's end a retry may still start (windowGrace): the
	// claim latency of an attempt due at the window's very end.
	windowGrace time.Duration

	mu      sync.Mutex
	ctx     context.Context // parent of every POST: cancelled only by abort
	abort   context.CancelFunc
	running sync.WaitGroup
}

// start sets the context the POSTs run in: ctx without its cancellation, cancelled by abort.
func (e *executor) start(ctx context.Context) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.ctx, e.abort = context.WithCancel(context.WithoutCancel(ctx))
}

// stop waits up to grace for the attempts running to end, then aborts the rest (they write nothing and
// are left to lease expiry) and waits for them too.
func (e *executor) stop(grace time.Duration) {
	finished := make(chan struct{})
	go func() { e.running.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(grace):
		e.log.Warn().Msg("shutdown grace ran out: aborting in-flight deliveries, their leases will expire")
		e.cancel()
		<-finished
	}
	e.cancel()
}

func (e *executor) cancel() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.abort != nil {
		e.abort()
	}
}

// launchBatch launches jobs (their worker slots taken already, or taken now), having asked the state gate
// about all of them at once, so that one read answers the batch (see launch).
func (e *executor) launchBatch(ctx context.Context, jobs []job) {
	if len(jobs) == 0 {
		return
	}
	if e.gate != nil {
		groups := make([]string, len(jobs))
		for i, j := range jobs {
			groups[i] = j.a.ConsumerGroup
		}
		for i, q := range e.gate.ask(ctx, groups) {
			jobs[i].gate = q
		}
	}
	for _, j := range jobs {
		e.launch(j)
	}
}

// launch runs a leased attempt in a worker slot, in a goroutine of its own, and returns at once. When it
// ends the slot is given back and ended is called with the attempt's consumer group.
func (e *executor) launch(j job) {
	release := j.release
	if release == nil {
		release = e.slots.acquire(j.a.ConsumerGroup)
	}
	e.mu.Lock()
	ctx := e.ctx
	e.mu.Unlock()
	e.running.Add(1)
	go func() {
		defer e.running.Done()
		defer func() {
			release()
			e.ended(j.a.ConsumerGroup)
		}()
		e.execute(ctx, j)
	}()
}

// execute runs one leased attempt and hands its result to the completer, waiting until it was written: the
// keeper renews the lease until then, and cancels the attempt with pulsetype.ErrLeaseLost if it is lost.
func (e *executor) execute(ctx context.Context, j job) {
	a := j.a
	postCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	e.keeper.Hold(a.Key(), e.leaseLeft(a), cancel)
	defer e.keeper.Release(a.Key())
	log := e.log.With().Str("consumer_group", a.ConsumerGroup).Str("event_id", a.EventID).
		Str("delivery_id", a.DeliveryID).Int("attempt", a.Number).Logger()
	if c, ok := e.run(postCtx, j, log); ok && !e.completer.complete(c, log) {
		log.Warn().Msg("the completer stopped before this result was recorded: left to lease expiry")
	}
}

// leaseLeft returns how long a's lease has left to run as granted (its lockedUntil against the database's
// clock; at least 1ns, so that one that ran out is held as running out now), or 0 (a whole lease timeout)
// when a carries none.
func (e *executor) leaseLeft(a *pulsetype.Attempt) time.Duration {
	if a.LeasedUntil == nil {
		return 0
	}
	return max(a.LeasedUntil.Sub(e.now()), time.Nanosecond)
}

// run executes one leased attempt under postCtx (cancelled with its cause when the lease is lost or
// shutdown aborts it) and returns its result with what follows it (the group's retry policy decides), or
// false when the attempt was abandoned (lease lost, shutdown, database error) and must be left to lease
// expiry.
func (e *executor) run(postCtx context.Context, j job, log zerolog.Logger) (pulsetype.Completion, bool) {
	a := j.a
	// A retry reads the subscription fresh (it follows a failure, often after a long wait: the group may have
	// changed meanwhile); a first attempt trusts a cache entry younger than endpointCacheTTL, unless the entry
	// says the attempt may not run.
	ep, err := e.endpoints.get(postCtx, a.ConsumerGroup, a.Number > 1)
	if err == nil && a.Number == 1 && unsubscribed(ep, a) != nil {
		ep, err = e.endpoints.get(postCtx, a.ConsumerGroup, true)
	}
	if err != nil {
		e.abandon(postCtx, a, log, err)
		return pulsetype.Completion{}, false
	}
	if unsubscribed(ep, a) == nil && !e.active(postCtx, ep, a.ConsumerGroup, j.gate) {
		// Paused or disabled: given back unstarted, not consumed.
		e.endpoints.stopped(a.ConsumerGroup)
		if err := e.store.ReleaseAttempt(postCtx, a); err != nil {
			log.Warn().Err(err).Msg("giving back an attempt of a paused or disabled endpoint failed: left to lease expiry")
		}
		return pulsetype.Completion{}, false
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
			ev, err = e.store.GetEvent(postCtx, a.EventID)
			if errors.Is(err, pulsetype.ErrNotFound) {
				ev, err = nil, nil
			}
			if err != nil {
				e.abandon(postCtx, a, log, err)
				return pulsetype.Completion{}, false
			}
		}
		// Retention is checked on every path (local fan-out, polling, retries, replay, head of line) right
		// before the POST: no POST starts at or after the event's expiresAt.
		if ev == nil || ev.ExpiredAt(e.now()) {
			res = failed(pulsetype.CodeEventExpired, "the event was removed by retention before this attempt ran", true)
		} else if late := e.pastWindow(a, policy); late > 0 {
			res = failed(pulsetype.CodeRetryWindow, fmt.Sprintf("the attempt would have started %s after the first attempt, past maxRetryDuration %s (it waited for a resume, or for a worker)",
				(policy.MaxDuration+late).Round(time.Millisecond), policy.MaxDuration), true)
		} else if !e.keeper.Live(a.Key()) && !e.keeper.Refresh(postCtx, a.Key()) {
			// The claim and the checks outlasted the lease and no heartbeat renewed it (an overloaded
			// database), and a renewal sent now found it lost or did not answer within a lease timeout: the
			// reaper may have ended it, so no POST starts on it. Given back unstarted when still possible.
			// (Given back without that renewal, every claim whose two writes waited more than half the lease
			// in the write queue was given back, claimed again and given back again: no delivery at all.)
			log.Warn().Msg("the lease ran out before the POST started: attempt given back unstarted")
			rctx, cancel := context.WithTimeout(context.WithoutCancel(postCtx), writeTimeout)
			defer cancel()
			if err := e.store.ReleaseAttempt(rctx, a); err != nil && !errors.Is(err, pulsetype.ErrLeaseLost) {
				log.Warn().Err(err).Msg("giving back the attempt failed: left to lease expiry")
			}
			return pulsetype.Completion{}, false
		} else {
			res = e.post(postCtx, a, ep, ev)
		}
	}
	if cause := context.Cause(postCtx); cause != nil {
		e.abandon(postCtx, a, log, cause)
		return pulsetype.Completion{}, false
	}
	if res.Error.CodeOrEmpty() == pulsetype.CodeEndpointGone {
		e.disable(postCtx, a.ConsumerGroup, log) // before the retry exists, so that no replica POSTs it
	}
	next := policy.Decide(a.Counted(), res, e.now().Sub(a.FirstStart()))
	if next.Retry {
		// Before scheduling another attempt, make sure the group still wants the delivery: a delete or a PUT
		// dropping the topic while this POST ran ends the delivery now, not when the retry comes due.
		switch ep, err := e.endpoints.get(postCtx, a.ConsumerGroup, true); {
		case err != nil && context.Cause(postCtx) == nil:
			log.Warn().Err(err).Msg("re-reading the endpoint before a retry failed; the retry checks it again")
		case err == nil:
			if gone := unsubscribed(ep, a); gone != nil {
				next = pulsetype.NextStep{EndStatus: pulsetype.StatusError, EndError: gone}
			}
		}
	}
	return pulsetype.Completion{Attempt: a, Result: res, Next: next}, true
}

// windowGrace returns how late past the end of its retry window a retry due within it may still start:
// two poll intervals (a due retry is claimed by polling, jittered), at least 2 s. A retry held back longer,
// by a disabled or paused endpoint (the 410 Gone retry waits for a resume) or a backlog, ends the delivery
// instead of POSTing after the window.
func windowGrace(poll time.Duration) time.Duration { return max(2*poll, 2*time.Second) }

// pastWindow returns how long past its retry window (policy.MaxDuration from the delivery's first attempt)
// attempt a would start now, when that is more than e.windowGrace; else 0. A first attempt, or one that
// starts a new window (a manual retry or replay: no FirstAttemptAt), is never past it.
func (e *executor) pastWindow(a *pulsetype.Attempt, policy pulsetype.RetryPolicy) time.Duration {
	if policy.MaxDuration <= 0 || a.Number <= 1 || a.FirstAttemptAt.IsZero() {
		return 0
	}
	late := e.now().Sub(a.FirstAttemptAt) - policy.MaxDuration
	if late <= e.windowGrace {
		return 0
	}
	return late
}

// disable disables the consumer group's endpoint after a 410 Gone (reason gone) and notes it in the cache;
// a failed write is logged: the retry then runs when due and may disable it again.
func (e *executor) disable(ctx context.Context, group string, log zerolog.Logger) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	defer cancel()
	ok, err := e.store.DisableEndpoint(ctx, group, pulsetype.ReasonGone, time.Time{})
	if err != nil {
		log.Error().Err(err).Msg("disabling the endpoint after 410 Gone failed")
		return
	}
	e.endpoints.stopped(group)
	if ok {
		if e.observer != nil {
			e.observer.EndpointDisabled(group, pulsetype.ReasonGone)
		}
		log.Warn().Str("reason", string(pulsetype.ReasonGone)).Msg("endpoint disabled: the receiver answered 410 Gone; POST .../resume re-enables it")
	}
}

// abandon leaves an attempt to lease expiry: shutdown aborted it, its lease was lost, or the database failed.
func (e *executor) abandon(ctx context.Context, a *pulsetype.Attempt, log zerolog.Logger, err error) {
	switch cause := context.Cause(ctx); {
	case errors.Is(cause, pulsetype.ErrLeaseLost):
		if e.observer != nil {
			e.observer.LeaseLost(a.ConsumerGroup)
		}
		log.Error().Err(pulsetype.ErrLeaseLost).Msg("lease lost while the webhook ran: the result is not recorded")
	case cause != nil: // shutdown grace ran out
		log.Warn().Msg("attempt aborted by shutdown: left to lease expiry")
	default:
		log.Error().Err(err).Msg("attempt abandoned: left to lease expiry")
	}
}

// post POSTs the event to the endpoint, with a deliver span, and returns the attempt's result.
func (e *executor) post(ctx context.Context, a *pulsetype.Attempt, ep *pulsetype.Endpoint, ev *pulsetype.Event) pulsetype.AttemptResult {
	bodyHeaders, body := webhook.Body(ev, ep.Format)
	tracer := e.tracer
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
	r := e.sender.Send(ctx, webhook.Request{
		URL: ep.URL, Body: body, BodyHeaders: bodyHeaders, EventID: ev.ID, Topic: ev.Topic, ConsumerGroup: a.ConsumerGroup,
		DeliveryID: a.DeliveryID, Attempt: a.Number, Headers: ep.Headers, Secret: ep.Secret, PreviousSecret: ep.PreviousSecretAt(e.now()),
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
	if r.HTTPStatus == http.StatusGone {
		// The receiver is gone: the endpoint is disabled and the delivery waits for its resume.
		res.Terminal = false
		res.Error = &pulsetype.ErrorInfo{Code: pulsetype.CodeEndpointGone, Message: r.Message + ": the endpoint is disabled until POST .../resume"}
	}
	return res
}

func failed(code pulsetype.ErrorCode, msg string, terminal bool) pulsetype.AttemptResult {
	return pulsetype.AttemptResult{Status: pulsetype.StatusError, Terminal: terminal, Error: &pulsetype.ErrorInfo{Code: code, Message: msg}}
}
