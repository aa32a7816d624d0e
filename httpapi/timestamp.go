package httpapi

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// Timestamp is a time in JSON: written as a string in pulsetype.TimeLayout (UTC, three fraction digits), read
// from any RFC 3339 string.
type Timestamp time.Time

// MarshalJSON writes the time as a JSON string in pulsetype.TimeLayout.
func (t Timestamp) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, len(pulsetype.TimeLayout)+2)
	b = append(b, '"')
	b = time.Time(t).UTC().AppendFormat(b, pulsetype.TimeLayout)
	return append(b, '"'), nil
}

// UnmarshalJSON reads an RFC 3339 time.
func (t *Timestamp) UnmarshalJSON(b []byte) error {
	var v time.Time
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*t = Timestamp(v)
	return nil
}

// each converts every element of list with conv, in order; it returns a non-nil slice, so an empty list is
// written as [] and not null.
func each[F, T any](list []F, conv func(F) T) []T {
	out := make([]T, len(list))
	for i, v := range list {
		out[i] = conv(v)
	}
	return out
}

// optional converts an optional value with conv; nil stays nil.
func optional[F, T any](p *F, conv func(F) T) *T {
	if p == nil {
		return nil
	}
	v := conv(*p)
	return &v
}

func timestampPtr(t *time.Time) *Timestamp {
	return optional(t, func(v time.Time) Timestamp { return Timestamp(v) })
}

func timePtr(t *Timestamp) *time.Time {
	return optional(t, func(v Timestamp) time.Time { return time.Time(v) })
}

// Duration is a duration in JSON: written as a Go duration string ("1m30s"), read from one or from a number
// of milliseconds.
type Duration time.Duration

// MarshalJSON writes the duration as a string such as "1s".
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads a Go duration string; a bare number is taken as milliseconds, and null changes
// nothing (as for any JSON field left out). Its errors say `want a duration such as "1s"`.
func (d *Duration) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		var ms float64
		if err2 := json.Unmarshal(b, &ms); err2 != nil {
			return fmt.Errorf("want a duration such as \"1s\"")
		}
		*d = Duration(time.Duration(ms * float64(time.Millisecond)))
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("want a duration such as \"1s\", got %q", s)
	}
	*d = Duration(v)
	return nil
}

func durationPtr(d *pulsetype.Duration) *Duration {
	return optional(d, func(v pulsetype.Duration) Duration { return Duration(v) })
}

func domainDuration(d *Duration) *pulsetype.Duration {
	return optional(d, func(v Duration) pulsetype.Duration { return pulsetype.Duration(v) })
}
