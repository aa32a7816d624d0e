// Package bench is `pulse bench`: it measures delivery throughput, latency from publish to POST, database
// commands per delivery, and the sidecars' CPU and peak memory, against a fresh embedded development database
// (a child process, so its CPU and memory are not the sidecars') or a database the caller names.
//
// The sidecars run in-process (package sidecar, through NewSidecar), so a driver command monitor counts their commands. The package is
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

// Sidecar is one sidecar replica as bench runs it, with the shared lifecycle (package sidecar's Sidecar):
// Start returns once its API listens at Addr (host:port), Stop shuts it down and blocks until it has; the
// end of Start's ctx shuts it down too.
type Sidecar interface {
	Start(ctx context.Context) error
	Addr() string
	Stop()
}

// NewSidecar returns an unstarted replica configured by getenv, which sends every database command to
// monitor and writes its log to logs; it returns an error for a configuration that does not load. `pulse
// bench` passes sidecar.New; bench itself never imports the sidecar's wiring, which imports every other
// package.
type NewSidecar func(getenv func(string) string, monitor *event.CommandMonitor, logs io.Writer) (Sidecar, error)

// result holds the figures `pulse bench` prints.
type result struct {
	Deliveries, Duplicates  int
	Seconds                 float64
	PerSecond               float64
	P50ms, P99ms            float64 // publish → POST
	PublishP50ms            float64 // publish request → 202
	PublishP99ms            float64
	CommandsPerDelivery     float64
	DocsWrittenPerDelivery  float64 // documents inserted, updated and deleted (the command replies' counts; docsWritten)
	RawOpsPerSecond         float64
	Efficiency              float64
	PerRawOp                float64 // deliveries/s ÷ raw updates/s
	CPUusPerDelivery        float64 // the sidecars' share of ProcessCPUusPerDelivery (see startProfile)
	ProcessCPUusPerDelivery float64 // this process's CPU: the sidecars, the receiver and the publishers
	PeakRSSMiB              float64
	Warnings, Errors        int                      // the sidecars' log records at warn and error level, over the whole run (history included)
	LeaseLosses             int                      // those of them that tell of a lost lease (see leaseLost)
	LogKinds                []string                 // those records by level, component and message
	DBCPUusPerDelivery      float64                  // the embedded database process's CPU during the measured run, per delivery (-1: not the bench's child)
	IdleDBCPUPercent        float64                  // the database process's CPU while the sidecars idled (-1: not measured)
	IdleCommandsPerSecond   float64                  // the sidecars' database commands per second meanwhile
	ByCommand               map[string]int64         // database commands by name, during the measured run
	TimeByCommand           map[string]time.Duration // their summed round-trip times
}

// synopsis starts the text of `pulse bench --help`.
const synopsis = `Usage: pulse bench [flags]

Measures delivery throughput, latency and database commands per delivery against a fresh embedded
development database (or --mongodb-uri), and prints a table and one machine-readable line starting "bench:".
--history delivers events first (untimed, kept); --rate publishes at a fixed rate instead of as fast as
--concurrency clients can; --pending N measures the drain of N events published while the groups were
paused; --idle then measures what idle sidecars cost the embedded database process. Long phases print
their progress on stderr every few seconds.`

// flags are the flags of `pulse bench`.
type flags struct {
	events, groups, replicas, concurrency, keys, history int
	pending                                              int
	rate                                                 float64
	uri                                                  string
	timeout, delay, idle                                 time.Duration
	cpuProfile                                           string
	ordered                                              bool
	progress                                             io.Writer // progress lines of long phases (stderr)
}

