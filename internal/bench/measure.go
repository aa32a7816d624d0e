package bench

import (
	"context"
	"fmt"
	"slices"
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
