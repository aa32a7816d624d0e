package pulsetype_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// filterEvent is a payment event with data, headers and an ordering key.
func filterEvent() *pulsetype.Event {
	return &pulsetype.Event{ID: "e1", Topic: "payment.captured", Data: json.RawMessage(`{"amount":250,"currency":"EUR","items":[{"sku":"a"},{"sku":"b"}],"customer":{"tier":"gold"}}`),
		Headers: map[string]string{"source": "checkout"}, OrderingKey: "cust-7", CreatedAt: time.Unix(1000, 0)}
}

// A filter includes the events it holds for and excludes the others; a field the event lacks, a type
// that does not fit, or data that is null makes it false, not an error.
func TestFilterMatch(t *testing.T) {
	t.Parallel()
	tests := []struct {
		filter string
		want   bool
	}{
		{`event.data.amount > 100`, true},
		{`event.data.amount > 1000`, false},
		{`event.data.amount == 250`, true},
		{`event.topic == "payment.captured" && event.headers.source == "checkout"`, true},
		{`event.orderingKey.startsWith("cust-")`, true},
		{`event.data.customer.tier in ["gold", "platinum"]`, true},
		{`event.data.items.exists(i, i.sku == "b")`, true},
		{`event.data.items.size() == 3`, false},
		{`has(event.data.refund)`, false},
		{`!has(event.data.refund)`, true},
		{`event.data.refund.amount > 0`, false},                  // no such field
		{`!(event.data.refund.amount > 0)`, false},               // an error stays an error under !: false, not true
		{`event.data.currency > 100`, false},                     // a string compared with a number
		{`event.headers.missing == "x"`, false},                  // a header the event lacks
		{`event.data.amount > 100 || event.data.nope > 1`, true}, // CEL's || is commutative over errors
		{`event.data.nope == 150 || true`, true},                 // ... so a missing field does not make it false
	}
	for _, tt := range tests {
		t.Run(tt.filter, func(t *testing.T) {
			t.Parallel()
			ep := validEndpoint(func(e *pulsetype.Endpoint) { e.Topics, e.Filter = []string{"payment.captured"}, tt.filter })
			if err := ep.Normalize(); err != nil {
				t.Fatalf("Normalize(filter %q) = %v", tt.filter, err)
			}
			if got := ep.Wants(filterEvent()); got != tt.want {
				t.Fatalf("Wants with filter %q = %v, want %v", tt.filter, got, tt.want)
			}
		})
	}
	// Null data and no data: every field of event.data is missing.
	for _, data := range []string{`null`, ``} {
		ev := filterEvent()
		ev.Data = json.RawMessage(data)
		ep := validEndpoint(func(e *pulsetype.Endpoint) {
			e.Topics, e.Filter = []string{"payment.captured"}, `event.data.amount > 1`
		})
		if err := ep.Normalize(); err != nil {
			t.Fatal(err)
		}
		if ep.Wants(ev) {
			t.Errorf("Wants with data %q = true, want false", data)
		}
	}
}

// The filter is one more condition of the one rule: the topic and the offset still decide first, and an
// endpoint whose filter was never compiled (read from a store) decides the same.
func TestFilterInWants(t *testing.T) {
	t.Parallel()
	ep := &pulsetype.Endpoint{Topics: []string{"payment.captured"}, Filter: `event.data.amount > 100`, CreatedAt: time.Unix(500, 0)}
	ev := filterEvent()
	if !ep.Wants(ev) {
		t.Fatal("an uncompiled filter that holds: Wants = false, want true")
	}
	other := filterEvent()
	other.Topic = "payment.refunded"
	if ep.Wants(other) {
		t.Fatal("another topic: Wants = true, want false")
	}
	early := filterEvent()
	early.CreatedAt = time.Unix(10, 0)
	if ep.Wants(early) {
		t.Fatal("an event published before the group registered: Wants = true, want false")
	}
	bad := &pulsetype.Endpoint{Topics: []string{"payment.captured"}, Filter: `event.data.amount >`}
	if bad.Wants(ev) {
		t.Fatal("a filter that does not compile: Wants = true, want false")
	}
}

