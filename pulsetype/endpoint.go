package pulsetype

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"maps"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// DeliveryMode is an endpoint's delivery guarantee: AtLeastOnce or AtMostOnce (docs/delivery.md, "Guarantees").
type DeliveryMode string

// Delivery modes of an endpoint.
const (
	AtLeastOnce DeliveryMode = "at-least-once"
	AtMostOnce  DeliveryMode = "at-most-once"
)

// WebhookFormat is the shape of an endpoint's webhook request: FormatEnvelope, FormatCloudEvents or
// FormatCloudEventsStructured.
type WebhookFormat string

// Formats of the webhook request of an endpoint.
const (
	// FormatEnvelope is the default: the body is webhook.Envelope, Content-Type application/json.
	FormatEnvelope WebhookFormat = "envelope"
	// FormatCloudEvents is a CloudEvents 1.0 binary-mode request: ce-* headers and the data as the body (see
	// webhook.Body).
	FormatCloudEvents WebhookFormat = "cloudevents"
	// FormatCloudEventsStructured is a CloudEvents 1.0 structured-mode request: the event as one JSON object
	// (application/cloudevents+json), every attribute a member, untouched by any header encoding (see
	// webhook.Body). It is the mode for receivers whose SDK does not percent-decode ce-* headers.
	FormatCloudEventsStructured WebhookFormat = "cloudevents-structured"
)

// OffsetReset is which events a newly registered consumer group receives: OffsetLatest or OffsetEarliest.
type OffsetReset string

// Offset resets of a consumer group.
const (
	OffsetLatest   OffsetReset = "latest"   // events published after registration
	OffsetEarliest OffsetReset = "earliest" // every event still retained
)

// Endpoint defaults, as documented in docs/api.md.
const (
	DefaultMaxRetries             = 8
	DefaultRetryDelay             = time.Second
	DefaultRetryBackoffMultiplier = 2.0
	DefaultMaxRetryDelay          = time.Hour
	DefaultTimeout                = 30 * time.Second
	DefaultMaxConcurrency         = 16
)

// MaxTimeout bounds an endpoint's timeout.
const MaxTimeout = time.Hour

// MaxRetryDurationLimit bounds an endpoint's maxRetryDuration (30 days).
const MaxRetryDurationLimit = 30 * 24 * time.Hour

// MaxTopicsPerEndpoint bounds the topics one consumer group subscribes to.
const MaxTopicsPerEndpoint = 100

// maxTopicLen is the longest topic (topicPattern).
const maxTopicLen = 200

var (
	topicPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$`)
	groupPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$`)
)

// ValidTopic reports whether s matches ^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$ (the contract's topic rule).
func ValidTopic(s string) bool { return topicPattern.MatchString(s) }

// ValidConsumerGroup reports whether s is a usable consumer group name: 1–100 characters of
// [A-Za-z0-9._-], starting with a letter or digit.
func ValidConsumerGroup(s string) bool { return groupPattern.MatchString(s) }

// Duration is an endpoint setting's duration (the API writes it as a Go duration string, "1m30s").
type Duration time.Duration