// Run is `pulse bench` with the command line args (the flags after "bench"). It starts the embedded
// development database as a child process, `<this executable> devdb` (so the executable must be pulse),
// unless PULSE_MONGODB_URI or --mongodb-uri names one; runs --replicas sidecars in-process (each made by
// newSidecar); registers
// --groups consumer groups on a local receiver; publishes and delivers --history events first (untimed,
// arrays of 100, kept as retained history); then publishes --events events, one request per event, with
// --concurrency concurrent clients spread over the replicas (or, with --rate R, R requests per second
// whatever the answers take); waits for every delivery; leaves the sidecars idle for --idle; then measures
// raw single-document updates by _id on the same database at the same concurrency. It prints a table and
// one machine-readable line starting with "bench:" on stdout, and blocks until done or --timeout. It
// returns a *cli.UsageError for flags it does not accept and flag.ErrHelp after printing --help.
func Run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer, newSidecar NewSidecar) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	var o flags
	fs.IntVar(&o.events, "events", 1000, "events to publish in the measured run")
	fs.IntVar(&o.groups, "groups", 2, "consumer groups subscribed to the topic")
	fs.IntVar(&o.replicas, "replicas", 1, "sidecar replicas sharing the database")
	fs.IntVar(&o.concurrency, "concurrency", 8, "concurrent publishing clients (and raw-update clients)")
	fs.Float64Var(&o.rate, "rate", 0, "publish `R` events per second, open loop (each a one-event request, sent when due whatever earlier ones take); 0: as fast as --concurrency clients can")
	fs.IntVar(&o.history, "history", 0, "publish and deliver `N` events first, untimed; they stay as retained history during the measured run")
	fs.IntVar(&o.pending, "pending", 0, "measure the drain of a backlog instead of a publish run: pause the groups, publish `N` events (untimed, arrays of 100), wait until they are fanned out, resume the groups and measure until every delivery arrived")
	fs.DurationVar(&o.idle, "idle", 0, "after the measured run, leave the sidecars idle this long and report the embedded database process's CPU meanwhile")
	fs.StringVar(&o.uri, "mongodb-uri", getenv("PULSE_MONGODB_URI"), "database to use instead of a fresh embedded development database (default $PULSE_MONGODB_URI)")
	fs.DurationVar(&o.timeout, "timeout", 30*time.Minute, "give up after this long")
	fs.BoolVar(&o.ordered, "ordered", false, "register the consumer groups as ordered (one POST at a time per group, in order)")
	fs.IntVar(&o.keys, "keys", 0, "give event i the ordering key k<i mod keys> (0: no keys); with --ordered, one line per key")
	fs.DurationVar(&o.delay, "receiver-delay", 0, "how long the receiver takes to answer each POST")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of this process (the sidecars, the receiver and the publishers) during the measured run to `file`")
	if err := cli.Parse(fs, args, synopsis, stdout); err != nil {
		return err
	}
	if o.keys < 0 || o.delay < 0 || o.history < 0 || o.rate < 0 || o.idle < 0 || o.pending < 0 {
		return cli.Usagef(cli.Usage(fs, synopsis), "bench: --keys, --receiver-delay, --history, --rate, --idle and --pending must not be negative")
	}
	if o.pending > 0 && o.rate > 0 {
		return cli.Usagef(cli.Usage(fs, synopsis), "bench: --pending measures a drain, not a publish run: it does not take --rate")
	}
	o.progress = os.Stderr
	if o.events < 1 || o.groups < 1 || o.concurrency < 1 || o.replicas < 1 {
		return cli.Usagef(cli.Usage(fs, synopsis), "bench: --events, --groups, --replicas and --concurrency must be at least 1")
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	dbPID := 0
	if o.uri == "" {
		dbURI, pid, stop, err := startDevDB(ctx)
		if err != nil {
			return err
		}
		defer stop()
		o.uri, dbPID = dbURI, pid
	}
	r, err := run(ctx, o, dbPID, newSidecar)
	if err != nil {
		return err
	}
	printResult(stdout, r, o)
	return nil
}

