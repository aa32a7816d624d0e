package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"time"

	"go.mongodb.org/mongo-driver/v2/event"

	"github.com/pulse-sidecar/pulse/config"
	"github.com/pulse-sidecar/pulse/internal/bench"
	"github.com/pulse-sidecar/pulse/internal/cli"
	"github.com/pulse-sidecar/pulse/internal/devdb"
	"github.com/pulse-sidecar/pulse/sidecar"
)

// runDevDB runs the embedded development database on its own (pulse devdb --listen --data-dir).
func runDevDB(ctx context.Context, args []string, stdout io.Writer) error {
	return devdb.RunCommand(ctx, args, stdout, os.Stderr)
}

// runBench runs `pulse bench` (package internal/bench), whose sidecars run in-process: each one a
// sidecar.Sidecar of the configuration bench gives, reporting this build's version.
func runBench(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	return bench.Run(ctx, args, getenv, stdout, func(getenv func(string) string, monitor *event.CommandMonitor, logs io.Writer) (bench.Sidecar, error) {
		cfg, err := config.Load(getenv)
		if err != nil {
			return nil, err
		}
		return sidecar.New(cfg, sidecar.Options{Version: binaryVersion().Version, Logs: logs, Monitor: monitor}), nil
	})
}

const healthcheckSynopsis = `Usage: pulse healthcheck [flags]

Exits 0 when GET /readyz of the sidecar answers 200, 1 otherwise: the container healthcheck of an image
without a shell. The sidecar's address is read from PULSE_PROBE_LISTEN when set, else PULSE_LISTEN, as serve
reads them (a wildcard host such as 0.0.0.0 or [::] is reached on loopback); --url overrides it.`

// healthcheck GETs the sidecar's /readyz (at PULSE_PROBE_LISTEN, else PULSE_LISTEN, or --url) and returns an error unless it answers
// 200: the container healthcheck of an image without a shell. It blocks for at most --timeout.
func healthcheck(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	fs := flag.NewFlagSet("healthcheck", flag.ContinueOnError)
	rawURL := fs.String("url", "", "`URL` that must answer 200 (default http://<PULSE_PROBE_LISTEN or PULSE_LISTEN>/readyz)")
	timeout := fs.Duration("timeout", 3*time.Second, "deadline of the request")
	if err := cli.Parse(fs, args, healthcheckSynopsis, stdout); err != nil {
		return err
	}
	target := *rawURL
	if target == "" {
		// Only the addresses matter here: a healthcheck run by hand with part of serve's environment must
		// not fail on a variable it does not use.
		name, listen := "PULSE_LISTEN", cmp.Or(getenv("PULSE_LISTEN"), config.DefaultListen)
		if p := getenv("PULSE_PROBE_LISTEN"); p != "" {
			name, listen = "PULSE_PROBE_LISTEN", p
		}
		if _, _, err := net.SplitHostPort(listen); err != nil {
			return fmt.Errorf("%s=%q is not a host:port address: %w", name, listen, err)
		}
		target = readyURL(listen)
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s answered %s", target, resp.Status)
	}
	return nil
}

// readyURL returns the /readyz URL of a sidecar listening on listen (PULSE_PROBE_LISTEN or PULSE_LISTEN): a wildcard or empty host
// becomes the loopback address of its family, since a wildcard is an address to bind, not to dial.
func readyURL(listen string) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil { // config.Validate has accepted it; keep it as written
		return "http://" + listen + "/readyz"
	}
	switch host {
	case "", "0.0.0.0":
		host = "127.0.0.1"
	case "::":
		host = "::1"
	}
	return (&url.URL{Scheme: "http", Host: net.JoinHostPort(host, port), Path: "/readyz"}).String()
}
