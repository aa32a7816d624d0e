package opsevents

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/rs/zerolog"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// DefaultInterval is the shortest time between two operational events of one topic about one consumer group
// from one replica; the events in between are coalesced.
const DefaultInterval = time.Minute

// maxMessage bounds the error message an event carries, in bytes.
const maxMessage = 512

// Store is the storage the Emitter needs: *mongo.Store implements it.
type Store interface {
	Publish(ctx context.Context, events []*pulsetype.Event) ([]pulsetype.Published, error)
}

// Notifier is told of the events the Emitter stored, so that this process fans them out at once
// (*dispatcher.Dispatcher implements it); without one, the fan-out repair delivers them.
type Notifier interface {
	Published(events []*pulsetype.Event)
}

// Options configure an Emitter.
type Options struct {
	Interval time.Duration // DefaultInterval when 0
	Logger   zerolog.Logger
	Now      func() time.Time // time.Now when nil
}

// Emitter publishes operational events. Its methods return at once: the publish runs on a goroutine of its
// own, bounded by a timeout, and a failure is logged (the event is then lost: it reports an outcome that the
// log, the metrics and the console also show). It is safe for concurrent use.
type Emitter struct {
	store    Store
	interval time.Duration
	log      zerolog.Logger
	now      func() time.Time

	mu     sync.Mutex
	notify Notifier
	slots  map[slotKey]*slot
	wg     sync.WaitGroup
}

type slotKey struct{ topic, group string }

// slot is the coalescing state of one (topic, consumer group): when its last event was published, and the
// latest data and count of the events held back since.
type slot struct {
	last    time.Time
	held    map[string]any
	count   int
	flushAt bool // a flush is scheduled
}

// New returns an Emitter that publishes through store.
func New(store Store, opts Options) *Emitter {
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	interval := opts.Interval
	if interval <= 0 {
		interval = DefaultInterval
	}
	return &Emitter{store: store, interval: interval, now: now, slots: map[slotKey]*slot{},
		log: opts.Logger.With().Str("component", "opsevents").Logger()}
}

// NotifyWith sets the notifier of stored events (the dispatcher, built after the Emitter).
func (e *Emitter) NotifyWith(n Notifier) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.notify = n
}

// EndpointDisabled publishes pulse.endpoint.disabled: {consumerGroup, state, reason, at}.
func (e *Emitter) EndpointDisabled(group string, reason pulsetype.StateReason) {
	e.emit(pulsetype.TopicEndpointDisabled, group, map[string]any{"consumerGroup": group, "state": pulsetype.EndpointDisabled,
		"reason": reason, "at": e.stamp()})
}

// EndpointEnabled publishes pulse.endpoint.enabled: {consumerGroup, state, previousReason, at}, for an
// endpoint resumed after the sidecar disabled it.
func (e *Emitter) EndpointEnabled(group string, previous pulsetype.StateReason) {
	e.emit(pulsetype.TopicEndpointEnabled, group, map[string]any{"consumerGroup": group, "state": pulsetype.EndpointActive,
		"previousReason": previous, "at": e.stamp()})
}

// DeliveryFailed publishes pulse.delivery.failed for attempt a's delivery, which ended with end:
// {consumerGroup, deliveryId, eventId, topic, attempt, errorCode, errorMessage, httpStatus, at, count}. The
// deliveries of operational events publish nothing (no loop).
func (e *Emitter) DeliveryFailed(a *pulsetype.Attempt, res pulsetype.AttemptResult, end *pulsetype.ErrorInfo) {
	if pulsetype.Reserved(a.Topic) {
		return
	}
	data := map[string]any{"consumerGroup": a.ConsumerGroup, "deliveryId": a.DeliveryID, "eventId": a.EventID, "topic": a.Topic,
		"attempt": a.Number, "at": e.stamp()}
	if end != nil {
		msg := end.Message
		if len(msg) > maxMessage {
			msg = msg[:maxMessage]
		}
		data["errorCode"], data["errorMessage"] = end.Code, msg
	}
	if res.HTTPStatus != 0 {
		data["httpStatus"] = res.HTTPStatus
	}
	e.emit(pulsetype.TopicDeliveryFailed, a.ConsumerGroup, data)
}

// stamp returns now as every timestamp of an operational event is written: pulsetype.FormatTime (UTC,
// milliseconds, as the API writes times).
func (e *Emitter) stamp() string { return pulsetype.FormatTime(e.now()) }

// emit publishes data at once when the slot's last event is at least the interval old, and otherwise holds
// it: the slot's flush publishes the latest held data once the interval has passed, with count the number
// of events it stands for.
func (e *Emitter) emit(topic, group string, data map[string]any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	k := slotKey{topic, group}
	s := e.slots[k]
	if s == nil {
		s = &slot{}
		e.slots[k] = s
	}
	now := e.now()
	if s.last.IsZero() || now.Sub(s.last) >= e.interval {
		s.last = now
		data["count"] = 1
		e.publishLocked(topic, group, data)
		return
	}
	s.held, s.count = data, s.count+1
	if !s.flushAt {
		s.flushAt = true
		time.AfterFunc(e.interval-now.Sub(s.last), func() { e.flush(k) })
	}
}

// flush publishes the events a slot held back, as one event.
func (e *Emitter) flush(k slotKey) {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.slots[k]
	if s == nil || s.held == nil {
		return
	}
	s.held["count"] = s.count
	e.publishLocked(k.topic, k.group, s.held)
	s.last, s.held, s.count, s.flushAt = e.now(), nil, 0, false
}

// publishNow publishes without coalescing: for events whose rate is bounded otherwise (pulse.backlog.high
// changes state at most once per check).
func (e *Emitter) publishNow(topic, group string, data map[string]any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.publishLocked(topic, group, data)
}

// publishLocked stores the event on a goroutine of its own; e.mu is held.
func (e *Emitter) publishLocked(topic, group string, data map[string]any) {
	body, err := json.Marshal(data)
	if err != nil {
		e.log.Error().Err(err).Str("topic", topic).Msg("encoding an operational event failed")
		return
	}
	ev := &pulsetype.Event{ID: uuid.Must(uuid.NewV7()).String(), Topic: topic, Data: body,
		Headers: map[string]string{pulsetype.SubjectGroupHeader: group}}
	notify := e.notify
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		published, err := e.store.Publish(ctx, []*pulsetype.Event{ev})
		if err != nil {
			e.log.Warn().Err(err).Str("topic", topic).Str("consumer_group", group).Msg("publishing an operational event failed")
			return
		}
		if notify != nil {
			fresh := make([]*pulsetype.Event, 0, len(published))
			for _, p := range published {
				if !p.Existing {
					fresh = append(fresh, p.Event)
				}
			}
			notify.Published(fresh)
		}
	}()
}

// Wait blocks until the publishes started so far have ended (for shutdown and tests).
func (e *Emitter) Wait() { e.wg.Wait() }