// run runs the bench o describes; dbPID is the embedded database process (0: not ours).
func run(ctx context.Context, o flags, dbPID int, newSidecar NewSidecar) (result, error) {
	dbName := "bench_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	rcv := newReceiver()
	rcv.delay = o.delay
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return result{}, err
	}
	rsrv := &http.Server{Handler: rcv}
	go harness(ctx, func(context.Context) { _ = rsrv.Serve(ln) })
	defer rsrv.Close()

	var commands, written atomic.Int64
	var byNameMu sync.Mutex
	byName := map[string]int64{}
	timeByName := map[string]time.Duration{}
	counting := atomic.Bool{}
	started := map[int64]string{} // request id → command name and collection, while counting
	took := func(id int64, d time.Duration) {
		if counting.Load() {
			byNameMu.Lock()
			if name, ok := started[id]; ok {
				timeByName[name] += d
				delete(started, id)
			}
			byNameMu.Unlock()
		}
	}
	monitor := &event.CommandMonitor{
		Started: func(_ context.Context, e *event.CommandStartedEvent) {
			commands.Add(1)
			if counting.Load() {
				name := commandName(e)
				byNameMu.Lock()
				byName[name]++
				started[e.RequestID] = name
				byNameMu.Unlock()
			}
		},
		Succeeded: func(_ context.Context, e *event.CommandSucceededEvent) {
			written.Add(docsWritten(e.CommandName, e.Reply))
			took(e.RequestID, e.Duration)
		},
		Failed: func(_ context.Context, e *event.CommandFailedEvent) { took(e.RequestID, e.Duration) },
	}
	logs := newLogCounter()
	env := map[string]string{"PULSE_MONGODB_URI": o.uri, "PULSE_DATABASE": dbName, "PULSE_LISTEN": "127.0.0.1:0", "PULSE_LOG_LEVEL": "warn"}
	apis := make([]string, o.replicas)
	sidecars := make([]Sidecar, 0, o.replicas)
	shutdown := func() { // stops every replica, each once; safe twice
		for _, s := range sidecars {
			s.Stop()
		}
	}
	defer shutdown()
	for r := range o.replicas {
		s, err := newSidecar(func(k string) string { return env[k] }, monitor, logs)
		if err != nil {
			return result{}, err
		}
		if err := s.Start(ctx); err != nil {
			return result{}, fmt.Errorf("bench: sidecar replica %d did not start: %w", r+1, err)
		}
		sidecars = append(sidecars, s)
		apis[r] = "http://" + s.Addr()
	}
	// The log is counted from here on, the history burst included (issue 26 found duplicates there that no
	// count showed), until the shutdown; the start-up notices are not the run's.
	logs.counting.Store(true)
	for g := range o.groups {
		body := fmt.Sprintf(`{"url":"http://%s/g%d","topics":["bench"],"maxConcurrency":64,"ordered":%t}`, ln.Addr(), g, o.ordered)
		if err := request(ctx, "PUT", fmt.Sprintf("%s/v1/endpoints/bench-%d", apis[0], g), body, http.StatusCreated); err != nil {
			return result{}, err
		}
	}
	pub := &publisher{apis: apis, rcv: rcv, keys: o.keys}
	if o.history > 0 {
		stop := progress(o.progress, "history: deliveries", o.history*o.groups, rcv.distinct)
		err := pub.history(ctx, "hist", o.history, o.concurrency)
		if err == nil {
			err = rcv.wait(ctx, o.history*o.groups)
		}
		stop()
		if err != nil {
			return result{}, fmt.Errorf("bench: history: %w (%d of %d deliveries arrived)", err, rcv.distinct(), o.history*o.groups)
		}
	}
	before := rcv.distinct()
	groups := make([]string, o.groups)
	for g := range groups {
		groups[g] = fmt.Sprintf("bench-%d", g)
	}
	if o.pending > 0 {
		if err := backlog(ctx, o, apis[0], groups, pub); err != nil {
			return result{}, err
		}
	}

	want := o.events * o.groups
	if o.pending > 0 {
		want = o.pending * o.groups
	}
	counting.Store(true)
	stopProfile, err := startProfile(o.cpuProfile)
	if err != nil {
		return result{}, err
	}
	defer stopProfile() // a no-op after the measured run's own stop; stops the profile of a run that failed
	stopProgress := progress(o.progress, map[bool]string{false: "run: deliveries", true: "drain: deliveries"}[o.pending > 0], want,
		func() int { return rcv.distinct() - before })
	cpu0, start, cmd0, written0 := cpuTime(), time.Now(), commands.Load(), written.Load()
	db0, err := dbCPU(dbPID)
	if err != nil {
		return result{}, err
	}
	if o.pending > 0 {
		for i := range o.pending {
			rcv.published(fmt.Sprintf("pend-%d", i), start) // the wait counts from the resume
		}
		for _, g := range groups {
			if err := request(ctx, "POST", fmt.Sprintf("%s/v1/endpoints/%s/resume", apis[0], g), "", http.StatusOK); err != nil {
				return result{}, err
			}
		}
	} else {
		harness(ctx, func(ctx context.Context) {
			// A client of its own, so that its connections are dialled by (and labelled as) the harness.
			t := http.DefaultTransport.(*http.Transport).Clone()
			t.MaxIdleConnsPerHost = 64
			pub.client = &http.Client{Transport: t}
			defer t.CloseIdleConnections()
			if o.rate > 0 {
				pub.openLoop(ctx, o.events, o.rate)
			} else {
				pub.closedLoop(ctx, o.events, o.concurrency)
			}
		})
	}
	if pub.err != nil {
		return result{}, pub.err
	}
	err = rcv.wait(ctx, before+want)
	stopProgress()
	if err != nil {
		return result{}, fmt.Errorf("bench: %w (%d of %d deliveries arrived)", err, rcv.distinct()-before, want)
	}
	elapsed := time.Since(start)
	cpu := cpuTime() - cpu0
	db1, err := dbCPU(dbPID)
	if err != nil {
		return result{}, err
	}
	share, err := stopProfile()
	if err != nil {
		return result{}, err
	}
	cmds, docs := commands.Load()-cmd0, written.Load()-written0
	counting.Store(false)
	idle, idleCommands := -1.0, 0.0
	if o.idle > 0 {
		before := commands.Load()
		if idle, err = idleCPU(ctx, dbPID, o.idle); err != nil {
			return result{}, err
		}
		idleCommands = float64(commands.Load()-before) / o.idle.Seconds()
	}
	logs.counting.Store(false) // the shutdown's own records are not the run's
	shutdown()

	raw, err := rawUpdatesPerSecond(ctx, o.uri, dbName, o.concurrency, 3*time.Second)
	if err != nil {
		return result{}, err
	}
	lat, publat := rcv.latencies(), pub.latencies()
	r := result{
		Deliveries: rcv.distinct() - before, Duplicates: rcv.total() - rcv.distinct(), Seconds: elapsed.Seconds(),
		P50ms: percentile(lat, 0.50), P99ms: percentile(lat, 0.99),
		PublishP50ms: percentile(publat, 0.50), PublishP99ms: percentile(publat, 0.99),
		CommandsPerDelivery: float64(cmds) / float64(want), DocsWrittenPerDelivery: float64(docs) / float64(want), RawOpsPerSecond: raw,
		ProcessCPUusPerDelivery: float64(cpu.Microseconds()) / float64(want), PeakRSSMiB: peakRSSMiB(),
		IdleDBCPUPercent: idle, IdleCommandsPerSecond: idleCommands, DBCPUusPerDelivery: -1,
	}
	if dbPID != 0 {
		r.DBCPUusPerDelivery = float64((db1 - db0).Microseconds()) / float64(want)
	}
	r.CPUusPerDelivery = share * r.ProcessCPUusPerDelivery
	r.PerSecond = float64(r.Deliveries) / r.Seconds
	r.Efficiency = r.PerSecond * r.CommandsPerDelivery / r.RawOpsPerSecond
	r.PerRawOp = r.PerSecond / r.RawOpsPerSecond
	r.Warnings, r.Errors, r.LeaseLosses, r.LogKinds = logs.counts()
	byNameMu.Lock()
	r.ByCommand = maps.Clone(byName)
	r.TimeByCommand = maps.Clone(timeByName)
	byNameMu.Unlock()
	return r, nil
}

