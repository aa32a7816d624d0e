// Package bench is `pulse bench`: it measures delivery throughput, latency from publish to POST, database
// commands per delivery, and the sidecars' CPU and peak memory, against a fresh embedded development database
// (a child process, so its CPU and memory are not the sidecars') or a database the caller names.
//
// The sidecars run in-process (Sidecar), so a driver command monitor counts their commands. The package is
// development tooling: the sidecar itself never imports it.
package bench

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"go.mongodb.org/mongo-driver/v2/event"

	"github.com/pulse-sidecar/pulse/internal/cli"
)

// Sidecar runs one sidecar in-process with the configuration getenv until ctx is done, then returns nil
// after a clean shutdown. It sends every database command of the sidecar to monitor and calls ready with
// the API's address (host:port) once the API listens. It returns an error when the sidecar does not start.
type Sidecar func(ctx context.Context, getenv func(string) string, monitor *event.CommandMonitor, ready func(addr string)) error

// result holds the figures `pulse bench` prints.
type result struct {
	Deliveries, Duplicates int
	Seconds                float64
	PerSecond              float64
	P50ms, P99ms           float64
	CommandsPerDelivery    float64
	RawOpsPerSecond        float64
	Efficiency             float64
	CPUusPerDelivery       float64
	PeakRSSMiB             float64
	ByCommand              map[string]int64         // database commands by name, during the measured run
	TimeByCommand          map[string]time.Duration // their summed round-trip times
}

// synopsis starts the text of `pulse bench --help`.
const synopsis = `Usage: pulse bench [flags]

Measures delivery throughput, latency and database commands per delivery against a fresh embedded
development database (or --mongodb-uri), and prints a table and one machine-readable line starting "bench:".`

