package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
)

// logCounter is the sidecars' log (zerolog JSON, one record a line): while counting, it counts the
// warnings and errors by level, component and message.
type logCounter struct {
	counting atomic.Bool
	mu       sync.Mutex
	partial  []byte
	byKey    map[string]int // "<level> <component>: <message>" → records
	warnings int
	errors   int
}

func newLogCounter() *logCounter { return &logCounter{byKey: map[string]int{}} }

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
	var r struct{ Level, Component, Message, Error string }
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
	key := fmt.Sprintf("%s %s: %s", r.Level, r.Component, r.Message)
	if r.Error != "" && len(l.byKey) < 50 {
		key += " (" + r.Error + ")"
	}
	l.byKey[key]++
}

// counts returns the warnings and errors counted, and the records by kind, most frequent first.
func (l *logCounter) counts() (warnings, errors int, kinds []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	keys := slices.SortedFunc(maps.Keys(l.byKey), func(a, b string) int { return l.byKey[b] - l.byKey[a] })
	for _, k := range keys {
		kinds = append(kinds, fmt.Sprintf("%d× %s", l.byKey[k], k))
	}
	return l.warnings, l.errors, kinds
}