// A filter that does not compile, is not boolean, is too long or may cost too much is refused at Normalize
// with a *FieldError for "filter" that names the problem.
func TestFilterRejects(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, filter, want string }{
		{"syntax", `event.data.amount >`, "not a valid CEL expression"},
		{"unknown variable", `payment.amount > 1`, "undeclared reference to 'payment'"},
		{"not boolean", `event.data.amount + 1`, "must be a boolean expression"},
		{"topic compared with a number", `event.topic == 1`, "no matching overload"},
		{"header compared with a number", `event.headers.source == 2`, "no matching overload"},
		{"field event lacks", `event.nope == 1`, "undefined field 'nope'"},
		{"a string", `"yes"`, "must be a boolean expression, got string"},
		{"too long", strings.Repeat("true && ", 600) + "true", "at most 4096 bytes"},
		{"nested iteration", `event.data.items.all(i, event.data.items.all(j, i.sku != j.sku || i == j))`, "may cost up to"},
		// The result type is the typed check's: the untyped environment reads every field of event as dyn.
		{"a header is a string", `event.headers.source`, "must be a boolean expression, got string"},
		{"the topic is a string", `event.topic`, "must be a boolean expression, got string"},
		{"the ordering key is a string", `event.orderingKey`, "must be a boolean expression, got string"},
		{"a pattern from the event", `event.data.s.matches(event.data.p)`, "pattern as a string literal"},
		{"a pattern from the topic, global form", `matches(event.data.s, event.topic)`, "pattern as a string literal"},
		{"a pattern built from literals", `event.data.s.matches("a" + "b")`, "pattern as a string literal"},
		{"a pattern's program too large", `event.data.s.matches('[ab]{1000}c')`, "regex program size"},
		{"an invalid pattern", `event.data.s.matches('(')`, "not a valid CEL expression"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ep := validEndpoint(func(e *pulsetype.Endpoint) { e.Filter = tt.filter })
			err := ep.Normalize()
			var fe *pulsetype.FieldError
			if !errors.As(err, &fe) || fe.Field != "filter" || !strings.Contains(fe.Message, tt.want) {
				t.Fatalf("Normalize(filter %q) = %v, want a filter error containing %q", tt.filter, err, tt.want)
			}
		})
	}
}

// An evaluation that passes MaxFilterCost stops with a *FilterError (and Wants is false): a one-level
// iteration passes the check at PUT, and an event larger than FilterSizeHint is bounded when it runs.
func TestFilterCostLimitAtRun(t *testing.T) {
	t.Parallel()
	ep := validEndpoint(func(e *pulsetype.Endpoint) {
		e.Topics, e.Filter = []string{"t"}, `event.data.items.all(i, i == "x")`
	})
	if err := ep.Normalize(); err != nil {
		t.Fatalf("Normalize = %v, want a one-level iteration accepted", err)
	}
	small := make([]string, 10)
	for i := range small {
		small[i] = "x"
	}
	data, _ := json.Marshal(map[string]any{"items": small})
	if !ep.Wants(&pulsetype.Event{Topic: "t", Data: data}) {
		t.Fatal("a small event: Wants = false, want true")
	}
	big := make([]string, 200_000)
	for i := range big {
		big[i] = "x"
	}
	data, _ = json.Marshal(map[string]any{"items": big})
	ev := &pulsetype.Event{Topic: "t", Data: data}
	if ep.Wants(ev) {
		t.Fatal("an event whose evaluation passes MaxFilterCost: Wants = true, want false")
	}
	ok, err := ep.Decide(pulsetype.InputOf(ev))
	var fe *pulsetype.FilterError
	if ok || !errors.As(err, &fe) || !strings.Contains(fe.Message, "cost limit") {
		t.Fatalf("Decide of an event past MaxFilterCost = %v, %v; want a *FilterError naming the cost limit", ok, err)
	}
}

// A matches() call is charged before it runs, its input's size times its pattern's program: over a 1 MB
// string it stops the evaluation with a *FilterError naming the sizes, without running the expression.
func TestFilterMatchesChargedBeforeItRuns(t *testing.T) {
	t.Parallel()
	f, err := pulsetype.CompileFilter(`event.data.s.matches('[ab]{30}c')`)
	if err != nil {
		t.Fatalf("CompileFilter = %v, want a pattern of 33 instructions accepted", err)
	}
	short, _ := json.Marshal(map[string]any{"s": strings.Repeat("a", 30) + "c"})
	if ok, err := f.Eval(pulsetype.InputOf(&pulsetype.Event{Topic: "t", Data: short})); !ok || err != nil {
		t.Fatalf("Eval over 31 bytes = %v, %v; want true", ok, err)
	}
	for _, global := range []string{`event.data.s.matches('[ab]{30}c')`, `matches(event.data.s, '[ab]{30}c')`} {
		f, err := pulsetype.CompileFilter(global)
		if err != nil {
			t.Fatal(err)
		}
		long, _ := json.Marshal(map[string]any{"s": strings.Repeat("a", 1_000_000)})
		ok, err := f.Eval(pulsetype.InputOf(&pulsetype.Event{Topic: "t", Data: long}))
		var fe *pulsetype.FilterError
		if ok || !errors.As(err, &fe) || !strings.Contains(fe.Message, "matches() over 1000000 bytes with a pattern of 33 instructions") {
			t.Fatalf("%s over 1 MB = %v, %v; want a *FilterError naming the input and the pattern", global, ok, err)
		}
	}
}