// Run is `pulse bench` with the command line args (the flags after "bench"). It starts the embedded
// development database as a child process, `<this executable> devdb` (so the executable must be pulse),
// unless PULSE_MONGODB_URI or --mongodb-uri names one; runs --replicas sidecars with sidecar; registers
// --groups consumer groups on a local receiver; publishes --events events, one request per event, with
// --concurrency concurrent clients spread over the replicas; waits for every delivery; then measures raw
// single-document updates by _id on the same database at the same concurrency. It prints a table and one
// machine-readable line starting with "bench:" on stdout, and blocks until done or --timeout. It returns a
// *cli.UsageError for flags it does not accept and flag.ErrHelp after printing --help.
func Run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer, sidecar Sidecar) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	events := fs.Int("events", 1000, "events to publish")
	groups := fs.Int("groups", 2, "consumer groups subscribed to the topic")
	replicas := fs.Int("replicas", 1, "sidecar replicas sharing the database")
	concurrency := fs.Int("concurrency", 8, "concurrent publishing clients (and raw-update clients)")
	uri := fs.String("mongodb-uri", getenv("PULSE_MONGODB_URI"), "database to use instead of a fresh embedded development database (default $PULSE_MONGODB_URI)")
	timeout := fs.Duration("timeout", 30*time.Minute, "give up after this long")
	ordered := fs.Bool("ordered", false, "register the consumer groups as ordered (one POST at a time per group, in order)")
	keys := fs.Int("keys", 0, "give event i the ordering key k<i mod keys> (0: no keys); with --ordered, one line per key")
	delay := fs.Duration("receiver-delay", 0, "how long the receiver takes to answer each POST")
	if err := cli.Parse(fs, args, synopsis, stdout); err != nil {
		return err
	}
	if *keys < 0 || *delay < 0 {
		return cli.Usagef(cli.Usage(fs, synopsis), "bench: --keys and --receiver-delay must not be negative")
	}
	if *events < 1 || *groups < 1 || *concurrency < 1 || *replicas < 1 {
		return cli.Usagef(cli.Usage(fs, synopsis), "bench: --events, --groups, --replicas and --concurrency must be at least 1")
	}
	publishers := concurrency
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	if *uri == "" {
		dbURI, stop, err := startDevDB(ctx)
		if err != nil {
			return err
		}
		defer stop()
		*uri = dbURI
	}
	dbName := "bench_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")

	rcv := newReceiver()
	rcv.delay = *delay
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	rsrv := &http.Server{Handler: rcv}
	go func() { _ = rsrv.Serve(ln) }()
	defer rsrv.Close()

	var commands atomic.Int64
	var byNameMu sync.Mutex
	byName := map[string]int64{}
	timeByName := map[string]time.Duration{}
	counting := atomic.Bool{}
	took := func(name string, d time.Duration) {
		if counting.Load() {
			byNameMu.Lock()
			timeByName[name] += d
			byNameMu.Unlock()
		}
	}
	monitor := &event.CommandMonitor{
		Started: func(_ context.Context, e *event.CommandStartedEvent) {
			commands.Add(1)
			if counting.Load() {
				byNameMu.Lock()
				byName[e.CommandName]++
				byNameMu.Unlock()
			}
		},
		Succeeded: func(_ context.Context, e *event.CommandSucceededEvent) { took(e.CommandName, e.Duration) },
		Failed:    func(_ context.Context, e *event.CommandFailedEvent) { took(e.CommandName, e.Duration) },
	}
	sidecarCtx, stopSidecar := context.WithCancel(ctx)
	defer stopSidecar()
	env := map[string]string{"PULSE_MONGODB_URI": *uri, "PULSE_DATABASE": dbName, "PULSE_LISTEN": "127.0.0.1:0", "PULSE_LOG_LEVEL": "error"}
	apis := make([]string, *replicas)
	dones := make([]chan error, *replicas)
	for r := range *replicas {
		addr := make(chan string, 1)
		done := make(chan error, 1)
		dones[r] = done
		go func() {
			done <- sidecar(sidecarCtx, func(k string) string { return env[k] }, monitor, func(a string) { addr <- a })
		}()
		select {
		case a := <-addr:
			apis[r] = "http://" + a
		case err := <-done:
			return fmt.Errorf("bench: sidecar replica %d did not start: %w", r+1, err)
		}
	}
	api := apis[0]
	var stopOnce sync.Once
	shutdown := func() {
		stopOnce.Do(func() {
			stopSidecar()
			for _, done := range dones {
				<-done
			}
		})
	}
	defer shutdown()
	for g := range *groups {
		body := fmt.Sprintf(`{"url":"http://%s/g%d","topics":["bench"],"maxConcurrency":64,"ordered":%t}`, ln.Addr(), g, *ordered)
		if err := request(ctx, "PUT", fmt.Sprintf("%s/v1/endpoints/bench-%d", api, g), body, http.StatusCreated); err != nil {
			return err
		}
	}

	want := *events * *groups
	counting.Store(true)
	cpu0, start, cmd0 := cpuTime(), time.Now(), commands.Load()
	work := make(chan int)
	var wg sync.WaitGroup
	var pubErr atomic.Value
	for range *publishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				id := fmt.Sprintf("bench-%d", i)
				rcv.published(id)
				key := ""
				if *keys > 0 {
					key = fmt.Sprintf(`,"orderingKey":"k%d"`, i%*keys)
				}
				if err := request(ctx, "POST", apis[i%len(apis)]+"/v1/events", fmt.Sprintf(`{"id":%q,"topic":"bench","data":{"i":%d}%s}`, id, i, key), http.StatusAccepted); err != nil {
					pubErr.Store(err)
				}
			}
		}()
	}
	for i := range *events {
		work <- i
	}
	close(work)
	wg.Wait()
	if err, _ := pubErr.Load().(error); err != nil {
		return err
	}
	if err := rcv.wait(ctx, want); err != nil {
		return fmt.Errorf("bench: %w (%d of %d deliveries arrived)", err, rcv.distinct(), want)
	}
	elapsed := time.Since(start)
	cmds := commands.Load() - cmd0
	counting.Store(false)
	cpu := cpuTime() - cpu0
	shutdown()

	raw, err := rawUpdatesPerSecond(ctx, *uri, dbName, *publishers, 3*time.Second)
	if err != nil {
		return err
	}
	lat := rcv.latencies()
	r := result{
		Deliveries: rcv.distinct(), Duplicates: rcv.total() - rcv.distinct(), Seconds: elapsed.Seconds(),
		P50ms: percentile(lat, 0.50), P99ms: percentile(lat, 0.99),
		CommandsPerDelivery: float64(cmds) / float64(want), RawOpsPerSecond: raw,
		CPUusPerDelivery: float64(cpu.Microseconds()) / float64(want), PeakRSSMiB: peakRSSMiB(),
	}
	r.PerSecond = float64(r.Deliveries) / r.Seconds
	r.Efficiency = r.PerSecond * r.CommandsPerDelivery / r.RawOpsPerSecond
	byNameMu.Lock()
	r.ByCommand = maps.Clone(byName)
	r.TimeByCommand = maps.Clone(timeByName)
	byNameMu.Unlock()
	printResult(stdout, r, *events, *groups, *replicas)
	return nil
}

