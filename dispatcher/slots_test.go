package dispatcher

import (
	"slices"
	"testing"
	"time"
)

func limits(m map[string]int) func(string) int {
	return func(group string) int {
		if n, ok := m[group]; ok {
			return n
		}
		return 16
	}
}

// A group gets no more slots than its maxConcurrency, and the last free slots (the reserve) go only to
// groups with nothing in flight.
func TestSlotsAdmitByLimitAndReserve(t *testing.T) {
	t.Parallel()
	s := newSlots(8, limits(map[string]int{"capped": 2}), func() {})
	s.slowAfter = time.Hour
	if s.reserve() != 2 {
		t.Fatalf("reserve of 8 workers = %d, want 2", s.reserve())
	}
	r1, r2 := s.acquire("capped"), s.acquire("capped")
	if s.admit("capped", 0, 0) {
		t.Fatal("a group at its maxConcurrency was admitted")
	}
	r2()
	if !s.admit("capped", 0, 0) {
		t.Fatal("a group below its maxConcurrency was refused")
	}
	if s.admit("capped", 1, 1) {
		t.Fatal("a group was admitted past its maxConcurrency counting the slots taken in the batch")
	}
	var busy []func()
	for range 5 {
		busy = append(busy, s.acquire("busy"))
	}
	// 6 of 8 in use: the 2 left are the reserve.
	if s.free() != 2 {
		t.Fatalf("free = %d, want 2", s.free())
	}
	if s.admit("busy", 0, 0) {
		t.Fatal("a group with POSTs in flight took a reserved slot")
	}
	if !s.admit("idle", 0, 0) {
		t.Fatal("a group with nothing in flight was refused a reserved slot")
	}
	if s.admit("idle", 0, 2) {
		t.Fatal("admitted with no slot left in the batch")
	}
	exclude, free := s.capacity([]string{"idle"})
	slices.Sort(exclude)
	if !slices.Equal(exclude, []string{"busy", "capped"}) || free != 1 {
		t.Fatalf("capacity = %v, %d; want [busy capped], 1", exclude, free)
	}
	r1()
	for _, r := range busy {
		r()
	}
	if s.free() != 8 || len(s.inflight) != 0 {
		t.Fatalf("after every release: free %d, in flight %v; want 8 and none", s.free(), s.inflight)
	}
}

// A POST running longer than slowAfter gives its slot back (the overflow) and keeps its group out of the
// reserve; its release then leaves the counts as they were.
func TestSlotsSlowPostGivesItsSlotBack(t *testing.T) {
	t.Parallel()
	freed := make(chan struct{}, 1)
	s := newSlots(4, limits(nil), func() { signal(freed) })
	s.slowAfter = 10 * time.Millisecond
	release := s.acquire("slow")
	if s.free() != 3 {
		t.Fatalf("free = %d, want 3", s.free())
	}
	select {
	case <-freed:
	case <-time.After(10 * time.Second):
		t.Fatal("the slow POST did not give its slot back")
	}
	if s.free() != 4 || s.overflow != 1 {
		t.Fatalf("free %d, overflow %d; want 4 and 1", s.free(), s.overflow)
	}
	release()
	if s.free() != 4 || s.overflow != 0 || len(s.inflight) != 0 {
		t.Fatalf("after release: free %d, overflow %d, in flight %v; want 4, 0, none", s.free(), s.overflow, s.inflight)
	}
	// 3 slots busy: the last one is the reserve, which the group that was slow may not take for slowMemory.
	for range 3 {
		defer s.acquire("other")()
	}
	if s.admit("slow", 0, 0) {
		t.Fatal("a group whose POST was slow took a reserved slot")
	}
	if !s.admit("fresh", 0, 0) {
		t.Fatal("a healthy idle group was refused the reserved slot")
	}
}
