package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// logCounter is the sidecars' log (zerolog JSON, one record a line): while counting, it counts the
// warnings and errors by level, component and message, and the records that tell of a lost lease.
type logCounter struct {
	counting    atomic.Bool
	mu          sync.Mutex
	partial     []byte
	byKey       map[string]int // "<level> <component>: <message>" → records
	warnings    int
	errors      int
	leaseLosses int
}

// newLogCounter returns a logCounter that does not count yet.
func newLogCounter() *logCounter { return &logCounter{byKey: map[string]int{}} }

// leaseLost reports whether a warning or error with message msg tells of a lease lost by a live sidecar: a
// result not recorded, a POST given up or given back because its lease ran out, an attempt reaped as
// worker_lost.
func leaseLost(msg string) bool {
	return strings.Contains(msg, "lease lost") || strings.Contains(msg, "lease ran out") ||
		strings.Contains(msg, "lease expired") || strings.Contains(msg, "left to lease expiry")
}

// Write takes log output; it never fails.
func (l *logCounter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.partial = append(l.partial, p...)
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			return len(p), nil
		}
		line := l.partial[:i]
		l.partial = l.partial[i+1:]
		if l.counting.Load() {
			l.record(line)
		}
	}
}

// record counts one log line when it is a warning or an error; l.mu is held.
func (l *logCounter) record(line []byte) {
	var r struct{ Level, Component, Message, Error, Kind, Step string }
	if json.Unmarshal(line, &r) != nil {
		return
	}
	switch r.Level {
	case "warn":
		l.warnings++
	case "error", "fatal", "panic":
		l.errors++
	default:
		return
	}
	if leaseLost(r.Message) {
		l.leaseLosses++
	}
	key := fmt.Sprintf("%s %s: %s", r.Level, r.Component, r.Message)
	for _, f := range []string{r.Kind, r.Step} {
		if f != "" {
			key += " [" + f + "]"
		}
	}
	if r.Error != "" && len(l.byKey) < 50 {
		key += " (" + r.Error + ")"
	}
	l.byKey[key]++
}

// counts returns the warnings, errors and lease losses counted, and the records by kind, most frequent
// first.
func (l *logCounter) counts() (warnings, errors, leaseLosses int, kinds []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	keys := slices.SortedFunc(maps.Keys(l.byKey), func(a, b string) int { return l.byKey[b] - l.byKey[a] })
	for _, k := range keys {
		kinds = append(kinds, fmt.Sprintf("%d× %s", l.byKey[k], k))
	}
	return l.warnings, l.errors, l.leaseLosses, kinds
}
