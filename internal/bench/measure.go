package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/pprof/profile"
	"go.mongodb.org/mongo-driver/v2/bson"
	mongodrv "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

func percentile(d []time.Duration, p float64) float64 {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return float64(d[min(len(d)-1, int(p*float64(len(d))))].Microseconds()) / 1000
}

// rawUpdatesPerSecond measures single-document updates by _id on the same database at the given
// concurrency: the database's ceiling that efficiency is measured against.
func rawUpdatesPerSecond(ctx context.Context, uri, dbName string, clients int, d time.Duration) (float64, error) {
	client, err := mongodrv.Connect(options.Client().ApplyURI(uri))
	if err != nil {
		return 0, err
	}
	defer client.Disconnect(context.WithoutCancel(ctx))
	coll := client.Database(dbName).Collection("bench.raw")
	docs := make([]any, 1000)
	for i := range docs {
		docs[i] = bson.M{"_id": fmt.Sprint(i), "n": 0}
	}
	if _, err := coll.InsertMany(ctx, docs); err != nil {
		return 0, err
	}
	var ops atomic.Int64
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := c; time.Now().Before(deadline); i += clients {
				if _, err := coll.UpdateOne(ctx, bson.M{"_id": fmt.Sprint(i % 1000)}, bson.M{"$inc": bson.M{"n": 1}}); err == nil {
					ops.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return float64(ops.Load()) / d.Seconds(), nil
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func peakRSSMiB() float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Maxrss) / 1024 // Linux reports KiB
}

// clockTicks is the unit of the CPU times in /proc/<pid>/stat (USER_HZ, 100 on Linux).
const clockTicks = 100

// processCPU returns the CPU time (user and system) that process pid has used, from /proc/<pid>/stat.
func processCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces: count fields after its end.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields after the command name", pid, len(f))
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64) // field 14
	stime, err2 := strconv.ParseInt(f[12], 10, 64) // field 15
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return time.Duration(utime+stime) * time.Second / clockTicks, nil
}

// harnessLabels mark the goroutines of the bench's own load (publishers, receiver) in the CPU profile, so
// that the sidecars' share of this process's CPU can be told apart (cpuShares). Goroutines inherit the labels
// of the goroutine that starts them, so the HTTP connections of both carry them too.
var harnessLabels = pprof.Labels("pulse-bench", "harness")

// harness runs f with harnessLabels.
func harness(ctx context.Context, f func(context.Context)) { pprof.Do(ctx, harnessLabels, f) }

// profiling is held from startProfile to its stop: a process has one CPU profile, so benches run in one
// process (the tests of the root package run two in parallel) measure one after the other.
var profiling sync.Mutex

// startProfile starts a CPU profile of this process, written to file as well when file is not "", once no
// other bench of this process is profiling, and returns the function that stops it and returns the share (0
// to 1) of the profiled CPU time spent outside the goroutines labelled harnessLabels: the sidecars'. The
// runtime's own background work (garbage collection workers, the scheduler) carries no label and counts as
// the sidecars'. Calls of stop after the first do nothing and return (0, nil): defer one right after the
// start, so that a bench ending in an error does not hold the profile.
func startProfile(file string) (stop func() (float64, error), err error) {
	profiling.Lock()
	var buf bytes.Buffer
	if err := pprof.StartCPUProfile(&buf); err != nil {
		profiling.Unlock()
		return nil, err
	}
	var once sync.Once
	return func() (share float64, err error) {
		once.Do(func() {
			pprof.StopCPUProfile()
			profiling.Unlock()
			if file != "" {
				if err = os.WriteFile(file, buf.Bytes(), 0o644); err != nil {
					return
				}
			}
			share, err = sidecarShare(&buf)
		})
		return share, err
	}, nil
}

// sidecarShare reads a CPU profile and returns the share of its CPU time in samples without harnessLabels
// (1 when it holds no samples).
func sidecarShare(r io.Reader) (float64, error) {
	prof, err := profile.Parse(r)
	if err != nil {
		return 0, fmt.Errorf("bench: read the CPU profile: %w", err)
	}
	cpu := -1
	for i, st := range prof.SampleType {
		if st.Type == "cpu" {
			cpu = i
		}
	}
	if cpu < 0 {
		return 0, errors.New("bench: the CPU profile has no cpu samples")
	}
	var total, harness int64
	for _, s := range prof.Sample {
		total += s.Value[cpu]
		if slices.Contains(s.Label["pulse-bench"], "harness") {
			harness += s.Value[cpu]
		}
	}
	if total == 0 {
		return 1, nil
	}
	return float64(total-harness) / float64(total), nil
}

// docsWritten returns the documents a write command's reply says it inserted, changed or deleted: n of an
// insert or a delete, nModified plus the upserted documents of an update, and of a findAndModify the
// document it wrote (lastErrorObject.n; an update that matched but changed nothing counts too, as its reply
// cannot tell). Each is a document MongoDB's oplog records. Any other command, or a reply without these
// fields, counts 0.
func docsWritten(command string, reply bson.Raw) int64 {
	count := func(v bson.RawValue) int64 {
		n, _ := v.AsInt64OK()
		return n
	}
	switch strings.ToLower(command) {
	case "insert", "delete":
		return count(reply.Lookup("n"))
	case "update":
		up, _ := reply.Lookup("upserted").ArrayOK()
		ups, _ := up.Values()
		return count(reply.Lookup("nModified")) + int64(len(ups))
	case "findandmodify":
		return count(reply.Lookup("lastErrorObject", "n"))
	}
	return 0
}