// Endpoint is a consumer group's webhook registration: where its events go and how they are retried.
// Pointer fields are optional; Normalize fills their defaults.
type Endpoint struct {
	ConsumerGroup string
	URL           string
	// Topics are the topics the group subscribes to: exact topics, or patterns ending in ".*", which match
	// the topic before it and one more dot-separated segment ("payment.*" matches "payment.captured", not
	// "payment" or "payment.card.captured"). See Subscribes.
	Topics []string
	// Filter, when set, is a CEL expression over event (see Filter) that must hold for the group to receive an
	// event, evaluated when the delivery would be created (Wants), never later. Normalize compiles it.
	Filter   string
	filter   *Filter // Filter compiled, set by Normalize or CompileFilter
	Delivery DeliveryMode
	Ordered  bool
	// Format is FormatEnvelope (the default), FormatCloudEvents or FormatCloudEventsStructured.
	Format                 WebhookFormat
	OffsetReset            OffsetReset
	MaxRetries             *int
	RetryDelay             *Duration
	RetryBackoffMultiplier *float64
	MaxRetryDelay          *Duration
	Timeout                *Duration
	MaxConcurrency         *int
	Headers                map[string]string
	Secret                 string
	// PreviousSecret is the secret a rotation replaced (POST .../rotate-secret): POSTs are signed with it too, after
	// Secret, until PreviousSecretExpiresAt. Reads never show it; a PUT body cannot set it.
	PreviousSecret string
	// PreviousSecretExpiresAt ends the overlap of a rotation: from then on only Secret signs. Shown in reads,
	// ignored in a PUT body (like createdAt).
	PreviousSecretExpiresAt *time.Time
	InsecureSkipVerify      bool
	// RateLimit is the most POSTs per second this endpoint gets from each replica (decimals allowed); 0 has
	// no limit and is left out of reads.
	RateLimit float64
	// MaxRetryDuration is the retry window: no attempt is scheduled later than this after the delivery's first
	// attempt started, and a delivery whose next attempt would be ends error/retry_window_exceeded
	// (RetryPolicy.Decide). 0 has no window and is left out of reads; else 1s to MaxRetryDurationLimit.
	MaxRetryDuration Duration
	// BacklogAlertAfter publishes pulse.backlog.high once the group's oldest pending delivery is older than
	// this, and again (high false) when it is no longer; 0 never does and is left out of reads; else 1s to
	// MaxRetryDurationLimit.
	BacklogAlertAfter Duration
	// DisableAfter disables the endpoint (reason failing) once its attempts have all failed for this long;
	// 0 never does and is left out of reads.
	DisableAfter Duration
	// State, StateReason and StateSince say whether the endpoint is POSTed to, why not and since when; reads
	// show StateReason and StateSince only when it is not active. Only pause, resume and the sidecar (410
	// Gone, disableAfter) change them: a PUT body's values are ignored and a PUT keeps the state.
	State       EndpointState
	StateReason StateReason
	StateSince  *time.Time
	CreatedAt   time.Time
	UpdatedAt   time.Time
	// Incarnation is a UUIDv7 given when the consumer group is created (not when it is replaced): a group
	// deleted and registered again is a new subscription, and nothing pending from the earlier one reaches it.
	// Empty for groups registered before incarnations existed.
	Incarnation string
}

// FieldError names the field of an endpoint or event that is invalid and why.
type FieldError struct {
	Field   string
	Message string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Message }

