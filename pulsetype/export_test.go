package pulsetype

import "time"

// SetFilterTimeout sets the deadline of filter evaluations (FilterTimeout) until the returned func restores it.
func SetFilterTimeout(d time.Duration) (restore func()) {
	old := filterTimeout
	filterTimeout = d
	return func() { filterTimeout = old }
}
