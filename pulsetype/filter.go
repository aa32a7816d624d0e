package pulsetype

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/cost"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/ext"
)

// Filter limits (docs/delivery.md, "Filters").
const (
	// MaxFilterLength bounds an endpoint's filter expression, in bytes.
	MaxFilterLength = 4096
	// MaxFilterCost is the most one evaluation of a filter may cost, in CEL cost units (about one per
	// operation, a tenth of a byte's for string functions): evaluation stops there and the filter is false.
	MaxFilterCost = 100_000
	// FilterSizeHint is the size, in bytes or elements, that the check at PUT assumes for every string, list
	// and map of an event when it estimates a filter's worst cost: an expression whose estimate passes
	// MaxFilterCost is refused. Larger values of an event are bounded by MaxFilterCost when it runs.
	FilterSizeHint = 1024
)

// Filter is a compiled CEL expression over the variable event, a map of topic (string), data (the event's
// JSON data), headers (map of string to string) and orderingKey (string). It is immutable and safe for
// concurrent use.
type Filter struct {
	src string
	prg cel.Program
}

// filterEnv is the one CEL environment of filters, built once: CEL's standard library, numbers compared
// across int, uint and double (JSON numbers are doubles: event.data.amount > 100 compares a double with
// an int), and event declared as a map of string to dyn.
var filterEnv = sync.OnceValues(func() (*cel.Env, error) {
	return cel.NewEnv(cel.Variable("event", cel.MapType(cel.StringType, cel.DynType)), cel.CrossTypeNumericComparisons(true))
})

// filterFields is the event as the type check of CompileFilter declares it (filterCheckEnv): topic and
// orderingKey strings, headers a map of string to string, data dyn (any JSON).
type filterFields struct {
	Topic       string            `cel:"topic"`
	OrderingKey string            `cel:"orderingKey"`
	Headers     map[string]string `cel:"headers"`
	Data        any               `cel:"data"`
}

// filterCheckEnv is the environment CompileFilter checks types in, built once: event declared with its
// typed fields (filterFields), so that what the type checker can see is refused at PUT (event.topic == 1,
// no matching overload for string == int; event.tpoic, an undefined field) instead of a filter that is
// always false. Expressions run in filterEnv, over the event as a map: only the check is typed.
var filterCheckEnv = sync.OnceValues(func() (*cel.Env, error) {
	return cel.NewEnv(ext.NativeTypes(reflect.TypeFor[filterFields](), ext.ParseStructTags(true)),
		cel.Variable("event", cel.ObjectType("pulsetype.filterFields")), cel.CrossTypeNumericComparisons(true))
})

// CompileFilter parses and checks src: CEL syntax and types (with event's fields typed, filterCheckEnv), a boolean (or dyn) result, at most
// MaxFilterLength bytes, and an estimated worst cost (every value of the event at most FilterSizeHint long)
// within MaxFilterCost. It returns a *FieldError for field "filter" naming the problem.
func CompileFilter(src string) (*Filter, error) {
	if len(src) > MaxFilterLength {
		return nil, &FieldError{"filter", fmt.Sprintf("at most %d bytes, got %d", MaxFilterLength, len(src))}
	}
	env, err := filterEnv()
	if err != nil {
		return nil, fmt.Errorf("filter environment: %w", err)
	}
	ast, iss := env.Compile(src)
	if iss.Err() != nil {
		return nil, &FieldError{"filter", "is not a valid CEL expression over event: " + strings.ReplaceAll(iss.Err().Error(), "\n", " ")}
	}
	checkEnv, err := filterCheckEnv()
	if err != nil {
		return nil, fmt.Errorf("filter check environment: %w", err)
	}
	if _, iss := checkEnv.Compile(src); iss.Err() != nil {
		return nil, &FieldError{"filter", "does not type-check over event (topic, orderingKey: string; headers: map of string to string; data: any JSON): " +
			strings.ReplaceAll(iss.Err().Error(), "\n", " ")}
	}
	if t := ast.OutputType(); !t.IsExactType(types.BoolType) && !t.IsExactType(types.DynType) {
		return nil, &FieldError{"filter", fmt.Sprintf("must be a boolean expression, got %s", t)}
	}
	est, err := env.EstimateCost(ast, sizeHint{})
	if err != nil {
		return nil, &FieldError{"filter", "its cost cannot be estimated: " + err.Error()}
	}
	if est.Max > MaxFilterCost {
		return nil, &FieldError{"filter", fmt.Sprintf("may cost up to %d per event (values of %d bytes or elements), more than the limit %d: "+
			"iterate over less of the event", est.Max, FilterSizeHint, MaxFilterCost)}
	}
	prg, err := env.Program(ast, cel.CostLimit(MaxFilterCost), cel.EvalOptions(cel.OptOptimize))
	if err != nil {
		return nil, &FieldError{"filter", err.Error()}
	}
	return &Filter{src: src, prg: prg}, nil
}