// Normalize fills defaults and validates the endpoint. It returns a *FieldError naming the first bad field.
func (e *Endpoint) Normalize() error {
	if !ValidConsumerGroup(e.ConsumerGroup) {
		return &FieldError{"consumerGroup", "must be 1-100 characters of letters, digits, '.', '_' or '-', starting with a letter or digit"}
	}
	u, err := url.Parse(e.URL)
	if e.URL == "" {
		return &FieldError{"url", "is required"}
	}
	badPort := false
	if err == nil && u.Port() != "" {
		p, perr := strconv.Atoi(u.Port())
		badPort = perr != nil || p < 1 || p > 65535
	}
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Hostname() == "" || u.User != nil || badPort {
		return &FieldError{"url", fmt.Sprintf("must be an absolute http or https URL with a host and no credentials, got %q", redactURL(e.URL))}
	}
	if i := strings.IndexFunc(e.URL, notInURI); i >= 0 {
		return &FieldError{"url", fmt.Sprintf("must not contain %q unescaped (RFC 3986: percent-encode it)", e.URL[i:i+1])}
	}
	if len(e.Topics) == 0 {
		return &FieldError{"topics", "must list at least one topic"}
	}
	if len(e.Topics) > MaxTopicsPerEndpoint {
		return &FieldError{"topics", fmt.Sprintf("at most %d topics", MaxTopicsPerEndpoint)}
	}
	seen := map[string]bool{}
	for _, t := range e.Topics {
		if !ValidTopicPattern(t) {
			return &FieldError{"topics", fmt.Sprintf("%q does not match ^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$, optionally followed by .*", t)}
		}
		if why := unreachableTopic(t); why != "" {
			return &FieldError{"topics", why}
		}
		if seen[t] {
			return &FieldError{"topics", fmt.Sprintf("%q is listed twice", t)}
		}
		if e.Ordered && strings.HasSuffix(t, ".*") {
			// An ordered group's lines are (topic, ordering key): the dispatcher claims the heads of each listed
			// topic's lines, so a pattern would name no line and its deliveries would never be claimed.
			return &FieldError{"topics", fmt.Sprintf("%q is a pattern: an ordered group lists exact topics (each topic's events are ordered per ordering key)", t)}
		}
		seen[t] = true
	}
	if err := e.CompileFilter(); err != nil {
		return err
	}
	e.Delivery = DeliveryMode(strings.ToLower(string(e.Delivery)))
	if err := oneOf("delivery", &e.Delivery, AtLeastOnce, AtMostOnce); err != nil {
		return err
	}
	if err := oneOf("format", &e.Format, FormatEnvelope, FormatCloudEvents, FormatCloudEventsStructured); err != nil {
		return err
	}
	if err := oneOf("offsetReset", &e.OffsetReset, OffsetLatest, OffsetEarliest); err != nil {
		return err
	}
	if e.MaxRetries == nil {
		n := DefaultMaxRetries
		if e.Delivery == AtMostOnce {
			n = 0
		}
		e.MaxRetries = &n
	}
	if *e.MaxRetries < 0 || *e.MaxRetries > 100 {
		return &FieldError{"maxRetries", "must be between 0 and 100"}
	}
	if e.Delivery == AtMostOnce && *e.MaxRetries != 0 {
		return &FieldError{"maxRetries", "must be 0 with at-most-once delivery"}
	}
	if err := fillDuration(&e.RetryDelay, DefaultRetryDelay, "retryDelay", 0, 24*time.Hour); err != nil {
		return err
	}
	// maxRetryDelay caps the delays that grow from retryDelay, so a cap below the first delay would make
	// every retry come sooner than asked (0s: at once): refused. Left out, it is DefaultMaxRetryDelay, or
	// retryDelay when that is longer.
	maxDefault := max(DefaultMaxRetryDelay, time.Duration(*e.RetryDelay))
	if err := fillDuration(&e.MaxRetryDelay, maxDefault, "maxRetryDelay", 0, 7*24*time.Hour); err != nil {
		return err
	}
	if *e.MaxRetryDelay < *e.RetryDelay {
		return &FieldError{"maxRetryDelay", fmt.Sprintf("must be at least retryDelay (%s), got %s", time.Duration(*e.RetryDelay), time.Duration(*e.MaxRetryDelay))}
	}
	if err := fillDuration(&e.Timeout, DefaultTimeout, "timeout", time.Millisecond, MaxTimeout); err != nil {
		return err
	}
	if e.RetryBackoffMultiplier == nil {
		m := DefaultRetryBackoffMultiplier
		e.RetryBackoffMultiplier = &m
	}
	if *e.RetryBackoffMultiplier < 1 || *e.RetryBackoffMultiplier > 100 {
		return &FieldError{"retryBackoffMultiplier", "must be between 1 and 100"}
	}
	if e.MaxConcurrency == nil {
		n := DefaultMaxConcurrency
		e.MaxConcurrency = &n
	}
	if *e.MaxConcurrency < 1 || *e.MaxConcurrency > 1000 {
		return &FieldError{"maxConcurrency", "must be between 1 and 1000"}
	}
	if e.RateLimit < 0 || e.RateLimit > MaxRateLimit {
		return &FieldError{"rateLimit", fmt.Sprintf("must be between 0 (no limit) and %d POSTs per second", MaxRateLimit)}
	}
	if d := time.Duration(e.MaxRetryDuration); d != 0 && (d < time.Second || d > MaxRetryDurationLimit) {
		return &FieldError{"maxRetryDuration", fmt.Sprintf("must be 0 (no window) or between 1s and %s", MaxRetryDurationLimit)}
	}
	if d := time.Duration(e.BacklogAlertAfter); d != 0 && (d < time.Second || d > MaxRetryDurationLimit) {
		return &FieldError{"backlogAlertAfter", fmt.Sprintf("must be 0 (never) or between 1s and %s", MaxRetryDurationLimit)}
	}
	if d := time.Duration(e.DisableAfter); d != 0 && (d < time.Second || d > MaxDisableAfter) {
		return &FieldError{"disableAfter", fmt.Sprintf("must be 0 (never) or between 1s and %s", MaxDisableAfter)}
	}
	if err := checkHeaders(e.Headers); err != nil {
		return err
	}
	if e.Secret != "" {
		if err := CheckSecret(e.Secret); err != nil {
			return err
		}
	}
	return nil
}

