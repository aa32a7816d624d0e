package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/pulse-sidecar/pulse/internal/cli"
	"github.com/pulse-sidecar/pulse/mongo/devdb"
)

// runDevDB runs the embedded development database on its own (pulse devdb --listen --data-dir).
func runDevDB(ctx context.Context, args []string, stdout io.Writer) error {
	return devdb.RunCommand(ctx, args, stdout)
}

// healthcheck GETs a URL (default http://127.0.0.1:8080/readyz) and returns an error unless it answers 200:
// the container healthcheck of an image without a shell.
func healthcheck(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	fs := flag.NewFlagSet("healthcheck", flag.ContinueOnError)
	url := fs.String("url", "http://127.0.0.1:8080/readyz", "URL that must answer 200")
	timeout := fs.Duration("timeout", 3*time.Second, "deadline of the request")
	if err := cli.Parse(fs, args, "Usage: pulse healthcheck [flags]\n\nExits 0 when the URL answers 200, 1 otherwise: the container healthcheck of an image without a shell.", stdout); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, *url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s answered %s", *url, resp.Status)
	}
	return nil
}
