package mongo

import (
	"fmt"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/pulse-sidecar/pulse/mongo/storetest"
	"github.com/pulse-sidecar/pulse/pulsetype"
)

// longestIn returns the length of the longest $in list anywhere in doc.
func longestIn(doc bson.Raw) int {
	elems, err := doc.Elements()
	if err != nil {
		return 0
	}
	longest := 0
	for _, e := range elems {
		v := e.Value()
		if arr, ok := v.ArrayOK(); ok {
			vals, _ := arr.Values()
			if e.Key() == "$in" {
				longest = max(longest, len(vals))
			}
			for _, x := range vals {
				if d, ok := x.DocumentOK(); ok {
					longest = max(longest, longestIn(d))
				}
			}
			continue
		}
		if d, ok := v.DocumentOK(); ok {
			longest = max(longest, longestIn(d))
		}
	}
	return longest
}

// longestSent returns the longest $in list of the commands log recorded, and the command holding it.
func (l *commandLog) longestSent() (int, string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	longest, which := 0, ""
	for i, c := range l.commands {
		if n := longestIn(c); n > longest {
			longest, which = n, l.names[i]
		}
	}
	return longest, which
}

// Deleting a group whose backlog is larger than one page ends all of it in pages: no command names more ids
// than a page (and the few queue documents that finish its last delivery), a POST in flight is left to its
// worker, and another group's pending work is untouched.
func testEndPendingWorksInPages(t *testing.T, e *env) {
	b := e.setup(t)
	const page, backlog = 7, 40
	log := &commandLog{}
	s := b.store(b.monitoredClient(log), func(o *Options) { o.PageSize = page })
	b.putEndpoint(s, "g", "t")
	b.putEndpoint(s, "h", "t")
	created := storetest.FanOutN(t, b.ctx, s, backlog, "t")
	var inFlight *pulsetype.Attempt
	for _, a := range created {
		if a.ConsumerGroup == "g" {
			inFlight = a
			break
		}
	}
	leased, err := s.ClaimAttempts(b.ctx, "w", []*pulsetype.Attempt{inFlight})
	if err != nil || len(leased) != 1 {
		t.Fatalf("ClaimAttempts = %v, %v", leased, err)
	}
	log.reset()
	if err := s.DeleteEndpoint(b.ctx, "g"); err != nil {
		t.Fatal(err)
	}
	if n, cmd := log.longestSent(); n > page+1 {
		t.Errorf("a %s command of the delete names %d ids, more than a page of %d", cmd, n, page)
	}
	if n := b.count("deliveries", bson.M{"consumerGroup": "g", "status": pulsetype.StatusPending}); n != 1 {
		t.Errorf("%d deliveries of the deleted group stay pending, want 1 (its POST in flight)", n)
	}
	if n := b.count("deliveries", bson.M{"consumerGroup": "g", "status": pulsetype.StatusError, "error.code": pulsetype.CodeEndpointDeleted}); n != backlog-1 {
		t.Errorf("%d deliveries of the deleted group ended as endpoint_deleted, want %d", n, backlog-1)
	}
	if n := b.count("queue", bson.M{"consumerGroup": "g"}); n != 1 {
		t.Errorf("%d queue documents of the deleted group stay, want 1 (the attempt in flight)", n)
	}
	if n := b.count("deliveries", bson.M{"consumerGroup": "h", "status": pulsetype.StatusPending}); n != backlog {
		t.Errorf("%d deliveries of the other group stay pending, want %d", n, backlog)
	}
	if t.Failed() {
		t.Log(fmt.Sprint(log.sent()))
	}
}