// A filter of type dyn whose result for an event is not a boolean is a *FilterError naming the type and
// the value, never a silent false; a boolean from the data holds as it is.
func TestFilterNotBooleanAtRun(t *testing.T) {
	t.Parallel()
	f, err := pulsetype.CompileFilter(`event.data.flag`)
	if err != nil {
		t.Fatalf("CompileFilter(event.data.flag) = %v, want dyn accepted", err)
	}
	for data, want := range map[string]string{`{"flag":"yes"}`: `string "yes"`, `{"flag":3}`: `double "3"`, `{"flag":{"a":1}}`: "map"} {
		ok, err := f.Eval(pulsetype.InputOf(&pulsetype.Event{Topic: "t", Data: json.RawMessage(data)}))
		var fe *pulsetype.FilterError
		if ok || !errors.As(err, &fe) || !strings.Contains(fe.Message, want) || !strings.Contains(fe.Message, "not a boolean") {
			t.Errorf("Eval over %s = %v, %v; want a *FilterError naming %s, not a boolean", data, ok, err, want)
		}
	}
	for data, want := range map[string]bool{`{"flag":true}`: true, `{"flag":false}`: false, `{}`: false} {
		if ok, err := f.Eval(pulsetype.InputOf(&pulsetype.Event{Topic: "t", Data: json.RawMessage(data)})); ok != want || err != nil {
			t.Errorf("Eval over %s = %v, %v; want %v, nil (a missing field is false)", data, ok, err, want)
		}
	}
}

// An evaluation past its deadline ends with a *FilterError naming it: the caller does not wait for it.
// Not parallel: it shortens the deadline of every evaluation.
func TestFilterDeadline(t *testing.T) {
	defer pulsetype.SetFilterTimeout(time.Nanosecond)()
	f, err := pulsetype.CompileFilter(`event.data.items.all(i, i == "x")`)
	if err != nil {
		t.Fatal(err)
	}
	items := make([]string, 5000)
	for i := range items {
		items[i] = "x"
	}
	data, _ := json.Marshal(map[string]any{"items": items})
	ok, err := f.Eval(pulsetype.InputOf(&pulsetype.Event{Topic: "t", Data: data}))
	var fe *pulsetype.FilterError
	if ok || !errors.As(err, &fe) || !strings.Contains(fe.Message, "deadline of 1ns") {
		t.Fatalf("Eval past its deadline = %v, %v; want a *FilterError naming the deadline", ok, err)
	}
}

// A topics entry ending in ".*" matches one more dot-separated segment, nothing else.
func TestTopicPatterns(t *testing.T) {
	t.Parallel()
	tests := []struct {
		pattern, topic string
		want           bool
	}{
		{"payment.*", "payment.captured", true},
		{"payment.*", "payment.refunded", true},
		{"payment.*", "payment", false},
		{"payment.*", "payment.", false},
		{"payment.*", "payment.card.captured", false},
		{"payment.*", "paymentX.captured", false},
		{"payment.card.*", "payment.card.captured", true},
		{"payment.captured", "payment.captured", true},
		{"payment.captured", "payment.capturedX", false},
	}
	for _, tt := range tests {
		if got := pulsetype.TopicMatches(tt.pattern, tt.topic); got != tt.want {
			t.Errorf("TopicMatches(%q, %q) = %v, want %v", tt.pattern, tt.topic, got, tt.want)
		}
		if tt.want && pulsetype.TopicPatternOf(tt.topic) != tt.pattern && tt.pattern != tt.topic {
			t.Errorf("TopicPatternOf(%q) = %q, want %q (the store looks subscriptions up by it)", tt.topic, pulsetype.TopicPatternOf(tt.topic), tt.pattern)
		}
	}
	for _, ok := range []string{"payment.*", "a.b.*", "payment"} {
		if !pulsetype.ValidTopicPattern(ok) {
			t.Errorf("ValidTopicPattern(%q) = false, want true", ok)
		}
	}
	for _, bad := range []string{"*", ".*", "payment*", "payment.*.x", "pay*ment", "payment.**"} {
		if pulsetype.ValidTopicPattern(bad) {
			t.Errorf("ValidTopicPattern(%q) = true, want false", bad)
		}
		if pulsetype.ValidTopic(bad) {
			t.Errorf("ValidTopic(%q) = true: an event could be published to a pattern", bad)
		}
	}
}

// A number beyond a double's range in the data (1e400) reads as +Inf in a filter, and the event's other
// fields stay visible: one such number does not make every filter over the data false.
func TestFilterSeesAnOutOfRangeNumberAsInfinity(t *testing.T) {
	t.Parallel()
	ev := &pulsetype.Event{ID: "e1", Topic: "t", Data: json.RawMessage(`{"big":1e400,"small":-1e400,"n":2,"items":[1e999]}`)}
	for src, want := range map[string]bool{`event.data.n == 2`: true, `event.data.big > 1e308`: true, `event.data.small < -1e308`: true,
		`event.data.items[0] > 1e308`: true, `event.data.big < 0`: false} {
		f, err := pulsetype.CompileFilter(src)
		if err != nil {
			t.Fatalf("CompileFilter(%s): %v", src, err)
		}
		if got := f.Match(pulsetype.InputOf(ev)); got != want {
			t.Errorf("%s = %v, want %v", src, got, want)
		}
	}
}
