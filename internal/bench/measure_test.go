package bench

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// processCPU reads the same CPU time from /proc/<pid>/stat that getrusage reports for this process.
func TestProcessCPUFollowsRusage(t *testing.T) {
	before, err := processCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	start := cpuTime()
	for x := 0; cpuTime()-start < 300*time.Millisecond; x++ {
	}
	after, err := processCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if d := after - before; d < 250*time.Millisecond {
		t.Fatalf("processCPU grew by %s while the process spent 300ms of CPU", d)
	}
}

// The profile's split gives the sidecars the CPU of unlabelled goroutines only: one labelled and one
// unlabelled goroutine each spend 300ms of CPU, so the sidecars' share is about half (one sample is 10ms).
func TestSidecarShareLeavesOutTheHarness(t *testing.T) {
	stop, err := startProfile("")
	if err != nil {
		t.Fatal(err)
	}
	spin := func() {
		start := cpuTime()
		for x := 0; cpuTime()-start < 300*time.Millisecond; x++ {
		}
	}
	done := make(chan struct{})
	harness(context.Background(), func(context.Context) {
		go func() { spin(); close(done) }()
	})
	spin()
	<-done
	share, err := stop()
	if err != nil {
		t.Fatal(err)
	}
	if share < 0.2 || share > 0.8 {
		t.Fatalf("sidecar share = %.2f, want about 0.5 (half of the CPU was spent by a harness goroutine)", share)
	}
}

// The log counter counts warnings and errors only while counting, groups them by component and message, and
// counts the records of lost leases.
func TestLogCounter(t *testing.T) {
	l := newLogCounter()
	_, _ = l.Write([]byte(`{"level":"warn","component":"dispatcher","message":"before"}` + "\n"))
	l.counting.Store(true)
	_, _ = l.Write([]byte(`{"level":"info","message":"fine"}` + "\n" + `{"level":"error","component":"reconciler","error":"boom","mess`))
	_, _ = l.Write([]byte(`age":"repair failed"}` + "\n" + `{"level":"warn","component":"store","message":"slow"}` + "\n"))
	_, _ = l.Write([]byte(`{"level":"error","component":"reconciler","message":"lease expired: attempt recorded as worker_lost"}` + "\n"))
	l.counting.Store(false)
	_, _ = l.Write([]byte(`{"level":"warn","component":"dispatcher","message":"after"}` + "\n"))
	warnings, errors, leaseLosses, kinds := l.counts()
	if warnings != 1 || errors != 2 || leaseLosses != 1 || len(kinds) != 3 {
		t.Fatalf("counts = %d warnings, %d errors, %d lease losses, %q; want 1, 2, 1 and three kinds", warnings, errors, leaseLosses, kinds)
	}
	if !strings.Contains(strings.Join(kinds, "\n"), "1× error reconciler: repair failed (boom)") {
		t.Fatalf("kinds = %q", kinds)
	}
}

// docsWritten reads the documents a write wrote from its reply: inserts and deletes by n, updates by
// nModified plus their upserts, a findAndModify by lastErrorObject.n; reads write none.
func TestDocsWrittenCountsFromReplies(t *testing.T) {
	t.Parallel()
	reply := func(d bson.D) bson.Raw {
		raw, err := bson.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	for _, c := range []struct {
		command string
		reply   bson.D
		want    int64
	}{
		{"insert", bson.D{{Key: "n", Value: int32(3)}, {Key: "ok", Value: 1.0}}, 3},
		{"delete", bson.D{{Key: "n", Value: int64(2)}, {Key: "ok", Value: 1.0}}, 2},
		{"update", bson.D{{Key: "n", Value: int32(5)}, {Key: "nModified", Value: int32(4)}, {Key: "ok", Value: 1.0}}, 4},
		{"update", bson.D{{Key: "n", Value: int32(2)}, {Key: "nModified", Value: int32(1)},
			{Key: "upserted", Value: bson.A{bson.D{{Key: "index", Value: int32(1)}, {Key: "_id", Value: "x"}}}}, {Key: "ok", Value: 1.0}}, 2},
		{"findAndModify", bson.D{{Key: "lastErrorObject", Value: bson.D{{Key: "n", Value: int32(1)}, {Key: "updatedExisting", Value: false}}}, {Key: "ok", Value: 1.0}}, 1},
		{"findAndModify", bson.D{{Key: "lastErrorObject", Value: bson.D{{Key: "n", Value: int32(0)}}}, {Key: "value", Value: nil}, {Key: "ok", Value: 1.0}}, 0},
		{"find", bson.D{{Key: "cursor", Value: bson.D{{Key: "firstBatch", Value: bson.A{}}}}, {Key: "ok", Value: 1.0}}, 0},
	} {
		if got := docsWritten(c.command, reply(c.reply)); got != c.want {
			t.Errorf("docsWritten(%s, %v) = %d, want %d", c.command, c.reply, got, c.want)
		}
	}
}
