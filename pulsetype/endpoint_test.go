package pulsetype_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// validEndpoint returns a fresh endpoint that normalizes without error; mod changes it for one case.
func validEndpoint(mod func(e *pulsetype.Endpoint)) *pulsetype.Endpoint {
	e := &pulsetype.Endpoint{
		ConsumerGroup: "billing",
		URL:           "http://127.0.0.1:9000/hook",
		Topics:        []string{"payment.captured"},
	}
	if mod != nil {
		mod(e)
	}
	return e
}

func intPtr(n int) *int                               { return &n }
func floatPtr(f float64) *float64                     { return &f }
func durationPtr(d time.Duration) *pulsetype.Duration { v := pulsetype.Duration(d); return &v }

func TestEndpointNormalizeFillsDefaults(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name           string
		mod            func(e *pulsetype.Endpoint)
		wantDelivery   pulsetype.DeliveryMode
		wantMaxRetries int
	}{
		{name: "at-least-once by default", wantDelivery: pulsetype.AtLeastOnce, wantMaxRetries: pulsetype.DefaultMaxRetries},
		{name: "at-most-once gets no retries", mod: func(e *pulsetype.Endpoint) { e.Delivery = pulsetype.AtMostOnce },
			wantDelivery: pulsetype.AtMostOnce, wantMaxRetries: 0},
		{name: "delivery mode is case-insensitive", mod: func(e *pulsetype.Endpoint) { e.Delivery = "AT-MOST-ONCE" },
			wantDelivery: pulsetype.AtMostOnce, wantMaxRetries: 0},
		{name: "at-most-once with explicit maxRetries 0", mod: func(e *pulsetype.Endpoint) {
			e.Delivery, e.MaxRetries = pulsetype.AtMostOnce, intPtr(0)
		}, wantDelivery: pulsetype.AtMostOnce, wantMaxRetries: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := validEndpoint(tt.mod)
			if err := e.Normalize(); err != nil {
				t.Fatalf("Normalize() = %v, want nil", err)
			}
			if e.Delivery != tt.wantDelivery {
				t.Errorf("Delivery = %q, want %q", e.Delivery, tt.wantDelivery)
			}
			if e.OffsetReset != pulsetype.OffsetLatest {
				t.Errorf("OffsetReset = %q, want %q", e.OffsetReset, pulsetype.OffsetLatest)
			}
			if e.MaxRetries == nil || *e.MaxRetries != tt.wantMaxRetries {
				t.Errorf("MaxRetries = %v, want %d", e.MaxRetries, tt.wantMaxRetries)
			}
			durations := []struct {
				name string
				got  *pulsetype.Duration
				want time.Duration
			}{
				{"RetryDelay", e.RetryDelay, pulsetype.DefaultRetryDelay},
				{"MaxRetryDelay", e.MaxRetryDelay, pulsetype.DefaultMaxRetryDelay},
				{"Timeout", e.Timeout, pulsetype.DefaultTimeout},
			}
			for _, d := range durations {
				if d.got == nil || time.Duration(*d.got) != d.want {
					t.Errorf("%s = %v, want %s", d.name, d.got, d.want)
				}
			}
			if e.RetryBackoffMultiplier == nil || *e.RetryBackoffMultiplier != pulsetype.DefaultRetryBackoffMultiplier {
				t.Errorf("RetryBackoffMultiplier = %v, want %v", e.RetryBackoffMultiplier, pulsetype.DefaultRetryBackoffMultiplier)
			}
			if e.MaxConcurrency == nil || *e.MaxConcurrency != pulsetype.DefaultMaxConcurrency {
				t.Errorf("MaxConcurrency = %v, want %d", e.MaxConcurrency, pulsetype.DefaultMaxConcurrency)
			}
			p := e.Policy()
			if p.AtMostOnce != (tt.wantDelivery == pulsetype.AtMostOnce) || p.MaxRetries != tt.wantMaxRetries ||
				p.Delay != pulsetype.DefaultRetryDelay || p.MaxDelay != pulsetype.DefaultMaxRetryDelay ||
				p.Multiplier != pulsetype.DefaultRetryBackoffMultiplier {
				t.Errorf("Policy() = %+v, does not reflect the normalized endpoint", p)
			}
		})
	}
}

