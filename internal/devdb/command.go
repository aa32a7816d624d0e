package devdb

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/pulse-sidecar/pulse/internal/cli"
)

// Defaults of the devdb subcommand's flags.
const (
	DefaultCommandListen  = "127.0.0.1:27017"
	DefaultCommandDataDir = "./pulse-data"
)

// commandStartTimeout bounds how long RunCommand waits for the database to answer.
const commandStartTimeout = 2 * time.Minute

// ReadyPrefix starts the one line RunCommand prints to stdout once the database accepts
// connections; the proxy's URI follows it, as in "devdb: mongodb://127.0.0.1:27017/".
const ReadyPrefix = "devdb: "

// commandSynopsis starts the text of `pulse devdb --help`.
const commandSynopsis = `Usage: pulse devdb [flags]

Runs the embedded development database (FerretDB behind a proxy that makes its read-modify-writes atomic)
on its own, for sidecars started with PULSE_MONGODB_URI=<the printed URI>. It prints "devdb: <URI>" once
it accepts connections and runs until interrupted. Only one process at a time may use a data directory.
FerretDB's own warnings go to ferretdb.log in the data directory; the console shows its errors only.`

// RunCommand implements `pulse devdb [--listen host:port] [--data-dir dir] [--postgresql-url url]`:
// it starts a Server, prints ReadyPrefix and the server's URI as one line to stdout, then blocks until
// ctx is done and stops the server. The proxy's warnings and FerretDB's errors go to stderr, FerretDB's
// warnings to DatabaseLogName in the data directory (see Config.Logger).
//
// It returns nil after a clean shutdown (also when ctx ends during the start), an error wrapping
// flag.ErrHelp after printing the usage to stdout for -h, --help or help, a *cli.UsageError for bad
// flags or arguments, and an error for a failed start (a *LockedError when the data directory is in
// use) or a failed stop.
func RunCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("devdb", flag.ContinueOnError)
	listen := fs.String("listen", DefaultCommandListen, "`host:port` the MongoDB wire-protocol proxy listens on (port 0 picks a free port)")
	dataDir := fs.String("data-dir", DefaultCommandDataDir, "`directory` of the SQLite databases, created if missing")
	pgURL := fs.String("postgresql-url", "", "PostgreSQL connection `url`; when set, FerretDB stores data there instead of in --data-dir")
	if err := cli.Parse(fs, args, commandSynopsis, stdout); err != nil {
		return err
	}

	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	startCtx, cancel := context.WithTimeout(ctx, commandStartTimeout)
	defer cancel()
	srv, err := Start(startCtx, Config{
		DataDir:       *dataDir,
		PostgreSQLURL: *pgURL,
		Listen:        *listen,
		Logger:        logger,
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil // interrupted while starting: a clean shutdown
		}
		return err
	}
	if _, err := fmt.Fprintln(stdout, ReadyPrefix+srv.URI()); err != nil {
		return errors.Join(fmt.Errorf("devdb: write uri: %w", err), srv.Stop())
	}

	<-ctx.Done()
	if err := srv.Stop(); err != nil {
		return fmt.Errorf("devdb: stop: %w", err)
	}
	return nil
}
