package pulsetype

import "time"

// ActivityBucket is the width of one bucket of GroupActivity: a minute, aligned on whole UTC minutes.
const ActivityBucket = time.Minute

// ActivityBuckets is how many buckets GroupActivity holds: the last hour, the current minute last.
const ActivityBuckets = 60

// ActivityScanLimit bounds the attempts one GroupActivity reads (the most recent first): a group that ended
// more attempts in the hour has its earliest buckets counted only from TruncatedBefore on.
const ActivityScanLimit = 50000

// GroupActivity is one consumer group's last hour, minute by minute, as GET
// /v1/endpoints/{consumerGroup}/activity shows it: the attempts that ended in each minute, and the pending
// deliveries now.
type GroupActivity struct {
	ConsumerGroup string
	// From is the start of the first bucket (a whole UTC minute) and To the time the figures were read at
	// (the store's clock), inside the last bucket.
	From, To time.Time
	// Buckets are ActivityBuckets minutes, oldest first: Buckets[i] covers [From + i·ActivityBucket,
	// From + (i+1)·ActivityBucket).
	Buckets []ActivityCount
	// Pending counts the group's pending deliveries now; OldestPendingAt is the createdAt of the oldest
	// one (nil when none).
	Pending         int64
	OldestPendingAt *time.Time
	// TruncatedBefore, when set, says the scan stopped at ActivityScanLimit attempts: the buckets before
	// this time count fewer attempts than ended in them.
	TruncatedBefore *time.Time
}

// ActivityCount is one bucket of GroupActivity: the attempts that ended in it with success, and with error
// for a reason of the receiver's (as GroupStats.Failed1h: Ended codes are left out).
type ActivityCount struct {
	Succeeded, Failed int64
}

// ActivityWindow returns the start of the first bucket of a GroupActivity read at now: now truncated to
// the minute, less ActivityBuckets-1 minutes, so the last bucket is the current minute.
func ActivityWindow(now time.Time) time.Time {
	return now.UTC().Truncate(ActivityBucket).Add(-(ActivityBuckets - 1) * ActivityBucket)
}
