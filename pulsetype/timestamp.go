package pulsetype

import "time"

// TimeLayout is how the sidecar writes every timestamp (API answers and the webhook body's createdAt): RFC
// 3339 in UTC with exactly three fraction digits, e.g. "2025-03-01T12:00:15.130Z". The width is fixed, so
// fixed-pattern parsers work and string order is time order. Stored times hold milliseconds (BSON dates),
// so nothing is lost.
const TimeLayout = "2006-01-02T15:04:05.000Z"

// FormatTime writes t in UTC with TimeLayout; digits below the millisecond are cut, not rounded, as BSON
// dates cut them, so a time written before and after a database round trip reads the same.
func FormatTime(t time.Time) string { return t.UTC().Format(TimeLayout) }
