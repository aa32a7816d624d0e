package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

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
