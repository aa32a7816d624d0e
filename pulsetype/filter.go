package pulsetype

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/ast"
	"cel.dev/cel-go/common/cost"
	"cel.dev/cel-go/common/overloads"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"cel.dev/cel-go/ext"
	"cel.dev/cel-go/interpreter"
)

// Filter limits (docs/delivery.md, "Filters").
const (
	// MaxFilterLength bounds an endpoint's filter expression, in bytes.
	MaxFilterLength = 4096
	// MaxFilterCost is the most one evaluation of a filter may cost, in CEL cost units (about one per
	// operation, a tenth of a byte's for string functions): evaluation stops there and the delivery ends as
	// CodeFilterError. A matches() call is charged before it runs (boundedMatches).
	MaxFilterCost = 100_000
	// MaxFilterRegexProgram bounds the program of each matches() pattern, in RE2 instructions as cel-go
	// counts them (types.RegexProgramSize; cel.RegexProgramSizeLimit refuses a larger one at PUT):
	// `[ab]{1000}c` is about 2,000, `^[0-9a-f]{8}-[0-9a-f]{4}$` about 20.
	MaxFilterRegexProgram = 200
	// FilterTimeout is the deadline of one evaluation of a filter: the fan-out waits no longer for it (the
	// evaluation runs on its own goroutine, stopped by cel-go's interrupt check, FilterInterruptCheck), and
	// the delivery ends as CodeFilterError. The cost limits bound an evaluation well below it (one at
	// MaxFilterCost takes about 20 ms of one core): it is the bound for what the cost model misses, far
	// enough above that a loaded machine does not end deliveries the limits admit.
	FilterTimeout = time.Second
	// FilterInterruptCheck is how many iterations of a comprehension run between two checks of the
	// evaluation's deadline (cel.InterruptCheckFrequency): every one, since one iteration can compare a
	// whole large value (a list equality is charged by its length, not by what it holds), so that an
	// evaluation past its deadline stops within one iteration instead of running on after the fan-out
	// moved on (a hundred such iterations took 5 s of CPU past a 1 s deadline).
	FilterInterruptCheck = 1
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
// an int), event declared as a map of string to dyn, and cel-go's validators of matches() literals: a
// pattern that compiles (cel.ValidateRegexLiterals) of at most MaxFilterRegexProgram instructions
// (cel.RegexProgramSizeLimit).
var filterEnv = sync.OnceValues(func() (*cel.Env, error) {
	return cel.NewEnv(cel.Variable("event", cel.MapType(cel.StringType, cel.DynType)), cel.CrossTypeNumericComparisons(true),
		cel.RegexProgramSizeLimit(MaxFilterRegexProgram), cel.ASTValidators(cel.ValidateRegexLiterals()))
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
		cel.Variable("event", cel.ObjectType("pulsetype.filterFields")), cel.CrossTypeNumericComparisons(true),
		cel.RegexProgramSizeLimit(MaxFilterRegexProgram))
})

// CompileFilter parses and checks src: CEL syntax and types (with event's fields typed, filterCheckEnv), a
// result whose checked type is bool or dyn (event.topic, a string, is refused naming its type), at most
// MaxFilterLength bytes, every matches() pattern a string literal of at most MaxFilterRegexProgram
// instructions (compiled here, never per event), and an estimated worst cost (every value of the event at
// most FilterSizeHint long) within MaxFilterCost. It returns a *FieldError for field "filter" naming the
// problem.
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
	checked, iss := checkEnv.Compile(src)
	if iss.Err() != nil {
		return nil, &FieldError{"filter", "does not type-check over event (topic, orderingKey: string; headers: map of string to string; data: any JSON): " +
			strings.ReplaceAll(iss.Err().Error(), "\n", " ")}
	}
	// The result type of the typed check: the untyped environment sees every field of event as dyn.
	if t := checked.OutputType(); !t.IsExactType(types.BoolType) && !t.IsExactType(types.DynType) {
		return nil, &FieldError{"filter", fmt.Sprintf("must be a boolean expression, got %s", t)}
	}
	if err := constantPatterns(ast); err != nil {
		return nil, err
	}
	est, err := env.EstimateCost(ast, sizeHint{})
	if err != nil {
		return nil, &FieldError{"filter", "its cost cannot be estimated: " + err.Error()}
	}
	if est.Max > MaxFilterCost {
		return nil, &FieldError{"filter", fmt.Sprintf("may cost up to %d per event (values of %d bytes or elements), more than the limit %d: "+
			"iterate over less of the event", est.Max, FilterSizeHint, MaxFilterCost)}
	}
	prg, err := env.Program(ast, cel.CostLimit(MaxFilterCost), cel.EvalOptions(cel.OptOptimize),
		cel.InterruptCheckFrequency(FilterInterruptCheck), cel.OptimizeRegex(boundedMatches...))
	if err != nil {
		return nil, &FieldError{"filter", err.Error()}
	}
	return &Filter{src: src, prg: prg}, nil
}

// constantPatterns returns a *FieldError when a matches() call of a's takes its pattern from anything but
// a string literal: a pattern read from the event would be compiled, unbounded, at every evaluation.
func constantPatterns(a *cel.Ast) error {
	calls := ast.MatchDescendants(ast.NavigateAST(a.NativeRep()), ast.FunctionMatcher(overloads.Matches))
	for _, call := range calls {
		c := call.AsCall()
		i := 1 // matches(s, p)
		if c.IsMemberFunction() {
			i = 0 // s.matches(p)
		}
		if args := c.Args(); len(args) > i && (args[i].Kind() != ast.LiteralKind || args[i].AsLiteral().Type() != types.StringType) {
			return &FieldError{"filter", "matches() takes its pattern as a string literal (a pattern from the event would be compiled at each evaluation)"}
		}
	}
	return nil
}