// CheckSecret validates a signing secret: "whsec_" followed by the standard base64 of at least 16 bytes
// (Standard Webhooks). It returns a *FieldError for field "secret" that does not quote the value.
func CheckSecret(secret string) error {
	key, ok := strings.CutPrefix(secret, "whsec_")
	if raw, err := base64.StdEncoding.DecodeString(key); !ok || err != nil || len(raw) < 16 {
		return &FieldError{"secret", "must be whsec_ followed by the base64 of at least 16 random bytes (Standard Webhooks)"}
	}
	return nil
}

// Secret rotation (POST /v1/endpoints/{consumerGroup}/rotate-secret).
const (
	// DefaultSecretOverlap is how long the replaced secret keeps signing beside the new one.
	DefaultSecretOverlap = 24 * time.Hour
	// MaxSecretOverlap bounds the overlap of a rotation.
	MaxSecretOverlap = 30 * 24 * time.Hour
	// generatedSecretBytes is the length of a generated secret's key, in bytes.
	generatedSecretBytes = 32
)

// GenerateSecret returns a new signing secret: "whsec_" and the standard base64 of 32 bytes from
// crypto/rand.
func GenerateSecret() string {
	key := make([]byte, generatedSecretBytes)
	_, _ = rand.Read(key) // never fails: since Go 1.24 a failing system source crashes the program instead
	return "whsec_" + base64.StdEncoding.EncodeToString(key)
}

// PreviousSecretAt returns the secret that signs beside Secret at time now: PreviousSecret while now is
// before PreviousSecretExpiresAt, and "" after it, when there is none, when it equals Secret, or when the
// endpoint has no Secret (unsigned).
func (e *Endpoint) PreviousSecretAt(now time.Time) string {
	if e.Secret == "" || e.PreviousSecret == "" || e.PreviousSecret == e.Secret ||
		e.PreviousSecretExpiresAt == nil || !now.Before(*e.PreviousSecretExpiresAt) {
		return ""
	}
	return e.PreviousSecret
}

// RedactedHeaderValue is what reads show in place of every endpoint header value. A PUT that sends it back as
// a value is refused, so a GET-modify-PUT cannot overwrite a credential with the placeholder.
const RedactedHeaderValue = "<redacted>"

// checkHeaders validates endpoint headers: RFC 9110 token names, no two names equal but for case (HTTP
// header names are case-insensitive, so only one of them could be sent), no control characters in values,
// and no value equal to RedactedHeaderValue. It never quotes a value: values are often credentials.
func checkHeaders(h map[string]string) error {
	names := slices.Sorted(maps.Keys(h)) // deterministic: the same body always names the same pair
	byFold := make(map[string]string, len(h))
	for _, k := range names {
		if len(k) > maxHeaderName || !ValidHeaderName(k) {
			return &FieldError{"headers", fmt.Sprintf("%q is not a valid header name (RFC 9110 token)", k)}
		}
		if strings.Contains(k, ".") || strings.HasPrefix(k, "$") {
			return &FieldError{"headers", fmt.Sprintf("%q: a header name with '.' or a leading '$' cannot be stored as a database field name", k)}
		}
		if prev, dup := byFold[strings.ToLower(k)]; dup {
			return &FieldError{"headers", fmt.Sprintf("%q and %q differ only in case; header names are case-insensitive, keep one", prev, k)}
		}
		byFold[strings.ToLower(k)] = k
		v := h[k]
		if !ValidHeaderValue(v) {
			return &FieldError{"headers", fmt.Sprintf("value of %q contains a control character", k)}
		}
		if v == RedactedHeaderValue {
			return &FieldError{"headers", fmt.Sprintf("value of %q is the placeholder %s that reads return; send the real value", k, RedactedHeaderValue)}
		}
	}
	return nil
}

// maxHeaderName is the longest endpoint header name, in bytes.
const maxHeaderName = 256

// ValidHeaderName reports whether name is an RFC 9110 token, as an HTTP header name must be.
func ValidHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// ValidHeaderValue reports whether v holds no control character other than horizontal tab, as Go's HTTP
// transport requires of a header value.
func ValidHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