// dbCPU returns the CPU time the database process pid has used (processCPU), or 0 when pid is 0 (the
// database is not the bench's child).
func dbCPU(pid int) (time.Duration, error) {
	if pid == 0 {
		return 0, nil
	}
	return processCPU(pid)
}

// idleCPU waits d and returns the CPU the database process pid used meanwhile, in percent of one core; -1
// when pid is 0 (the database is not the bench's child).
func idleCPU(ctx context.Context, pid int, d time.Duration) (float64, error) {
	var cpu0 time.Duration
	if pid != 0 {
		var err error
		if cpu0, err = processCPU(pid); err != nil {
			return 0, err
		}
	}
	start := time.Now()
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(d):
	}
	if pid == 0 {
		return -1, nil
	}
	cpu1, err := processCPU(pid)
	if err != nil {
		return 0, err
	}
	return 100 * float64(cpu1-cpu0) / float64(time.Since(start)), nil
}

// printResult writes the table and the machine line of r.
func printResult(w io.Writer, r result, o flags) {
	if o.pending > 0 {
		fmt.Fprintf(w, "drain of %d events × consumer groups %d published while paused, %d sidecar replica(s)", o.pending, o.groups, o.replicas)
	} else {
		fmt.Fprintf(w, "events %d × consumer groups %d, %d sidecar replica(s)", o.events, o.groups, o.replicas)
	}
	if o.history > 0 {
		fmt.Fprintf(w, ", after %d events delivered and retained", o.history)
	}
	if o.rate > 0 {
		fmt.Fprintf(w, ", %g publishes/s", o.rate)
	}
	fmt.Fprintln(w)
	rows := []struct {
		k string
		v string
	}{
		{"deliveries", fmt.Sprint(r.Deliveries)}, {"duplicates", fmt.Sprint(r.Duplicates)},
		{"seconds", fmt.Sprintf("%.2f", r.Seconds)}, {"deliveries/s", fmt.Sprintf("%.1f", r.PerSecond)},
		{map[bool]string{false: "latency p50 (publish → POST)", true: "wait p50 (resume → POST)"}[o.pending > 0], fmt.Sprintf("%.1f ms", r.P50ms)},
		{map[bool]string{false: "latency p99", true: "wait p99"}[o.pending > 0], fmt.Sprintf("%.1f ms", r.P99ms)},
		{"publish p50 (request → 202)", fmt.Sprintf("%.1f ms", r.PublishP50ms)}, {"publish p99", fmt.Sprintf("%.1f ms", r.PublishP99ms)},
		{"db commands per delivery", fmt.Sprintf("%.2f", r.CommandsPerDelivery)},
		{"db documents written per delivery", fmt.Sprintf("%.2f", r.DocsWrittenPerDelivery)},
		{"raw db updates by _id/s", fmt.Sprintf("%.1f", r.RawOpsPerSecond)}, {"efficiency", fmt.Sprintf("%.2f", r.Efficiency)},
		{"deliveries per raw update", fmt.Sprintf("%.3f", r.PerRawOp)},
		{"sidecar CPU per delivery", fmt.Sprintf("%.0f µs", r.CPUusPerDelivery)},
		{"bench process CPU per delivery", fmt.Sprintf("%.0f µs (sidecars, receiver, publishers)", r.ProcessCPUusPerDelivery)}, {"peak RSS", fmt.Sprintf("%.1f MiB", r.PeakRSSMiB)},
		{"log warnings, errors", fmt.Sprintf("%d, %d (whole run)", r.Warnings, r.Errors)},
		{"lease losses", fmt.Sprint(r.LeaseLosses)},
	}
	if r.DBCPUusPerDelivery >= 0 {
		rows = append(rows, struct{ k, v string }{"database CPU per delivery", fmt.Sprintf("%.0f µs (the embedded database process)", r.DBCPUusPerDelivery)})
	}
	if r.IdleDBCPUPercent >= 0 {
		rows = append(rows, struct{ k, v string }{fmt.Sprintf("database CPU, idle %s", o.idle), fmt.Sprintf("%.1f%% of a core", r.IdleDBCPUPercent)},
			struct{ k, v string }{"db commands/s, idle", fmt.Sprintf("%.2f", r.IdleCommandsPerSecond)})
	}
	for _, row := range rows {
		fmt.Fprintf(w, "  %-30s %s\n", row.k, row.v)
	}
	for _, k := range r.LogKinds[:min(len(r.LogKinds), 10)] {
		fmt.Fprintf(w, "    %s\n", k)
	}
	names := slices.SortedFunc(maps.Keys(r.ByCommand), func(a, b string) int { return cmp.Compare(r.ByCommand[b], r.ByCommand[a]) })
	for _, name := range names {
		n := r.ByCommand[name]
		fmt.Fprintf(w, "  %-40s %d (%.2f per delivery, %.1f ms mean round trip)\n", "  db "+name, n,
			float64(n)/float64(max(r.Deliveries, 1)), float64(r.TimeByCommand[name].Microseconds())/1000/float64(n))
	}
	fmt.Fprintf(w, "bench: deliveries=%d duplicates=%d seconds=%.2f deliveries_per_s=%.2f p50_ms=%.1f p99_ms=%.1f db_commands_per_delivery=%.2f raw_db_ops_per_s=%.1f efficiency=%.3f sidecar_cpu_us_per_delivery=%.0f process_cpu_us_per_delivery=%.0f peak_rss_mib=%.1f publish_p50_ms=%.1f publish_p99_ms=%.1f deliveries_per_raw_op=%.3f log_warnings=%d log_errors=%d lease_losses=%d docs_written_per_delivery=%.2f",
		r.Deliveries, r.Duplicates, r.Seconds, r.PerSecond, r.P50ms, r.P99ms, r.CommandsPerDelivery, r.RawOpsPerSecond, r.Efficiency, r.CPUusPerDelivery, r.ProcessCPUusPerDelivery, r.PeakRSSMiB,
		r.PublishP50ms, r.PublishP99ms, r.PerRawOp, r.Warnings, r.Errors, r.LeaseLosses, r.DocsWrittenPerDelivery)
	if r.DBCPUusPerDelivery >= 0 {
		fmt.Fprintf(w, " db_cpu_us_per_delivery=%.0f", r.DBCPUusPerDelivery)
	}
	if r.IdleDBCPUPercent >= 0 {
		fmt.Fprintf(w, " idle_db_cpu_pct=%.2f idle_db_commands_per_s=%.2f", r.IdleDBCPUPercent, r.IdleCommandsPerSecond)
	}
	if o.pending > 0 {
		fmt.Fprintf(w, " pending=%d", o.pending)
	}
	fmt.Fprintln(w)
}