func TestEndpointNormalizeKeepsExplicitValues(t *testing.T) {
	t.Parallel()
	e := validEndpoint(func(e *pulsetype.Endpoint) {
		e.OffsetReset = pulsetype.OffsetEarliest
		e.MaxRetries = intPtr(3)
		e.RetryDelay = durationPtr(250 * time.Millisecond)
		e.RetryBackoffMultiplier = floatPtr(1.5)
		e.MaxRetryDelay = durationPtr(time.Minute)
		e.Timeout = durationPtr(5 * time.Second)
		e.MaxConcurrency = intPtr(4)
		e.Secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
		e.Headers = map[string]string{"X-Team": "payments"}
	})
	if err := e.Normalize(); err != nil {
		t.Fatalf("Normalize() = %v, want nil", err)
	}
	if e.OffsetReset != pulsetype.OffsetEarliest || *e.MaxRetries != 3 || time.Duration(*e.RetryDelay) != 250*time.Millisecond ||
		*e.RetryBackoffMultiplier != 1.5 || time.Duration(*e.MaxRetryDelay) != time.Minute ||
		time.Duration(*e.Timeout) != 5*time.Second || *e.MaxConcurrency != 4 {
		t.Errorf("Normalize changed explicit values: %+v", e)
	}
}

// Without maxRetryDelay, a retryDelay above DefaultMaxRetryDelay is its own cap: the default never undercuts
// the delay it caps.
func TestEndpointNormalizeMaxRetryDelayDefaultsToRetryDelay(t *testing.T) {
	t.Parallel()
	e := validEndpoint(func(e *pulsetype.Endpoint) { e.RetryDelay = durationPtr(2 * time.Hour) })
	if err := e.Normalize(); err != nil {
		t.Fatalf("Normalize() = %v, want nil", err)
	}
	if got := time.Duration(*e.MaxRetryDelay); got != 2*time.Hour {
		t.Errorf("maxRetryDelay = %s, want the retryDelay 2h0m0s", got)
	}
}

