// Command pulse is the Pulse sidecar: it takes events from an application over HTTP, stores them durably in
// MongoDB and delivers each one to the webhook of every consumer group subscribed to its topic.
//
// Subcommands: serve (the default), devdb (the embedded development database on its own), bench (delivery
// throughput, latency and database commands per delivery), healthcheck, version and help.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/pulse-sidecar/pulse/internal/cli"
)

// usage is the text of `pulse help`.
const usage = `Usage: pulse [command] [flags]

Commands:
  serve        run the sidecar (the default); configured by PULSE_* environment variables
  devdb        run the embedded development database on its own, for sidecars started with PULSE_MONGODB_URI
  bench        measure delivery throughput, latency and database commands per delivery
  healthcheck  exit 0 when the sidecar's /readyz (PULSE_PROBE_LISTEN, else PULSE_LISTEN) answers 200 (container healthchecks)
  version      print the version (also: pulse --version)
  help         print this text, or a command's usage with: pulse help <command>

Run "pulse <command> --help" for a command's flags.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		stop() // a second signal now ends the process at once (default action)
	}()
	os.Exit(exitCode(run(ctx, os.Args[1:], os.Getenv, os.Stdout), os.Stderr))
}

// exitCode reports err on stderr and returns the process's exit status: 0 for nil, 2 for a command line the
// program does not accept (with the usage, or its one-line hint), 1 for anything else.
func exitCode(err error, stderr io.Writer) int {
	if err == nil {
		return 0
	}
	fmt.Fprintln(stderr, "pulse:", err)
	var ue *cli.UsageError
	if errors.As(err, &ue) {
		if ue.Hint != "" {
			fmt.Fprint(stderr, ue.Shown())
		} else {
			fmt.Fprint(stderr, "\n", ue.Shown())
		}
		return cli.ExitUsage
	}
	return 1
}

// run is the whole program: it parses args and the environment (through getenv), and blocks until ctx is
// done or the subcommand ends. It returns nil on a clean shutdown and after printing help, and a
// *cli.UsageError for a command line it does not accept.
func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	err := dispatch(ctx, args, getenv, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return nil // the usage has been printed
	}
	return err
}

func dispatch(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	if cli.IsHelp(args) {
		_, err := io.WriteString(stdout, usage)
		return err
	}
	cmd := "serve"
	if len(args) > 0 {
		switch a := args[0]; {
		case a == "--version" || a == "-version":
			if len(args) > 1 {
				return cli.Usagef(usage, "%s takes no arguments, got %q", a, args[1:])
			}
			cmd, args = "version", nil
		case a == "help": // pulse help <command>: that command's usage
			if len(args) != 2 {
				return cli.Usagef(usage, "help takes at most one command, got %q", args[1:])
			}
			if cli.IsHelp(args[1:]) { // pulse help help, pulse help --help
				_, err := io.WriteString(stdout, usage)
				return err
			}
			cmd, args = args[1], []string{"--help"}
		case a != "" && a[0] != '-':
			cmd, args = a, args[1:]
		default: // serve, the default command, has no flags
			return cli.WithHint(cli.Usagef(usage, "unknown flag %q", a), serveHint)
		}
	}
	switch cmd {
	case "serve":
		return serve(ctx, args, getenv, stdout)
	case "devdb":
		return runDevDB(ctx, args, stdout)
	case "bench":
		return runBench(ctx, args, getenv, stdout)
	case "healthcheck":
		return healthcheck(ctx, args, getenv, stdout)
	case "version":
		fs := flag.NewFlagSet("version", flag.ContinueOnError)
		if err := cli.Parse(fs, args, "Usage: pulse version\n\nPrints the version of this binary, the commit it was built from and that commit's time (from\nthe build information that go build records in a git checkout), the build time when stamped, and\nthe Go toolchain.", stdout); err != nil {
			return err
		}
		_, err := io.WriteString(stdout, binaryVersion().String())
		return err
	default:
		return cli.Usagef(usage, "unknown command %q", cmd)
	}
}
