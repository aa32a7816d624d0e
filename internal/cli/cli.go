// Package cli holds the command-line conventions shared by pulse's subcommands: -h, --help and a lone
// "help" print the usage to stdout and succeed; an unknown flag or a stray argument is a UsageError, which
// main reports with the usage on stderr and exit status 2.
package cli

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// ExitUsage is the exit status of a command line the program does not accept.
const ExitUsage = 2

// UsageError is a command line the program does not accept. Usage is the text to show with it, unless Hint
// is set: then that one line is shown instead (a command whose usage is long, such as serve's list of
// variables, points at what to do rather than repeat it).
type UsageError struct {
	Err   error
	Usage string
	Hint  string
}

// Error returns the reason without the usage text.
func (e *UsageError) Error() string { return e.Err.Error() }

// Unwrap returns the reason.
func (e *UsageError) Unwrap() error { return e.Err }

// Usagef returns a *UsageError with the formatted reason and usage.
func Usagef(usage, format string, args ...any) error {
	return &UsageError{Err: fmt.Errorf(format, args...), Usage: usage}
}

// WithHint returns err with hint in place of its usage when err is a *UsageError, else err.
func WithHint(err error, hint string) error {
	var ue *UsageError
	if !errors.As(err, &ue) {
		return err
	}
	return &UsageError{Err: ue.Err, Usage: ue.Usage, Hint: hint}
}

// Shown returns what to print after the reason of e: its hint line, else its usage.
func (e *UsageError) Shown() string {
	if e.Hint != "" {
		return strings.TrimRight(e.Hint, "\n") + "\n"
	}
	return e.Usage
}

// IsHelp reports whether args ask for help: "-h", "-help", "--help" or a lone "help".
func IsHelp(args []string) bool {
	if len(args) == 0 {
		return false
	}
	switch args[0] {
	case "-h", "-help", "--help":
		return true
	case "help":
		return len(args) == 1
	}
	return false
}

// Usage returns the usage text of fs: synopsis, then one line per flag with its default.
func Usage(fs *flag.FlagSet, synopsis string) string {
	var b bytes.Buffer
	b.WriteString(strings.TrimRight(synopsis, "\n") + "\n")
	hasFlags := false
	fs.VisitAll(func(*flag.Flag) { hasFlags = true })
	if hasFlags {
		b.WriteString("\nFlags:\n")
		out := fs.Output()
		fs.SetOutput(&b)
		fs.PrintDefaults()
		fs.SetOutput(out)
	}
	return b.String()
}

// Parse parses args with fs and accepts no positional arguments. For -h, --help or a lone "help" it writes
// the usage (see Usage) to stdout and returns flag.ErrHelp, which callers turn into success. An unknown
// flag, a bad flag value or a positional argument gives a *UsageError. fs must use flag.ContinueOnError.
func Parse(fs *flag.FlagSet, args []string, synopsis string, stdout io.Writer) error {
	usage := Usage(fs, synopsis)
	if IsHelp(args) {
		_, err := io.WriteString(stdout, usage)
		return errors.Join(flag.ErrHelp, err)
	}
	fs.SetOutput(io.Discard) // the flag package's own messages would repeat ours
	fs.Usage = func() {}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) { // -h or -help after other flags
			_, werr := io.WriteString(stdout, usage)
			return errors.Join(flag.ErrHelp, werr)
		}
		return &UsageError{Err: err, Usage: usage}
	}
	if fs.NArg() > 0 {
		if fs.NArg() == 1 && fs.Arg(0) == "help" {
			_, err := io.WriteString(stdout, usage)
			return errors.Join(flag.ErrHelp, err)
		}
		return &UsageError{Err: fmt.Errorf("%s takes no arguments, got %q", fs.Name(), fs.Args()), Usage: usage}
	}
	return nil
}