// boundedMatches are the filters' matches() (both overloads, cel.OptimizeRegex): the pattern, a literal
// (constantPatterns), is compiled once when the filter is, and each call is charged before it runs, the
// cost model's traversal of its input (cost.StringTraversalCostFactor per byte) times the pattern's program
// size, since RE2's work grows with both: a call whose charge passes MaxFilterCost stops the evaluation as
// cel.CostLimit does (a 1 MB input passes it with any pattern), instead of running first and counting
// after.
var boundedMatches = []*interpreter.RegexOptimization{
	{Function: overloads.Matches, OverloadID: overloads.Matches, RegexIndex: 1, Factory: boundedMatch},
	{Function: overloads.Matches, OverloadID: overloads.MatchesString, RegexIndex: 1, Factory: boundedMatch},
}

func boundedMatch(call interpreter.InterpretableCall, pattern string) (interpreter.InterpretableCall, error) {
	size, err := types.RegexProgramSize(pattern)
	if err != nil {
		return nil, err
	}
	re, err := types.CompileRegexWithLimit(pattern, MaxFilterRegexProgram)
	if err != nil {
		return nil, err
	}
	return interpreter.NewCall(call.ID(), call.Function(), call.OverloadID(), call.Args(), func(values ...ref.Val) ref.Val {
		if len(values) != 2 {
			return types.NoSuchOverloadErr()
		}
		in, ok := values[0].Value().(string)
		if !ok {
			return types.NoSuchOverloadErr()
		}
		charge := math.Ceil(float64(len(in)+1)*cost.StringTraversalCostFactor) * float64(size)
		if charge > MaxFilterCost {
			panic(interpreter.EvalCancelledError{Cause: interpreter.CostLimitExceeded, Message: fmt.Sprintf(
				"matches() over %d bytes with a pattern of %d instructions costs %.0f, more than the limit %d", len(in), size, charge, MaxFilterCost)})
		}
		return types.Bool(re.MatchString(in))
	}), nil
}

// FilterError is an evaluation of a filter that ended without a result the fan-out may use: past
// MaxFilterCost, past FilterTimeout, or a result that is not a boolean (a filter of type dyn, such as
// event.data.flag, that is a string for this event). The delivery it was evaluated for ends as
// CodeFilterError with Message.
type FilterError struct{ Message string }

func (e *FilterError) Error() string { return e.Message }

// filterTimeout is FilterTimeout; tests shorten it (export_test.go).
var filterTimeout = FilterTimeout

// String returns the filter's source.
func (f *Filter) String() string { return f.src }

// Match reports whether the filter holds for the event in: only a result true holds, and an evaluation
// that fails (Eval's *FilterError) does not. It is safe for concurrent use when in is not shared.
func (f *Filter) Match(in *EventInput) bool {
	ok, err := f.Eval(in)
	return ok && err == nil
}

// Eval evaluates the filter for the event in. A field the event lacks (no such key) or a type that does not
// fit (a string compared with a number) makes it false, not an error: the filter decides which groups get
// an event, and an event is data. It returns a *FilterError when the evaluation passes MaxFilterCost (a
// matches() call is charged before it runs) or FilterTimeout, or when its result is not a boolean. The
// evaluation runs on a goroutine of its own under cel-go's ContextEval, so that the caller (the fan-out of
// every group) waits at most FilterTimeout; an evaluation past it stops at its next interrupt check. It is
// safe for concurrent use when in is not shared.
func (f *Filter) Eval(in *EventInput) (bool, error) {
	vars := in.vars() // decoded here, so that the evaluation only reads in
	ctx, cancel := context.WithTimeout(context.Background(), filterTimeout)
	type result struct {
		out ref.Val
		err error
	}
	done := make(chan result, 1)
	go func() {
		defer cancel()
		out, _, err := f.prg.ContextEval(ctx, vars)
		done <- result{out, err}
	}()
	select {
	case r := <-done:
		return verdict(r.out, r.err)
	case <-ctx.Done():
		select {
		case r := <-done:
			return verdict(r.out, r.err)
		default:
			return false, &FilterError{fmt.Sprintf("the evaluation passed its deadline of %s", filterTimeout)}
		}
	}
}

// verdict is Eval's answer for an evaluation's result out and error err.
func verdict(out ref.Val, err error) (bool, error) {
	var cancelled interpreter.EvalCancelledError
	switch {
	case errors.As(err, &cancelled) && cancelled.Cause == interpreter.CostLimitExceeded:
		return false, &FilterError{fmt.Sprintf("the evaluation passed the cost limit %d: %s", MaxFilterCost, cancelled.Message)}
	case errors.As(err, &cancelled), errors.Is(err, interpreter.InterruptError{}), errors.Is(err, context.DeadlineExceeded):
		return false, &FilterError{fmt.Sprintf("the evaluation passed its deadline of %s", filterTimeout)}
	case err != nil:
		return false, nil // a missing field or a type that does not fit: false
	}
	if b, ok := out.(types.Bool); ok {
		return bool(b), nil
	}
	v := fmt.Sprint(out.Value())
	if len(v) > 64 {
		v = v[:64] + "…"
	}
	return false, &FilterError{fmt.Sprintf("the filter's result is %s %s for this event, not a boolean", out.Type().TypeName(), strconv.Quote(v))}
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
