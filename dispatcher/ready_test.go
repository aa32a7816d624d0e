package dispatcher

import (
	"slices"
	"testing"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

func readyJob(id, group string, size int) job {
	return job{a: &pulsetype.Attempt{ID: id, ConsumerGroup: group}, ev: &pulsetype.Event{ID: "e-" + id, Data: make([]byte, size)}, evKnown: true}
}

func ids(jobs []job) []string {
	out := make([]string, len(jobs))
	for i, j := range jobs {
		out[i] = j.a.ID
	}
	return out
}

func admitAll(string, int, int) bool { return true }

// The ready queue hands attempts out first in, first out, keeps the order of those it skips, and holds each
// attempt once.
func TestReadyQueueOrderAndDedupe(t *testing.T) {
	t.Parallel()
	q := newReadyQueue(10, 1<<20)
	for _, j := range []job{readyJob("a1", "g1", 1), readyJob("a2", "g2", 1), readyJob("a3", "g1", 1), readyJob("a4", "g3", 1)} {
		if !q.push(j) {
			t.Fatalf("push %s refused", j.a.ID)
		}
	}
	if !q.push(readyJob("a2", "g2", 1)) || q.len() != 4 {
		t.Fatalf("pushing a queued attempt again: len %d, want 4 (kept once)", q.len())
	}
	if got := ids(q.take(2, admitAll)); !slices.Equal(got, []string{"a1", "a2"}) {
		t.Fatalf("take(2) = %v, want [a1 a2]", got)
	}
	noG1 := func(group string, _, _ int) bool { return group != "g1" }
	if got := ids(q.take(10, noG1)); !slices.Equal(got, []string{"a4"}) {
		t.Fatalf("take without g1 = %v, want [a4]", got)
	}
	if !q.push(readyJob("a2", "g2", 1)) {
		t.Fatal("an attempt taken out may be queued again")
	}
	if got := ids(q.take(10, admitAll)); !slices.Equal(got, []string{"a3", "a2"}) {
		t.Fatalf("take = %v, want the skipped a3 first, then a2", got)
	}
	if q.len() != 0 || q.bytes != 0 {
		t.Fatalf("empty queue holds %d attempts and %d bytes", q.len(), q.bytes)
	}
}

// take tells admit how many attempts of the same group, and in all, it took before.
func TestReadyQueueTakeCountsWhatItTook(t *testing.T) {
	t.Parallel()
	q := newReadyQueue(10, 1<<20)
	for _, j := range []job{readyJob("a1", "g1", 1), readyJob("a2", "g1", 1), readyJob("a3", "g2", 1), readyJob("a4", "g2", 1), readyJob("a5", "g3", 1)} {
		q.push(j)
	}
	// One per group, three in all.
	admit := func(_ string, takenGroup, takenAll int) bool { return takenGroup == 0 && takenAll < 3 }
	if got := ids(q.take(10, admit)); !slices.Equal(got, []string{"a1", "a3", "a5"}) {
		t.Fatalf("take = %v, want [a1 a3 a5]", got)
	}
	if got := ids(q.take(10, admitAll)); !slices.Equal(got, []string{"a2", "a4"}) {
		t.Fatalf("rest = %v, want [a2 a4]", got)
	}
}

// The queue refuses attempts beyond its length or its bytes of event data (they are left to polling).
func TestReadyQueueBounds(t *testing.T) {
	t.Parallel()
	q := newReadyQueue(2, 100)
	if !q.push(readyJob("a1", "g", 10)) || !q.push(readyJob("a2", "g", 10)) {
		t.Fatal("push within bounds refused")
	}
	if q.push(readyJob("a3", "g", 10)) {
		t.Fatal("push beyond maxLen accepted")
	}
	q = newReadyQueue(10, 100)
	if !q.push(readyJob("a1", "g", 60)) {
		t.Fatal("push within bounds refused")
	}
	if q.push(readyJob("a2", "g", 41)) {
		t.Fatal("push beyond maxBytes accepted")
	}
	if !q.push(readyJob("a3", "g", 40)) {
		t.Fatal("push up to maxBytes refused")
	}
	q.take(1, admitAll)
	if !q.push(readyJob("a2", "g", 41)) {
		t.Fatal("push refused after take freed the bytes")
	}
}