func fillDuration(p **Duration, def time.Duration, field string, min, max time.Duration) error {
	if *p == nil {
		d := Duration(def)
		*p = &d
	}
	if v := time.Duration(**p); v < min || v > max {
		return &FieldError{field, fmt.Sprintf("must be between %s and %s", min, max)}
	}
	return nil
}

// Redacted returns a copy fit for reads and logs: the secret shows only its prefix and last 4 characters
// ("whsec_…abcd"), the previous secret of a rotation is removed, and every header value is
// RedactedHeaderValue (the names stay). The original is not changed.
func (e Endpoint) Redacted() Endpoint {
	if e.Headers != nil {
		h := make(map[string]string, len(e.Headers))
		for k := range e.Headers {
			h[k] = RedactedHeaderValue
		}
		e.Headers = h
	}
	if len(e.Secret) >= 30 {
		e.Secret = "whsec_…" + e.Secret[len(e.Secret)-4:]
	} else if e.Secret != "" {
		e.Secret = "whsec_…"
	}
	e.PreviousSecret = ""
	return e
}

// Policy returns the endpoint's retry policy. Call it on a normalized endpoint.
func (e *Endpoint) Policy() RetryPolicy {
	return RetryPolicy{
		AtMostOnce:  e.Delivery == AtMostOnce,
		MaxRetries:  *e.MaxRetries,
		Delay:       time.Duration(*e.RetryDelay),
		Multiplier:  *e.RetryBackoffMultiplier,
		MaxDelay:    time.Duration(*e.MaxRetryDelay),
		MaxDuration: time.Duration(e.MaxRetryDuration),
	}
}

// Subscribes reports whether the consumer group receives events of topic: one of its Topics is topic, or is
// a pattern "p.*" and topic is p, a dot and one more segment without a dot. It is the half of Wants that
// still holds for a delivery made already: the other half (the filter, the offset) was decided when it was
// made, for the registration its incarnation names.
func (e *Endpoint) Subscribes(topic string) bool {
	return slices.ContainsFunc(e.Topics, func(t string) bool { return TopicMatches(t, topic) })
}

// TopicMatches reports whether the subscription entry pattern (a topic, or one ending in ".*") matches topic.
func TopicMatches(pattern, topic string) bool {
	prefix, ok := strings.CutSuffix(pattern, "*")
	if !ok || !strings.HasSuffix(prefix, ".") {
		return pattern == topic
	}
	rest, ok := strings.CutPrefix(topic, prefix)
	return ok && rest != "" && !strings.Contains(rest, ".")
}

// TopicPatternOf returns the pattern "p.*" that matches topic ("payment.*" for "payment.captured"), or ""
// when topic has no dot. Stores look subscriptions up by a topic and this pattern.
func TopicPatternOf(topic string) string {
	i := strings.LastIndexByte(topic, '.')
	if i <= 0 || i == len(topic)-1 {
		return ""
	}
	return topic[:i] + ".*"
}

// ValidTopicPattern reports whether s is a valid subscription entry: a valid topic, or a valid topic
// followed by ".*".
func ValidTopicPattern(s string) bool {
	if p, ok := strings.CutSuffix(s, ".*"); ok {
		return ValidTopic(p)
	}
	return ValidTopic(s)
}

// CompileFilter compiles e.Filter (see pulsetype.CompileFilter) for Wants; an empty Filter has none. It
// returns a *FieldError for field "filter". Wants compiles an uncompiled filter itself, without keeping it.
func (e *Endpoint) CompileFilter() error { return e.CompileFilterWith(nil) }

// CompileFilterWith is CompileFilter through cache (nil: none): stores keep one cache, so that a fan-out,
// which reads the registrations again, does not compile their filters again.
func (e *Endpoint) CompileFilterWith(cache *FilterCache) error {
	if e.Filter == "" {
		e.filter = nil
		return nil
	}
	if e.filter != nil && e.filter.src == e.Filter {
		return nil
	}
	compile := CompileFilter
	if cache != nil {
		compile = cache.Compile
	}
	f, err := compile(e.Filter)
	if err != nil {
		return err
	}
	e.filter = f
	return nil
}