// startDevDB runs `<this executable> devdb` on a temporary directory and returns its URI, its process id and
// a function that kills it and removes the directory.
func startDevDB(ctx context.Context) (string, int, func(), error) {
	dir, err := os.MkdirTemp("", "pulse-bench-")
	if err != nil {
		return "", 0, nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return "", 0, nil, err
	}
	cmd := exec.Command(self, "devdb", "--listen", "127.0.0.1:0", "--data-dir", dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", 0, nil, err
	}
	cmd.Stderr = io.Discard
	if err := cmd.Start(); err != nil {
		return "", 0, nil, err
	}
	stop := func() { _ = cmd.Process.Kill(); _ = cmd.Wait(); _ = os.RemoveAll(dir) }
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if uri, ok := strings.CutPrefix(sc.Text(), "devdb: "); ok {
			go func() { _, _ = io.Copy(io.Discard, out) }()
			return uri, cmd.Process.Pid, stop, nil
		}
	}
	stop()
	return "", 0, nil, errors.New("bench: the development database did not start")
}

// commandName returns the command's name and, when its first field names one, its collection: "update
// pulse.history".
func commandName(e *event.CommandStartedEvent) string {
	elems, err := e.Command.Elements()
	if err != nil || len(elems) == 0 {
		return e.CommandName
	}
	if coll, ok := elems[0].Value().StringValueOK(); ok && elems[0].Key() == e.CommandName {
		return e.CommandName + " " + coll
	}
	return e.CommandName
}

// request sends body with method to url and returns an error unless the answer has status want.
func request(ctx context.Context, method, url, body string, want int) error {
	return send(ctx, nil, method, url, body, want)
}

// send is request through client (nil: http.DefaultClient).
func send(ctx context.Context, client *http.Client, method, url, body string, want int) error {
	if client == nil {
		client = http.DefaultClient
	}
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
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
