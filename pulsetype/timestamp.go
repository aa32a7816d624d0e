package pulsetype

import (
	"bytes"
	"encoding/json"
	"time"
)

// TimeLayout is how the sidecar writes every timestamp (API answers and the webhook body's createdAt): RFC
// 3339 in UTC with exactly three fraction digits, e.g. "2025-03-01T12:00:15.130Z". The width is fixed, so
// fixed-pattern parsers work and string order is time order. Stored times hold milliseconds (BSON dates),
// so nothing is lost.
const TimeLayout = "2006-01-02T15:04:05.000Z"

// FormatTime writes t in UTC with TimeLayout; digits below the millisecond are cut, not rounded, as BSON
// dates cut them, so a time written before and after a database round trip reads the same.
func FormatTime(t time.Time) string { return t.UTC().Format(TimeLayout) }

// Timestamp is a time.Time that marshals to JSON as FormatTime. It unmarshals any RFC 3339 time.
type Timestamp time.Time

// MarshalJSON writes the time as a JSON string in TimeLayout.
func (t Timestamp) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, len(TimeLayout)+2)
	b = append(b, '"')
	b = time.Time(t).UTC().AppendFormat(b, TimeLayout)
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

// TimestampPtr converts an optional time; nil stays nil.
func TimestampPtr(t *time.Time) *Timestamp {
	if t == nil {
		return nil
	}
	ts := Timestamp(*t)
	return &ts
}

// MarshalJSON writes the delivery with its times in TimeLayout.
func (d Delivery) MarshalJSON() ([]byte, error) {
	type plain Delivery
	return marshalPlain(struct {
		plain
		EventCreatedAt Timestamp  `json:"eventCreatedAt"`
		CreatedAt      Timestamp  `json:"createdAt"`
		UpdatedAt      Timestamp  `json:"updatedAt"`
		EndedAt        *Timestamp `json:"endedAt,omitempty"`
	}{plain(d), Timestamp(d.EventCreatedAt), Timestamp(d.CreatedAt), Timestamp(d.UpdatedAt), TimestampPtr(d.EndedAt)})
}

// MarshalJSON writes the attempt with its times in TimeLayout.
func (a Attempt) MarshalJSON() ([]byte, error) {
	type plain Attempt
	return marshalPlain(struct {
		plain
		CreatedAt     Timestamp  `json:"createdAt"`
		NextAttemptAt Timestamp  `json:"nextAttemptAt"`
		StartedAt     *Timestamp `json:"startedAt,omitempty"`
		EndedAt       *Timestamp `json:"endedAt,omitempty"`
	}{plain(a), Timestamp(a.CreatedAt), Timestamp(a.NextAttemptAt), TimestampPtr(a.StartedAt), TimestampPtr(a.EndedAt)})
}

// MarshalJSON writes the endpoint with its times in TimeLayout. It writes what it is given: call Redacted
// first for reads and logs.
func (e Endpoint) MarshalJSON() ([]byte, error) {
	type plain Endpoint
	return marshalPlain(struct {
		plain
		CreatedAt               Timestamp  `json:"createdAt"`
		UpdatedAt               Timestamp  `json:"updatedAt"`
		PreviousSecretExpiresAt *Timestamp `json:"previousSecretExpiresAt,omitempty"`
		StateSince              *Timestamp `json:"stateSince,omitempty"`
	}{plain(e), Timestamp(e.CreatedAt), Timestamp(e.UpdatedAt), TimestampPtr(e.PreviousSecretExpiresAt), TimestampPtr(e.StateSince)})
}

// marshalPlain is json.Marshal without HTML escaping, as the API writes its answers ("<redacted>", URLs with
// "&" stay readable).
func marshalPlain(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimRight(b.Bytes(), "\n"), nil
}
