package pulsetype

import "time"

// StatsWindow is the window of GroupStats' attempt counts and latency: the last hour.
const StatsWindow = time.Hour

// LatencySampleSize bounds the attempts GroupStats' latency median is taken over: the most recent ones of
// the window.
const LatencySampleSize = 1000

// GroupStats are one consumer group's figures at one time, as GET /v1/stats shows them.
type GroupStats struct {
	ConsumerGroup string
	// Pending counts the group's pending deliveries.
	Pending int64
	// OldestPendingAt is the createdAt of the oldest pending delivery, and OldestPendingAgeMs its age in
	// milliseconds; nil and 0 when nothing is pending.
	OldestPendingAt    *time.Time
	OldestPendingAgeMs int64
	// Succeeded1h and Failed1h count the attempts that ended in the window with status success or error.
	// Failed1h leaves out attempts ended for a reason that is not the receiver's (Ended codes:
	// event_expired, endpoint_deleted, unsubscribed, cancelled).
	Succeeded1h int64
	Failed1h    int64
	// LatencyP50Ms is the median duration in milliseconds of the window's most recent answered POSTs (up to
	// LatencySampleSize attempts, success or error, that got an HTTP status); nil when none did, as for a
	// group whose every attempt was refused or timed out: their durations say nothing of the receiver.
	LatencyP50Ms *int64
	// LatencySample is how many attempts LatencyP50Ms was taken over.
	LatencySample int
}
