package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"reflect"
	"strings"

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
		return err
	}
	hooks, err := testHooks(getenv)
	if err != nil {
		return err
	}
	cfg, err := config.Load(getenv)
	if err != nil {
		return err
	}
	s := sidecar.New(cfg, sidecar.Options{Version: version, Logs: stdout, TestHooks: hooks})
	if err := s.Start(ctx); err != nil {
		return err
	}
	return s.Wait()
}

// serveUsage is the text of `pulse serve --help`: the configuration variables with their defaults, read
// from config.Config's tags so that the list cannot fall behind.
func serveUsage() string {
	var b strings.Builder
	b.WriteString("Usage: pulse [serve]\n\nRuns the sidecar. It takes no flags: the configuration comes from these environment\nvariables (see the README for each one):\n\n")
	t := reflect.TypeOf(config.Config{})
	for i := range t.NumField() {
		name := t.Field(i).Tag.Get("env")
		if name == "" {
			continue
		}
		if def, ok := t.Field(i).Tag.Lookup("envDefault"); ok {
			fmt.Fprintf(&b, "  %-26s default %s\n", name, def)
		} else {
			fmt.Fprintf(&b, "  %s\n", name)
		}
	}
	return b.String()
}