// printResult writes the table and the machine line of r.
func printResult(w io.Writer, r result, events, groups, replicas int) {
	fmt.Fprintf(w, "events %d × consumer groups %d, %d sidecar replica(s)\n", events, groups, replicas)
	for _, row := range []struct {
		k string
		v string
	}{
		{"deliveries", fmt.Sprint(r.Deliveries)}, {"duplicates", fmt.Sprint(r.Duplicates)},
		{"seconds", fmt.Sprintf("%.2f", r.Seconds)}, {"deliveries/s", fmt.Sprintf("%.1f", r.PerSecond)},
		{"latency p50 (publish → POST)", fmt.Sprintf("%.1f ms", r.P50ms)}, {"latency p99", fmt.Sprintf("%.1f ms", r.P99ms)},
		{"db commands per delivery", fmt.Sprintf("%.2f", r.CommandsPerDelivery)},
		{"raw db updates by _id/s", fmt.Sprintf("%.1f", r.RawOpsPerSecond)}, {"efficiency", fmt.Sprintf("%.2f", r.Efficiency)},
		{"sidecar CPU per delivery", fmt.Sprintf("%.0f µs", r.CPUusPerDelivery)}, {"peak RSS", fmt.Sprintf("%.1f MiB", r.PeakRSSMiB)},
	} {
		fmt.Fprintf(w, "  %-30s %s\n", row.k, row.v)
	}
	names := slices.SortedFunc(maps.Keys(r.ByCommand), func(a, b string) int { return cmp.Compare(r.ByCommand[b], r.ByCommand[a]) })
	for _, name := range names {
		n := r.ByCommand[name]
		fmt.Fprintf(w, "  %-30s %d (%.2f per delivery, %.1f ms mean round trip)\n", "  db "+name, n,
			float64(n)/float64(max(r.Deliveries, 1)), float64(r.TimeByCommand[name].Microseconds())/1000/float64(n))
	}
	fmt.Fprintf(w, "bench: deliveries=%d duplicates=%d seconds=%.2f deliveries_per_s=%.2f p50_ms=%.1f p99_ms=%.1f db_commands_per_delivery=%.2f raw_db_ops_per_s=%.1f efficiency=%.3f sidecar_cpu_us_per_delivery=%.0f peak_rss_mib=%.1f\n",
		r.Deliveries, r.Duplicates, r.Seconds, r.PerSecond, r.P50ms, r.P99ms, r.CommandsPerDelivery, r.RawOpsPerSecond, r.Efficiency, r.CPUusPerDelivery, r.PeakRSSMiB)
}

// startDevDB runs `<this executable> devdb` on a temporary directory and returns its URI and a function that
// kills it and removes the directory.
func startDevDB(ctx context.Context) (string, func(), error) {
	dir, err := os.MkdirTemp("", "pulse-bench-")
	if err != nil {
		return "", nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command(self, "devdb", "--listen", "127.0.0.1:0", "--data-dir", dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", nil, err
	}
	cmd.Stderr = io.Discard
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop := func() { _ = cmd.Process.Kill(); _ = cmd.Wait(); _ = os.RemoveAll(dir) }
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if uri, ok := strings.CutPrefix(sc.Text(), "devdb: "); ok {
			go func() { _, _ = io.Copy(io.Discard, out) }()
			return uri, stop, nil
		}
	}
	stop()
	return "", nil, errors.New("bench: the development database did not start")
}

// request sends body with method to url and returns an error unless the answer has status want.
func request(ctx context.Context, method, url, body string, want int) error {
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		return fmt.Errorf("bench: %s %s answered %d: %s", method, url, resp.StatusCode, bytes.TrimSpace(b))
	}
	return nil
}
