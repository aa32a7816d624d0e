package main

import (
	"context"
	"flag"
	"io"

	"github.com/pulse-sidecar/pulse/config"
	"github.com/pulse-sidecar/pulse/internal/cli"
	"github.com/pulse-sidecar/pulse/sidecar"
)

// serve runs the sidecar (package sidecar) until ctx is done, then shuts it down in the order
// that package documents. It returns nil after a clean shutdown, and an error when the sidecar cannot start
// or an HTTP server fails.
func serve(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	if err := cli.Parse(fs, args, serveUsage(), stdout); err != nil {
		return cli.WithHint(err, serveHint)
	}
	hooks, err := testHooks(getenv)
	if err != nil {
		return err
	}
	cfg, err := config.Load(getenv)
	if err != nil {
		return err
	}
	s := sidecar.New(cfg, sidecar.Options{Version: binaryVersion().Version, Logs: stdout, TestHooks: hooks})
	if err := s.Start(ctx); err != nil {
		return err
	}
	return s.Wait()
}

// serveHint is the line a flag or an argument given to serve prints after its reason, in place of serve's
// usage (a hundred lines of variables): the configuration is the environment's.
const serveHint = "pulse serve takes no flags; set PULSE_LISTEN=127.0.0.1:8080 and the other PULSE_* variables instead (pulse serve --help lists them)"

// serveUsage is the text of `pulse serve --help`: every configuration variable with its default and meaning,
// from config.Variables (the same text as docs/configuration.md), so that the list cannot fall behind.
func serveUsage() string {
	return "Usage: pulse [serve]\n\nRuns the sidecar. It takes no flags: the configuration comes from these environment\nvariables (docs/configuration.md says more of each):\n\n" +
		config.HelpText(100)
}