// Wants reports whether the consumer group receives event ev (see WantsInput).
func (e *Endpoint) Wants(ev *Event) bool { return e.WantsInput(InputOf(ev)) }

// WantsInput reports whether the consumer group receives the event in holds: Decide's answer, with a
// filter whose evaluation failed taken as false.
func (e *Endpoint) WantsInput(in *EventInput) bool {
	ok, err := e.Decide(in)
	return ok && err == nil
}

// Decide reports whether the consumer group receives the event in holds: it subscribes to the event's
// topic (Subscribes), unless its OffsetReset is OffsetEarliest the event was published (CreatedAt) no
// earlier than the group registered (e.CreatedAt), the event is not an operational event about the group
// itself (SubjectGroupHeader), and its Filter, if any, holds for the event (a filter that does not compile
// holds for none). It is the one rule of which groups get an event: fan-out, backfill and the head of an
// ordered line all ask it, with one input per event shared by the groups. It returns a *FilterError when
// the filter's evaluation failed (Filter.Eval): the fan-out then ends the group's delivery of the event as
// CodeFilterError.
func (e *Endpoint) Decide(in *EventInput) (bool, error) {
	ev := in.Event
	if (e.OffsetReset != OffsetEarliest && ev.CreatedAt.Before(e.CreatedAt)) || aboutItself(ev, e.ConsumerGroup) {
		return false, nil
	}
	return e.selects(in)
}

// Selects reports whether the group's current rule of content takes the event in holds: it subscribes to
// the event's topic (an exact topic or a pattern, Subscribes) and its Filter, if any, holds for the event (a
// filter that does not compile, or whose evaluation fails, holds for none). Decide adds the checks that
// only apply when a delivery is created; a retry or replay of an existing delivery asks Selects, so that it
// never re-opens a delivery the group's topics or filter refuse now.
func (e *Endpoint) Selects(in *EventInput) bool {
	ok, err := e.selects(in)
	return ok && err == nil
}

func (e *Endpoint) selects(in *EventInput) (bool, error) {
	if !e.Subscribes(in.Event.Topic) {
		return false, nil
	}
	if e.Filter == "" {
		return true, nil
	}
	f := e.filter
	if f == nil || f.src != e.Filter {
		var err error
		if f, err = CompileFilter(e.Filter); err != nil {
			return false, nil
		}
	}
	return f.Eval(in)
}

var eventIDPattern = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)

// ValidEventID reports whether a client-chosen event id is 1–128 characters of [A-Za-z0-9._:-], other than
// "." and "..", which a URL path cannot carry as a segment (RFC 3986 §5.2.4 removes them, encoded or not, in
// browsers), so GET /v1/events/{id} could not reach them.
func ValidEventID(s string) bool { return s != "." && s != ".." && eventIDPattern.MatchString(s) }

// redactURL returns raw with any userinfo (user and password) replaced, for error messages and logs: a URL
// that does not parse is shown only by its scheme.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		if scheme, _, ok := strings.Cut(raw, "://"); ok && !strings.Contains(scheme, "@") {
			return scheme + "://…"
		}
		return "…"
	}
	if u.User != nil {
		u.User = url.User("…")
	}
	return u.String()
}

// notInURI reports whether r may not stand unescaped in a URI (RFC 3986 section 2): controls, space, non-ASCII
// and the characters the RFC excludes, " < > \ ^ ` { | }. Go's url.Parse accepts some of them, and the
// request line would then carry them as they are.
func notInURI(r rune) bool {
	return r <= ' ' || r >= 0x7f || strings.ContainsRune("\"<>\\^`{|}", r)
}

// oneOf sets an empty *v to def and returns a *FieldError naming field and the allowed values unless *v is
// def or one of alts.
func oneOf[T ~string](field string, v *T, def T, alts ...T) error {
	if *v == "" {
		*v = def
	}
	all := append([]T{def}, alts...)
	if slices.Contains(all, *v) {
		return nil
	}
	quoted := make([]string, len(all))
	for i, a := range all {
		quoted[i] = fmt.Sprintf("%q", a)
	}
	list := strings.Join(quoted[:len(quoted)-1], ", ") + " or " + quoted[len(quoted)-1]
	return &FieldError{field, fmt.Sprintf("must be %s, got %q", list, *v)}
}