func TestEndpointNormalizeRejects(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		mod       func(e *pulsetype.Endpoint)
		wantField string
	}{
		{"at-most-once with retries", func(e *pulsetype.Endpoint) { e.Delivery, e.MaxRetries = pulsetype.AtMostOnce, intPtr(3) }, "maxRetries"},
		{"url scheme ftp", func(e *pulsetype.Endpoint) { e.URL = "ftp://example.com/hook" }, "url"},
		{"url without host", func(e *pulsetype.Endpoint) { e.URL = "http:///hook" }, "url"},
		{"url with only a port", func(e *pulsetype.Endpoint) { e.URL = "http://:8080/hook" }, "url"},
		{"url relative", func(e *pulsetype.Endpoint) { e.URL = "/hook" }, "url"},
		{"url with credentials", func(e *pulsetype.Endpoint) { e.URL = "https://user:pw@example.com/hook" }, "url"},
		{"url with a space", func(e *pulsetype.Endpoint) { e.URL = "http://example.com/h?q=a b" }, "url"},
		{"url with angle brackets", func(e *pulsetype.Endpoint) { e.URL = "http://example.com/h?q=<script>" }, "url"},
		{"url with a quote", func(e *pulsetype.Endpoint) { e.URL = `http://example.com/h?r="x` }, "url"},
		{"url empty", func(e *pulsetype.Endpoint) { e.URL = "" }, "url"},
		{"topics empty", func(e *pulsetype.Endpoint) { e.Topics = nil }, "topics"},
		{"topic with a space", func(e *pulsetype.Endpoint) { e.Topics = []string{"payment captured"} }, "topics"},
		{"topic starting with a dot", func(e *pulsetype.Endpoint) { e.Topics = []string{".payment"} }, "topics"},
		{"topic listed twice", func(e *pulsetype.Endpoint) { e.Topics = []string{"a", "a"} }, "topics"},
		// An ordered group's lines are per listed topic: a pattern would name none.
		{"pattern in an ordered group", func(e *pulsetype.Endpoint) { e.Ordered, e.Topics = true, []string{"order.created", "order.*"} }, "topics"},
		// Entries that can never match: pulse.x topics are reserved and the sidecar's are three segments;
		// a pattern's topics must fit in 200 characters.
		{"pattern of the reserved two-segment topics", func(e *pulsetype.Endpoint) { e.Topics = []string{"pulse.*"} }, "topics"},
		{"reserved topic the sidecar never publishes", func(e *pulsetype.Endpoint) { e.Topics = []string{"pulse.x"} }, "topics"},
		{"reserved pattern one segment too deep", func(e *pulsetype.Endpoint) { e.Topics = []string{"pulse.endpoint.disabled.*"} }, "topics"},
		{"pattern whose topics cannot fit", func(e *pulsetype.Endpoint) { e.Topics = []string{strings.Repeat("a", 199) + ".*"} }, "topics"},
		{"secret without whsec_", func(e *pulsetype.Endpoint) { e.Secret = "s3cr3t" }, "secret"},
		{"consumer group empty", func(e *pulsetype.Endpoint) { e.ConsumerGroup = "" }, "consumerGroup"},
		{"consumer group with a slash", func(e *pulsetype.Endpoint) { e.ConsumerGroup = "a/b" }, "consumerGroup"},
		{"delivery unknown", func(e *pulsetype.Endpoint) { e.Delivery = "exactly-once" }, "delivery"},
		{"offsetReset unknown", func(e *pulsetype.Endpoint) { e.OffsetReset = "middle" }, "offsetReset"},
		{"maxRetries negative", func(e *pulsetype.Endpoint) { e.MaxRetries = intPtr(-1) }, "maxRetries"},
		// A cap below the first delay would make every retry sooner than retryDelay (0s: at once).
		{"maxRetryDelay below retryDelay", func(e *pulsetype.Endpoint) {
			e.RetryDelay, e.MaxRetryDelay = durationPtr(24*time.Hour), durationPtr(0)
		}, "maxRetryDelay"},
		{"maxRetries above 100", func(e *pulsetype.Endpoint) { e.MaxRetries = intPtr(101) }, "maxRetries"},
		{"retryDelay negative", func(e *pulsetype.Endpoint) { e.RetryDelay = durationPtr(-time.Second) }, "retryDelay"},
		{"timeout zero", func(e *pulsetype.Endpoint) { e.Timeout = durationPtr(0) }, "timeout"},
		{"multiplier below 1", func(e *pulsetype.Endpoint) { e.RetryBackoffMultiplier = floatPtr(0.5) }, "retryBackoffMultiplier"},
		{"maxRetryDuration below 1s", func(e *pulsetype.Endpoint) { e.MaxRetryDuration = pulsetype.Duration(time.Millisecond) }, "maxRetryDuration"},
		{"maxRetryDuration above 30 days", func(e *pulsetype.Endpoint) {
			e.MaxRetryDuration = pulsetype.Duration(pulsetype.MaxRetryDurationLimit + time.Second)
		}, "maxRetryDuration"},
		{"backlogAlertAfter below 1s", func(e *pulsetype.Endpoint) { e.BacklogAlertAfter = pulsetype.Duration(time.Millisecond) }, "backlogAlertAfter"},
		{"maxRetryDuration negative", func(e *pulsetype.Endpoint) { e.MaxRetryDuration = pulsetype.Duration(-time.Hour) }, "maxRetryDuration"},
		{"maxConcurrency zero", func(e *pulsetype.Endpoint) { e.MaxConcurrency = intPtr(0) }, "maxConcurrency"},
		{"header name with a colon", func(e *pulsetype.Endpoint) { e.Headers = map[string]string{"X-A:": "v"} }, "headers"},
		{"header value with a newline", func(e *pulsetype.Endpoint) { e.Headers = map[string]string{"X-A": "v\r\nX-B: w"} }, "headers"},
		{"header value is the redaction placeholder", func(e *pulsetype.Endpoint) {
			e.Headers = map[string]string{"Authorization": pulsetype.RedactedHeaderValue}
		}, "headers"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := validEndpoint(tt.mod).Normalize()
			var fe *pulsetype.FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("Normalize() = %v, want a *FieldError for %q", err, tt.wantField)
			}
			if fe.Field != tt.wantField {
				t.Errorf("FieldError.Field = %q (%v), want %q", fe.Field, err, tt.wantField)
			}
			if fe.Message == "" {
				t.Errorf("FieldError.Message is empty")
			}
		})
	}
}

