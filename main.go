// Command pulse is the Pulse sidecar: it takes events from an application over HTTP, stores them durably in
// MongoDB and delivers each one to the webhook of every consumer group subscribed to its topic.
//
// Subcommands: serve (the default), devdb (the embedded development database on its own), bench (delivery
// throughput, latency and database commands per delivery), healthcheck and version.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// version is stamped at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		stop() // a second signal now ends the process at once (default action)
	}()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "pulse:", err)
		os.Exit(1)
	}
}

// run is the whole program: it parses args and the environment (through getenv), and blocks until ctx is
// done or the subcommand ends. It returns nil on a clean shutdown.
func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	cmd := "serve"
	if len(args) > 0 && args[0] != "" && args[0][0] != '-' {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "serve":
		return serve(ctx, args, getenv, stdout)
	case "devdb":
		return runDevDB(ctx, args, stdout)
	case "bench":
		return runBench(ctx, args, getenv, stdout)
	case "healthcheck":
		return healthcheck(ctx, args)
	case "version":
		_, err := fmt.Fprintln(stdout, version)
		return err
	default:
		return fmt.Errorf("unknown command %q (want serve, devdb, bench, healthcheck or version)", cmd)
	}
}