// String returns the filter's source.
func (f *Filter) String() string { return f.src }

// Match reports whether the filter holds for the event in: only a result true holds. A field the event lacks
// (no such key), a type that does not fit (a string compared with a number) or an evaluation past
// MaxFilterCost makes it false, never an error: the filter decides which groups get an event, and an event
// is data. It is safe for concurrent use when in is not shared.
func (f *Filter) Match(in *EventInput) bool {
	out, _, err := f.prg.Eval(in.vars())
	return err == nil && out == types.True
}

// sizeHint is the cost estimator of CompileFilter: every value reachable from event is at most
// FilterSizeHint long.
type sizeHint struct{}

func (sizeHint) EstimateSize(n cost.AstNode) *cost.SizeEstimate {
	if p := n.Path(); len(p) > 0 && p[0] == "event" {
		return &cost.SizeEstimate{Min: 0, Max: FilterSizeHint}
	}
	return nil
}

func (sizeHint) EstimateCallCost(string, string, *cost.AstNode, []cost.AstNode) *cost.CallEstimate {
	return nil
}

// EventInput is one event as filters read it, built once per event and matched against every group's
// filter (see Endpoint.WantsInput): its JSON data is decoded at the first filter that reads it, not for
// groups without one. It is not safe for concurrent use.
type EventInput struct {
	Event *Event
	act   map[string]any
}

// InputOf returns ev as filters read it.
func InputOf(ev *Event) *EventInput { return &EventInput{Event: ev} }

func (in *EventInput) vars() map[string]any {
	if in.act == nil {
		ev := in.Event
		event := map[string]any{"topic": ev.Topic, "orderingKey": ev.OrderingKey}
		headers := map[string]any{}
		for k, v := range ev.Headers {
			headers[k] = v
		}
		event["headers"] = headers
		if data := decodeData(ev.Data); data != nil {
			event["data"] = data // absent when null: event.data.x is then a missing field, false
		}
		in.act = map[string]any{"event": event}
	}
	return in.act
}

// FilterCache keeps compiled filters by source, so that a store compiles each registration's filter once,
// not at every fan-out that reads the registration again. It holds at most maxCachedFilters; when full it
// starts over. It is safe for concurrent use; the zero value is ready.
type FilterCache struct {
	mu sync.Mutex
	m  map[string]*Filter
}

// maxCachedFilters bounds a FilterCache.
const maxCachedFilters = 4096

// Compile returns the compiled filter of src, from the cache or from CompileFilter (whose errors it returns
// and does not keep).
func (c *FilterCache) Compile(src string) (*Filter, error) {
	c.mu.Lock()
	f, ok := c.m[src]
	c.mu.Unlock()
	if ok {
		return f, nil
	}
	f, err := CompileFilter(src)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.m == nil || len(c.m) >= maxCachedFilters {
		c.m = make(map[string]*Filter)
	}
	c.m[src] = f
	c.mu.Unlock()
	return f, nil
}

// decodeData decodes an event's JSON data for filters: numbers are doubles, and a number beyond a double's
// range (1e400; the stored data and the webhook body keep its text as published) reads as +Inf or -Inf, so
// that one such number neither fails the whole data nor hides the event's other fields. It returns nil for
// null, empty or undecodable data.
func decodeData(raw json.RawMessage) any {
	var data any
	if len(raw) == 0 {
		return nil
	}
	err := json.Unmarshal(raw, &data)
	if err == nil {
		return data
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if dec.Decode(&data) != nil {
		return nil
	}
	return doubles(data)
}

// doubles replaces each json.Number in v (decoded with UseNumber) by its float64, ±Inf when out of range.
func doubles(v any) any {
	switch v := v.(type) {
	case json.Number:
		f, _ := strconv.ParseFloat(string(v), 64) // out of range: ±Inf with ErrRange
		return f
	case map[string]any:
		for k, x := range v {
			v[k] = doubles(x)
		}
	case []any:
		for i, x := range v {
			v[i] = doubles(x)
		}
	}
	return v
}