func TestEndpointRedacted(t *testing.T) {
	t.Parallel()
	tests := []struct{ secret, want string }{
		{"", ""},
		{"whsec_ab", "whsec_…"},
		{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_…LaSw"},
	}
	for _, tt := range tests {
		e := pulsetype.Endpoint{Secret: tt.secret}
		if got := e.Redacted().Secret; got != tt.want {
			t.Errorf("Redacted() of %q = %q, want %q", tt.secret, got, tt.want)
		}
		if e.Secret != tt.secret {
			t.Errorf("Redacted() changed the original secret to %q", e.Secret)
		}
	}
}

// Header values are credentials as often as not: a redacted copy keeps the names and hides every value.
func TestEndpointRedactedHidesHeaderValues(t *testing.T) {
	t.Parallel()
	e := pulsetype.Endpoint{Headers: map[string]string{"Authorization": "Bearer tok-123", "X-Env": "prod"}}
	got := e.Redacted().Headers
	want := map[string]string{"Authorization": pulsetype.RedactedHeaderValue, "X-Env": pulsetype.RedactedHeaderValue}
	if len(got) != len(want) || got["Authorization"] != want["Authorization"] || got["X-Env"] != want["X-Env"] {
		t.Errorf("Redacted().Headers = %v, want %v", got, want)
	}
	if e.Headers["Authorization"] != "Bearer tok-123" {
		t.Errorf("Redacted() changed the original headers to %v", e.Headers)
	}
}

// Header names differing only in case would both be sent as one header (the value alternating between
// attempts): Normalize refuses them, naming both keys.
func TestEndpointHeaderNamesDifferingInCase(t *testing.T) {
	t.Parallel()
	e := validEndpoint(func(e *pulsetype.Endpoint) {
		e.Headers = map[string]string{"X-Tenant": "a", "x-tenant": "b", "X-Env": "prod"}
	})
	err := e.Normalize()
	var fe *pulsetype.FieldError
	if !errors.As(err, &fe) || fe.Field != "headers" {
		t.Fatalf("Normalize() = %v, want a headers FieldError", err)
	}
	if want := `"X-Tenant" and "x-tenant" differ only in case`; !strings.Contains(fe.Message, want) {
		t.Errorf("message %q lacks %q", fe.Message, want)
	}
}

func TestEndpointErrorsHideURLCredentials(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{"https://admin:s3cr3t@example.com/hook", "ftp://admin:s3cr3t@example.com/", "https://admin:s3cr3t@exa mple.com/%zz"} {
		e := &pulsetype.Endpoint{ConsumerGroup: "g", URL: raw, Topics: []string{"t"}}
		err := e.Normalize()
		if err == nil || strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("Normalize(%q) = %v, want an error without the password", raw, err)
		}
	}
}

func TestEndpointHeaderNamesThatCannotBeStored(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"X.Tenant", "$where"} {
		e := &pulsetype.Endpoint{ConsumerGroup: "g", URL: "https://example.com/", Topics: []string{"t"}, Headers: map[string]string{name: "v"}}
		var fe *pulsetype.FieldError
		if err := e.Normalize(); !errors.As(err, &fe) || fe.Field != "headers" || !strings.Contains(fe.Message, name) {
			t.Errorf("Normalize with header %q = %v, want a headers error naming it", name, err)
		}
	}
}

// One validator serves the endpoint's PUT (Normalize) and the webhook request (webhook.Send).
func TestValidHeaderNameAndValue(t *testing.T) {
	t.Parallel()
	names := map[string]bool{"X-Api-Key": true, "a!#$%&'*+-.^_`|~z09": true, "": false, "X Key": false, "X:Key": false,
		"Ключ": false, "X\tKey": false, "(x)": false}
	for name, want := range names {
		if got := pulsetype.ValidHeaderName(name); got != want {
			t.Errorf("ValidHeaderName(%q) = %v, want %v", name, got, want)
		}
	}
	values := map[string]bool{"": true, "Bearer abc": true, "tab\there": true, "ünïcode": true, "a\nb": false,
		"a\rb": false, "nul\x00": false, "del\x7f": false}
	for v, want := range values {
		if got := pulsetype.ValidHeaderValue(v); got != want {
			t.Errorf("ValidHeaderValue(%q) = %v, want %v", v, got, want)
		}
	}
}

