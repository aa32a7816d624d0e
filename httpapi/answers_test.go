package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pulse-sidecar/pulse/httpapi"
	"github.com/pulse-sidecar/pulse/pulsetype"
)

var updateAnswers = flag.Bool("update", false, "rewrite testdata/answers/*.golden from the API's answers")

// Fixed times of the answer fixtures: milliseconds with a trailing zero, so that a writer that trims
// fraction digits shows.
var (
	fixAt      = time.Date(2025, 3, 1, 12, 0, 15, 130_000_000, time.UTC)
	fixLater   = fixAt.Add(1500 * time.Millisecond)
	fixOverlap = fixAt.Add(24 * time.Hour)
)

// answerStore is a Store of fixed records, so the API answers the same bytes on every run. A method it does
// not define panics (the embedded nil interface).
type answerStore struct{ httpapi.Store }

func fixEvent() *pulsetype.Event {
	expires := fixAt.Add(72 * time.Hour)
	return &pulsetype.Event{ID: "evt-1", Topic: "payment.captured", Data: json.RawMessage(`{"amount":1.50,"note":"<a&b>"}`),
		Headers: map[string]string{"tenant": "t-1", "x-b": "<&>"}, OrderingKey: "customer-42", CreatedAt: fixAt,
		TraceParent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", ExpiresAt: &expires}
}

func fixPending() *pulsetype.Delivery {
	return &pulsetype.Delivery{ID: "dlv-pending", EventID: "evt-1", ConsumerGroup: "billing", Topic: "payment.captured",
		OrderingKey: "customer-42", Status: pulsetype.StatusPending, EventCreatedAt: fixAt, CreatedAt: fixAt.Add(time.Millisecond),
		UpdatedAt: fixLater, ReopenedAttempt: 1, Incarnation: "inc-1"}
}

func fixTerminal() *pulsetype.Delivery {
	ended := fixLater.Add(time.Second)
	return &pulsetype.Delivery{ID: "dlv-failed", EventID: "evt-1", ConsumerGroup: "audit", Topic: "payment.captured",
		Status: pulsetype.StatusError, EventCreatedAt: fixAt, CreatedAt: fixAt, UpdatedAt: ended, EndedAt: &ended, FinalAttempt: 3,
		Error: &pulsetype.ErrorInfo{Code: pulsetype.CodeHandlerError, Message: "HTTP 500 from https://x.example/a?b=1&c=<2>"}}
}

func fixCancelled() *pulsetype.Delivery {
	ended := fixLater
	return &pulsetype.Delivery{ID: "dlv-cancelled", EventID: "evt-2", ConsumerGroup: "billing", Topic: "t", Status: pulsetype.StatusCancelled,
		EventCreatedAt: fixAt, CreatedAt: fixAt, UpdatedAt: ended, EndedAt: &ended, FinalAttempt: 1,
		Error: &pulsetype.ErrorInfo{Code: pulsetype.CodeCancelled, Message: "cancelled through the API"}}
}

func fixAttempts() []*pulsetype.Attempt {
	started, ended, leased := fixAt.Add(10*time.Millisecond), fixAt.Add(130*time.Millisecond), fixLater.Add(time.Minute)
	return []*pulsetype.Attempt{
		{ID: "att-1", DeliveryID: "dlv-pending", EventID: "evt-1", ConsumerGroup: "billing", Topic: "payment.captured", Number: 1,
			Status: pulsetype.StatusError, HTTPStatus: 503, DurationMs: new(int64(120)), ResponseBody: "<busy & down>",
			Error:     &pulsetype.ErrorInfo{Code: pulsetype.CodeHandlerError, Message: "HTTP 503"},
			CreatedAt: fixAt, NextAttemptAt: fixAt, StartedAt: &started, EndedAt: &ended, LeaseOwner: "w-1", FencingToken: "tok-1",
			RetryAfter: time.Second, Terminal: false},
		{ID: "att-2", DeliveryID: "dlv-pending", Number: 2, Status: pulsetype.StatusPending, LeaseState: pulsetype.LeaseActive,
			CreatedAt: ended, NextAttemptAt: fixLater, StartedAt: &fixLater, LeaseOwner: "w-2", FencingToken: "tok-2", LeasedUntil: &leased},
	}
}

func fixQueued() *pulsetype.Attempt {
	return &pulsetype.Attempt{ID: "att-q", Number: 1, Status: pulsetype.StatusPending, LeaseState: pulsetype.LeaseQueued,
		CreatedAt: fixAt, NextAttemptAt: fixLater}
}

// fixEndpoint has every optional field set; fixMinimal only the required ones, defaults filled.
func fixEndpoint() *pulsetype.Endpoint {
	maxRetries, mult, conc := 5, 1.5, 4
	delay, maxDelay, timeout := pulsetype.Duration(1500*time.Millisecond), pulsetype.Duration(time.Hour), pulsetype.Duration(10*time.Second)
	expires := fixOverlap
	return &pulsetype.Endpoint{ConsumerGroup: "billing", URL: "https://hooks.example.com/in?a=1&b=<2>", Topics: []string{"payment.captured", "refund.*"},
		Delivery: pulsetype.AtLeastOnce, Ordered: true, Format: pulsetype.FormatCloudEvents, OffsetReset: pulsetype.OffsetEarliest,
		MaxRetries: &maxRetries, RetryDelay: &delay, RetryBackoffMultiplier: &mult, MaxRetryDelay: &maxDelay, Timeout: &timeout,
		MaxConcurrency: &conc, Headers: map[string]string{"Authorization": "Bearer s3cr3t", "X-Tenant": "t-1"},
		Secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", PreviousSecret: "whsec_b2xkLXNlY3JldC1iZWZvcmUtcm90YXRpb24=",
		PreviousSecretExpiresAt: &expires, InsecureSkipVerify: true, RateLimit: 2.5, DisableAfter: pulsetype.Duration(90 * time.Minute),
		State: pulsetype.EndpointDisabled, StateReason: pulsetype.ReasonGone, StateSince: &fixLater, CreatedAt: fixAt, UpdatedAt: fixLater,
		Incarnation: "inc-1"}
}

func fixMinimal() *pulsetype.Endpoint {
	e := &pulsetype.Endpoint{ConsumerGroup: "audit", URL: "http://127.0.0.1:9/hook", Topics: []string{"t"}, Delivery: pulsetype.AtMostOnce,
		Incarnation: "inc-2"}
	if err := e.Normalize(); err != nil {
		panic(err)
	}
	e.CreatedAt, e.UpdatedAt, e.State = fixAt, fixAt, pulsetype.EndpointActive
	return e
}

func (answerStore) endpoint(group string) (*pulsetype.Endpoint, error) {
	switch group {
	case "billing":
		return fixEndpoint(), nil
	case "audit":
		return fixMinimal(), nil
	case "down":
		return nil, fmt.Errorf("read endpoint: %w: server selection timeout\nsecond line", pulsetype.ErrUnavailable)
	}
	return nil, pulsetype.ErrNotFound
}

func (s answerStore) GetEndpoint(_ context.Context, group string) (*pulsetype.Endpoint, error) {
	return s.endpoint(group)
}

func (answerStore) ListEndpoints(context.Context) ([]*pulsetype.Endpoint, error) {
	return []*pulsetype.Endpoint{fixMinimal(), fixEndpoint()}, nil
}

// PutEndpoint stores nothing: it answers what it got with the fixed times, created unless the group is a
// fixture. Like package mongo's, it keeps a fixture's state and makes a new endpoint active.
func (s answerStore) PutEndpoint(_ context.Context, e *pulsetype.Endpoint) (*pulsetype.Endpoint, bool, error) {
	existing, err := s.endpoint(e.ConsumerGroup)
	out := *e
	out.CreatedAt, out.UpdatedAt = fixAt, fixLater
	out.State, out.StateReason, out.StateSince = pulsetype.EndpointActive, "", nil
	if err == nil {
		out.State, out.StateReason, out.StateSince = existing.State, existing.StateReason, existing.StateSince
	}
	return &out, err != nil, nil
}

func (answerStore) RotateSecret(_ context.Context, group, secret string, overlap time.Duration) (*pulsetype.Endpoint, error) {
	if group != "billing" {
		return nil, pulsetype.ErrNotFound
	}
	e := fixEndpoint()
	e.PreviousSecret, e.Secret, e.PreviousSecretExpiresAt = e.Secret, secret, nil
	if overlap > 0 {
		until := fixLater.Add(overlap)
		e.PreviousSecretExpiresAt = &until
	}
	return e, nil
}

func (s answerStore) SetEndpointState(_ context.Context, group string, state pulsetype.EndpointState) (*pulsetype.Endpoint, error) {
	e, err := s.endpoint(group)
	if err != nil {
		return nil, err
	}
	e.State, e.StateReason, e.StateSince = state, "", nil
	if state == pulsetype.EndpointPaused {
		e.StateReason, e.StateSince = pulsetype.ReasonPaused, &fixOverlap
	}
	return e, nil
}

func (answerStore) Publish(_ context.Context, events []*pulsetype.Event) ([]pulsetype.Published, error) {
	out := make([]pulsetype.Published, len(events))
	for i, e := range events {
		if e.ID == "conflict" {
			return nil, pulsetype.ErrIDConflict
		}
		e.CreatedAt = fixAt.Add(time.Duration(i) * time.Millisecond)
		out[i] = pulsetype.Published{Event: e, Existing: strings.HasPrefix(e.ID, "old")}
	}
	return out, nil
}

func (answerStore) GetEvent(_ context.Context, id string) (*pulsetype.Event, error) {
	switch id {
	case "evt-1":
		return fixEvent(), nil
	case "bare":
		return &pulsetype.Event{ID: "bare", Topic: "t", Data: json.RawMessage(`null`), CreatedAt: fixAt}, nil
	case "down":
		return nil, fmt.Errorf("find event: %w: connection refused\nstack", pulsetype.ErrUnavailable)
	case "broken":
		return nil, fmt.Errorf("decode event: unexpected <type> & more\nstack")
	}
	return nil, pulsetype.ErrNotFound
}

func (answerStore) DeliveriesOfEvent(_ context.Context, id string) ([]*pulsetype.Delivery, error) {
	if id != "evt-1" {
		return nil, nil
	}
	return []*pulsetype.Delivery{fixPending(), fixTerminal()}, nil
}

func (answerStore) AttemptsOf(_ context.Context, ids []string) (map[string][]*pulsetype.Attempt, error) {
	return map[string][]*pulsetype.Attempt{"dlv-pending": fixAttempts()}, nil
}

func (answerStore) GetDelivery(_ context.Context, id string) (*pulsetype.Delivery, []*pulsetype.Attempt, error) {
	switch id {
	case "dlv-pending":
		return fixPending(), fixAttempts(), nil
	case "dlv-queued":
		d := fixPending()
		d.ID, d.OrderingKey = "dlv-queued", ""
		return d, []*pulsetype.Attempt{fixQueued()}, nil
	case "dlv-failed":
		t := fixTerminal()
		a := fixAttempts()[0]
		a.Number = 3
		return t, []*pulsetype.Attempt{a}, nil
	case "dlv-cancelled":
		return fixCancelled(), nil, nil
	case "dlv-due": // audit: active, unordered, no rate limit; its attempt due since fixLater
		d := fixPending()
		d.ID, d.ConsumerGroup, d.OrderingKey = "dlv-due", "audit", ""
		return d, []*pulsetype.Attempt{fixQueued()}, nil
	}
	return nil, nil, pulsetype.ErrNotFound
}

func (answerStore) ListDeliveries(_ context.Context, f pulsetype.DeliveryFilter) ([]*pulsetype.Delivery, string, error) {
	switch {
	case f.After == "bogus":
		return nil, "", pulsetype.ErrBadCursor
	case f.ConsumerGroup == "none":
		return nil, "", nil
	}
	return []*pulsetype.Delivery{fixPending(), fixTerminal(), fixCancelled()}, "cursor-3", nil
}

func (answerStore) RetryDelivery(_ context.Context, id string) (int, error) {
	switch id {
	case "dlv-failed":
		return 4, nil
	case "dlv-pending":
		return 0, pulsetype.ErrNotTerminal
	case "dlv-unsubscribed":
		return 0, pulsetype.ErrNotSubscribed
	case "dlv-in-flight":
		return 0, pulsetype.ErrAttemptInFlight
	}
	return 0, pulsetype.ErrNotFound
}

func (answerStore) ReplayDeliveries(context.Context, pulsetype.ReplayParams) (int, error) {
	return 3, nil
}

func (answerStore) CancelDelivery(_ context.Context, id string) (pulsetype.CancelResult, error) {
	switch id {
	case "dlv-pending":
		return pulsetype.CancelResult{FinalAttempt: 2, InFlight: true}, nil
	case "dlv-failed":
		return pulsetype.CancelResult{}, fmt.Errorf("cancel %q: %w", id, pulsetype.ErrTerminal)
	}
	return pulsetype.CancelResult{}, pulsetype.ErrNotFound
}

func (answerStore) Stats(_ context.Context, groups []string) ([]*pulsetype.GroupStats, error) {
	p50 := int64(87)
	oldest := fixAt
	all := map[string]*pulsetype.GroupStats{
		"audit": {ConsumerGroup: "audit"},
		"billing": {ConsumerGroup: "billing", Pending: 12, OldestPendingAt: &oldest, OldestPendingAgeMs: 61_500, Succeeded1h: 340,
			Failed1h: 7, LatencyP50Ms: &p50, LatencySample: 347},
	}
	out := []*pulsetype.GroupStats{}
	for _, g := range groups {
		out = append(out, all[g])
	}
	return out, nil
}

func (answerStore) Activity(_ context.Context, group string) (*pulsetype.GroupActivity, error) {
	from := pulsetype.ActivityWindow(fixAt)
	a := &pulsetype.GroupActivity{ConsumerGroup: group, From: from, To: fixAt, Buckets: make([]pulsetype.ActivityCount, pulsetype.ActivityBuckets)}
	if group == "billing" {
		oldest := fixAt.Add(-time.Minute)
		a.Buckets[57], a.Buckets[59] = pulsetype.ActivityCount{Succeeded: 12, Failed: 1}, pulsetype.ActivityCount{Succeeded: 3}
		a.Pending, a.OldestPendingAt = 12, &oldest
	}
	return a, nil
}

func (st answerStore) ActivityAll(ctx context.Context) ([]*pulsetype.GroupActivity, error) {
	var out []*pulsetype.GroupActivity
	for _, g := range []string{"audit", "billing"} {
		a, err := st.Activity(ctx, g)
		if err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, nil
}

func (answerStore) LineHead(_ context.Context, line pulsetype.Line) (string, error) {
	return "dlv-pending", nil
}

func (answerStore) Ping(context.Context) error       { return nil }
func (answerStore) ProbeWrite(context.Context) error { return nil }

// answerCase is one request whose answer (status line and body, byte for byte) is pinned in
// testdata/answers/<name>.golden.
type answerCase struct {
	name, method, path, body string
	token                    string            // "-": none; "": the full token
	header                   map[string]string // set after the default Content-Type; "-" removes the header
}

var answerCases = []answerCase{
	{name: "healthz", method: "GET", path: "/healthz"},
	{name: "readyz", method: "GET", path: "/readyz"},
	{name: "publish-one", method: "POST", path: "/v1/events", body: `{"id":"new-1","topic":"payment.captured","data":{"a":"<&>"},"headers":{"k":"v"},"orderingKey":"o"}`},
	{name: "publish-again", method: "POST", path: "/v1/events", body: `{"id":"old-1","topic":"t","data":1}`},
	{name: "publish-array", method: "POST", path: "/v1/events", body: `[{"id":"new-1","topic":"t","data":1},{"id":"old-2","topic":"t","data":null}]`},
	{name: "publish-cloudevent", method: "POST", path: "/v1/events", body: `{"x":1}`,
		header: map[string]string{"Ce-Specversion": "1.0", "Ce-Id": "ce-1", "Ce-Type": "t", "Ce-Source": "/s", "Content-Type": "application/json"}},
	{name: "publish-bad-topic", method: "POST", path: "/v1/events", body: `[{"topic":"-x","data":1}]`},
	{name: "publish-unknown-field", method: "POST", path: "/v1/events", body: `{"topic":"t","data":1,"extra":true}`},
	{name: "publish-wrong-type", method: "POST", path: "/v1/events", body: `{"topic":"t","data":1,"headers":{"a":1}}`},
	{name: "publish-conflict", method: "POST", path: "/v1/events", body: `{"id":"conflict","topic":"t","data":1}`},
	{name: "publish-media-type", method: "POST", path: "/v1/events", body: `{}`, header: map[string]string{"Content-Type": "text/plain"}},
	{name: "event", method: "GET", path: "/v1/events/evt-1"},
	{name: "event-bare", method: "GET", path: "/v1/events/bare"},
	{name: "event-not-found", method: "GET", path: "/v1/events/nope"},
	{name: "event-unavailable", method: "GET", path: "/v1/events/down"},
	{name: "event-internal-error", method: "GET", path: "/v1/events/broken"},
	{name: "delivery-pending", method: "GET", path: "/v1/deliveries/dlv-pending"},
	{name: "delivery-queued", method: "GET", path: "/v1/deliveries/dlv-queued"},
	{name: "delivery-failed", method: "GET", path: "/v1/deliveries/dlv-failed"},
	{name: "delivery-cancelled", method: "GET", path: "/v1/deliveries/dlv-cancelled"},
	{name: "delivery-not-found", method: "GET", path: "/v1/deliveries/nope"},
	{name: "deliveries", method: "GET", path: "/v1/deliveries?consumerGroup=billing&limit=3"},
	{name: "deliveries-empty", method: "GET", path: "/v1/deliveries?consumerGroup=none"},
	{name: "deliveries-bad-status", method: "GET", path: "/v1/deliveries?status=done"},
	{name: "deliveries-bad-limit", method: "GET", path: "/v1/deliveries?limit=0"},
	{name: "deliveries-bad-cursor", method: "GET", path: "/v1/deliveries?after=bogus"},
	{name: "retry", method: "POST", path: "/v1/deliveries/dlv-failed/retry"},
	{name: "retry-not-terminal", method: "POST", path: "/v1/deliveries/dlv-pending/retry"},
	{name: "cancel", method: "POST", path: "/v1/deliveries/dlv-pending/cancel"},
	{name: "cancel-terminal", method: "POST", path: "/v1/deliveries/dlv-failed/cancel"},
	{name: "replay", method: "POST", path: "/v1/endpoints/billing/replay", body: `{"status":"error","from":"2025-03-01T00:00:00Z","to":"2025-03-02T00:00:00Z"}`},
	{name: "replay-bad-json", method: "POST", path: "/v1/endpoints/billing/replay", body: `{"status":1}`},
	{name: "replay-bad-window", method: "POST", path: "/v1/endpoints/billing/replay", body: `{"from":"2025-03-02T00:00:00Z","to":"2025-03-01T00:00:00Z"}`},
	{name: "endpoint", method: "GET", path: "/v1/endpoints/billing"},
	{name: "endpoint-minimal", method: "GET", path: "/v1/endpoints/audit"},
	{name: "endpoint-not-found", method: "GET", path: "/v1/endpoints/nope"},
	{name: "endpoint-unavailable", method: "GET", path: "/v1/endpoints/down"},
	{name: "endpoints", method: "GET", path: "/v1/endpoints"},
	{name: "put-endpoint-created", method: "PUT", path: "/v1/endpoints/fresh",
		body: `{"url":"https://h.example/x?a=1&b=2","topics":["t"],"retryDelay":1500,"maxRetryDelay":"2h","timeout":"5s","headers":{"X-Key":"<k&v>"},"secret":"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}`},
	{name: "put-endpoint-every-field", method: "PUT", path: "/v1/endpoints/billing",
		body: `{"consumerGroup":"billing","url":"https://h.example/x","topics":["a","b"],"delivery":"at-least-once","ordered":true,"format":"cloudevents",` +
			`"offsetReset":"earliest","maxRetries":0,"retryDelay":"0s","retryBackoffMultiplier":1,"maxRetryDelay":"1m","timeout":"1ms","maxConcurrency":1000,` +
			`"headers":{},"secret":"","insecureSkipVerify":false,"createdAt":"2020-01-01T00:00:00Z","updatedAt":"2020-01-01T00:00:00+02:00",` +
			`"previousSecretExpiresAt":"2031-05-06T07:08:09.123456Z"}`},
	{name: "put-endpoint-at-most-once", method: "PUT", path: "/v1/endpoints/fresh", body: `{"url":"https://h.example/","topics":["t"],"delivery":"at-most-once"}`},
	{name: "put-endpoint-unknown-field", method: "PUT", path: "/v1/endpoints/fresh", body: `{"url":"https://h.example/","topics":["t"],"retries":3}`},
	{name: "put-endpoint-wrong-type", method: "PUT", path: "/v1/endpoints/fresh", body: `{"url":"https://h.example/","topics":["t"],"maxRetries":"3"}`},
	{name: "put-endpoint-bad-duration", method: "PUT", path: "/v1/endpoints/fresh", body: `{"url":"https://h.example/","topics":["t"],"timeout":"soon"}`},
	{name: "put-endpoint-bool-duration", method: "PUT", path: "/v1/endpoints/fresh", body: `{"url":"https://h.example/","topics":["t"],"retryDelay":true}`},
	{name: "put-endpoint-bad-time", method: "PUT", path: "/v1/endpoints/fresh", body: `{"url":"https://h.example/","topics":["t"],"createdAt":"yesterday"}`},
	{name: "put-endpoint-two-values", method: "PUT", path: "/v1/endpoints/fresh", body: `{"url":"https://h.example/","topics":["t"]} {}`},
	{name: "put-endpoint-other-group", method: "PUT", path: "/v1/endpoints/fresh", body: `{"consumerGroup":"other","url":"https://h.example/","topics":["t"]}`},
	{name: "put-endpoint-bad-url", method: "PUT", path: "/v1/endpoints/fresh", body: `{"url":"ftp://u:p@h.example/","topics":["t"]}`},
	{name: "put-endpoint-placeholder", method: "PUT", path: "/v1/endpoints/fresh", body: `{"url":"https://h.example/","topics":["t"],"headers":{"A":"<redacted>"}}`},
	{name: "put-endpoint-not-json", method: "PUT", path: "/v1/endpoints/fresh", body: `url: x`},
	{name: "rotate", method: "POST", path: "/v1/endpoints/billing/rotate-secret", body: `{"secret":"whsec_bmV3LXNlY3JldC1vZi10aGUtcm90YXRpb24=","overlap":"2h"}`},
	{name: "rotate-no-overlap", method: "POST", path: "/v1/endpoints/billing/rotate-secret", body: `{"secret":"whsec_bmV3LXNlY3JldC1vZi10aGUtcm90YXRpb24=","overlap":0}`},
	{name: "rotate-bad-overlap", method: "POST", path: "/v1/endpoints/billing/rotate-secret", body: `{"overlap":"forever"}`},
	{name: "rotate-long-overlap", method: "POST", path: "/v1/endpoints/billing/rotate-secret", body: `{"overlap":"800h"}`},
	{name: "rotate-not-found", method: "POST", path: "/v1/endpoints/nope/rotate-secret", body: `{"secret":"whsec_bmV3LXNlY3JldC1vZi10aGUtcm90YXRpb24="}`},
	{name: "pause", method: "POST", path: "/v1/endpoints/audit/pause"},
	{name: "resume", method: "POST", path: "/v1/endpoints/billing/resume"},
	{name: "pause-not-found", method: "POST", path: "/v1/endpoints/nope/pause"},
	{name: "put-endpoint-state", method: "PUT", path: "/v1/endpoints/fresh",
		body: `{"url":"https://h.example/","topics":["t"],"rateLimit":0.5,"disableAfter":"10m","state":"paused","stateReason":"gone","stateSince":"2025-01-01T00:00:00Z"}`},
	{name: "put-endpoint-bad-rate", method: "PUT", path: "/v1/endpoints/fresh", body: `{"url":"https://h.example/","topics":["t"],"rateLimit":-1}`},
	{name: "put-endpoint-bad-disable-after", method: "PUT", path: "/v1/endpoints/fresh", body: `{"url":"https://h.example/","topics":["t"],"disableAfter":"1ms"}`},
	{name: "stats", method: "GET", path: "/v1/stats"},
	{name: "stats-one", method: "GET", path: "/v1/stats?consumerGroup=billing"},
	{name: "stats-not-found", method: "GET", path: "/v1/stats?consumerGroup=nope"},
	{name: "activity", method: "GET", path: "/v1/endpoints/billing/activity"},
	{name: "activity-empty", method: "GET", path: "/v1/endpoints/audit/activity"},
	{name: "activity-not-found", method: "GET", path: "/v1/endpoints/nope/activity"},
	{name: "activity-all", method: "GET", path: "/v1/activity"},
	{name: "delivery-due", method: "GET", path: "/v1/deliveries/dlv-due"},
	{name: "unauthorized", method: "GET", path: "/v1/stats", token: "-"},
	{name: "read-only-token", method: "POST", path: "/v1/deliveries/dlv-failed/retry", token: "tok-read"},
	{name: "no-route", method: "GET", path: "/v1/nothing"},
	{name: "method-not-allowed", method: "PATCH", path: "/v1/endpoints/billing"},
	{name: "publish-no-media-type", method: "POST", path: "/v1/events", body: `{"topic":"t","data":1}`, header: map[string]string{"Content-Type": "-"}},
	{name: "put-endpoint-no-media-type", method: "PUT", path: "/v1/endpoints/fresh", body: `{"url":"https://h.example/","topics":["t"]}`,
		header: map[string]string{"Content-Type": "-"}},
	{name: "rotate-text-plain", method: "POST", path: "/v1/endpoints/billing/rotate-secret", body: `{"overlap":"0s"}`,
		header: map[string]string{"Content-Type": "text/plain"}},
	{name: "pause-cross-site", method: "POST", path: "/v1/endpoints/billing/pause", header: map[string]string{"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"}},
	{name: "read-cross-site", method: "GET", path: "/v1/endpoints", header: map[string]string{"Sec-Fetch-Site": "cross-site"}},
	{name: "publish-cloudevent-control-character", method: "POST", path: "/v1/events", body: `{"specversion":"1.0","id":"ce-2","type":"t","source":"/s","subject":"a\r\nb"}`,
		header: map[string]string{"Content-Type": "application/cloudevents+json"}},
	// Every body refuses a member it has no field for, naming it (a typo must not fall back to a default):
	// the replay's "stauts" would otherwise replay every failed delivery of all time.
	{name: "replay-unknown-field", method: "POST", path: "/v1/endpoints/billing/replay", body: `{"stauts":"success","form":"2030-01-01T00:00:00Z"}`},
	{name: "replay-too-large", method: "POST", path: "/v1/endpoints/billing/replay", body: `{"status":"` + strings.Repeat("x", 70_000) + `"}`},
	{name: "rotate-unknown-field", method: "POST", path: "/v1/endpoints/billing/rotate-secret", body: `{"secert":"whsec_bmV3LXNlY3JldC1vZi10aGUtcm90YXRpb24="}`},
	{name: "retry-unknown-field", method: "POST", path: "/v1/deliveries/dlv-failed/retry", body: `{"force":true}`},
	{name: "retry-not-json", method: "POST", path: "/v1/deliveries/dlv-failed/retry", body: `force`},
	{name: "cancel-unknown-field", method: "POST", path: "/v1/deliveries/dlv-pending/cancel", body: `{"reason":"x"}`},
	{name: "cancel-empty-object", method: "POST", path: "/v1/deliveries/dlv-pending/cancel", body: `{}`},
	{name: "pause-unknown-field", method: "POST", path: "/v1/endpoints/audit/pause", body: `{"until":"2030-01-01T00:00:00Z"}`},
	{name: "resume-unknown-field", method: "POST", path: "/v1/endpoints/billing/resume", body: `{"now":true}`},
	{name: "delete-unknown-field", method: "DELETE", path: "/v1/endpoints/billing", body: `{"force":true}`},
	{name: "pause-too-large", method: "POST", path: "/v1/endpoints/audit/pause", body: `{"a":"` + strings.Repeat("x", 70_000) + `"}`},
	// An integral JSON number is an integer, whatever its notation; a fraction is not.
	{name: "put-endpoint-integral-number", method: "PUT", path: "/v1/endpoints/fresh", body: `{"url":"https://h.example/","topics":["t"],"maxRetries":1e2,"maxConcurrency":4.0}`},
	{name: "put-endpoint-fractional-number", method: "PUT", path: "/v1/endpoints/fresh", body: `{"url":"https://h.example/","topics":["t"],"maxRetries":1.5}`},
	{name: "put-endpoint-max-retry-delay-below-delay", method: "PUT", path: "/v1/endpoints/fresh", body: `{"url":"https://h.example/","topics":["t"],"retryDelay":"24h","maxRetryDelay":"0s"}`},
	{name: "deliveries-broken-cursor", method: "GET", path: "/v1/deliveries?after=%%%zz"},
	{name: "deliveries-broken-parameter", method: "GET", path: "/v1/deliveries?topic=%zz&limit=2"},
	{name: "publish-cloudevent-specversion", method: "POST", path: "/v1/events", body: `{}`,
		header: map[string]string{"Ce-Specversion": "2.0", "Ce-Id": "ce-1", "Ce-Type": "t", "Ce-Source": "/s"}},
}

// The API's answers are pinned byte for byte, field order and timestamp format included: answers are a
// contract with clients that compare, parse with fixed patterns, or diff them.
func TestAnswersGolden(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(httpapi.New(answerStore{}, nopNotifier{}, httpapi.Options{APITokens: []string{"tok-full"},
		ReadTokens: []string{"tok-read"}, MaxBodyBytes: 1 << 20, Logger: zerolog.Nop()}).Handler())
	t.Cleanup(srv.Close)
	dir := filepath.Join("testdata", "answers")
	if *updateAnswers {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range answerCases {
		req := apiRequest(t, c.method, srv.URL+c.path, c.body, c.token)
		for k, v := range c.header {
			if v == "-" {
				req.Header.Del(k)
				continue
			}
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		got := append([]byte(fmt.Sprintf("%d %s\n", resp.StatusCode, resp.Header.Get("Content-Type"))), body...)
		path := filepath.Join(dir, c.name+".golden")
		if *updateAnswers {
			if err := os.WriteFile(path, got, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s %s answered\n%s\nwant (%s)\n%s", c.method, c.path, got, path, want)
		}
	}
}

// apiRequest is a request of the golden and walk tests: token "" is the full token's, "-" none, any other
// that token; a body is sent with its documented media type, application/json, which a case's own headers
// may replace.
func apiRequest(t *testing.T, method, url, body, token string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	switch token {
	case "":
		req.Header.Set("Authorization", "Bearer tok-full")
	case "-":
	default:
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	return req
}