// TestEndpointWants checks the rule of which groups get an event: the topic must be one the group
// subscribes to, and with offsetReset latest the event must not be older than the registration (an event
// published at the registration's instant is wanted).
func TestEndpointWants(t *testing.T) {
	t.Parallel()
	registered := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	cases := []struct {
		name   string
		offset pulsetype.OffsetReset
		topic  string
		at     time.Time
		want   bool
	}{
		{"latest, after registration", pulsetype.OffsetLatest, "payment.captured", registered.Add(time.Millisecond), true},
		{"latest, at registration", pulsetype.OffsetLatest, "payment.captured", registered, true},
		{"latest, before registration", pulsetype.OffsetLatest, "payment.captured", registered.Add(-time.Millisecond), false},
		{"earliest, before registration", pulsetype.OffsetEarliest, "payment.captured", registered.Add(-time.Hour), true},
		{"earliest, other topic", pulsetype.OffsetEarliest, "payment.refunded", registered.Add(time.Hour), false},
		{"latest, other topic", pulsetype.OffsetLatest, "payment.refunded", registered.Add(time.Hour), false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ep := validEndpoint(func(e *pulsetype.Endpoint) { e.OffsetReset, e.CreatedAt = c.offset, registered })
			ev := &pulsetype.Event{ID: "e1", Topic: c.topic, CreatedAt: c.at}
			if got := ep.Wants(ev); got != c.want {
				t.Errorf("Wants(topic %s at %v) = %v, want %v", c.topic, c.at, got, c.want)
			}
			if got, want := ep.Subscribes(c.topic), c.topic == "payment.captured"; got != want {
				t.Errorf("Subscribes(%s) = %v, want %v", c.topic, got, want)
			}
		})
	}
}

// Entries that can match are accepted next to the refused ones: the sidecar's topics and their patterns,
// "PULSE.x" (topics are case-sensitive: only the lowercase prefix is reserved), and a pattern whose
// shortest topic is exactly 200 characters; the refusal of "pulse.*" names the patterns to use.
func TestTopicEntriesThatCanMatch(t *testing.T) {
	t.Parallel()
	for _, topics := range [][]string{{"pulse.endpoint.*", "pulse.delivery.failed", "pulse.backlog.high"}, {"PULSE.x", "Pulse.*"},
		{strings.Repeat("a", 198) + ".*"}} {
		e := &pulsetype.Endpoint{ConsumerGroup: "g", URL: "http://example.com/hook", Topics: topics}
		if err := e.Normalize(); err != nil {
			t.Errorf("topics %q refused: %v", topics, err)
		}
	}
	e := &pulsetype.Endpoint{ConsumerGroup: "g", URL: "http://example.com/hook", Topics: []string{"pulse.*"}}
	err := e.Normalize()
	if err == nil || !strings.Contains(err.Error(), `"pulse.*"`) || !strings.Contains(err.Error(), "pulse.endpoint.*, pulse.delivery.*, pulse.backlog.*") {
		t.Fatalf("pulse.* refused with %v, want its name and the patterns that match", err)
	}
}

// format takes the three webhook formats, and the error for another names all three.
func TestEndpointFormats(t *testing.T) {
	t.Parallel()
	for _, f := range []pulsetype.WebhookFormat{pulsetype.FormatEnvelope, pulsetype.FormatCloudEvents, pulsetype.FormatCloudEventsStructured} {
		if err := validEndpoint(func(e *pulsetype.Endpoint) { e.Format = f }).Normalize(); err != nil {
			t.Errorf("format %q: %v", f, err)
		}
	}
	err := validEndpoint(func(e *pulsetype.Endpoint) { e.Format = "structured" }).Normalize()
	if want := `format: must be "envelope", "cloudevents" or "cloudevents-structured", got "structured"`; err == nil || err.Error() != want {
		t.Errorf("format structured: %v, want %s", err, want)
	}
}
