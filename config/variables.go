package config

import (
	"fmt"
	"reflect"
	"strings"
)

// Variable describes one configuration variable: what `pulse serve --help` prints and what the table of
// docs/configuration.md holds (a test in the repository root compares that table with Variables, row by
// row).
type Variable struct {
	// Name is the environment variable, as in Config's env tag.
	Name string
	// Default is the value used when the variable is empty, as the docs show it: a value in backquotes
	// (equal to the field's envDefault tag when it has one) or words such as "empty".
	Default string
	// Meaning says what the variable does and which values it takes, in Markdown (backquoted code, no links),
	// without a final period.
	Meaning string
}

// variables holds the meaning of every variable of Config, in the order of its fields. The meanings are
// written here once, for `pulse serve --help` and docs/configuration.md alike.
var variables = []Variable{
	{"PULSE_MONGODB_URI", "empty", "MongoDB connection string; empty = embedded development database. The sidecar sets the write concern (`w: majority`, journaled), read concern (`majority`) and read preference (`primary`) itself; a URI asking for less (`w` other than `majority`, `journal=false`, `j`, a `readPreference` other than `primary`, a `readConcernLevel` other than `majority`) stops the start naming the option ([mongodb-production.md](mongodb-production.md#write-concern-and-read-preference))"},
	{"PULSE_DATABASE", "database of the URI, else `pulse`", "database name, at most 63 characters without `/ \\ . \" $` or spaces"},
	{"PULSE_COLLECTION_PREFIX", "`pulse`", "collections `<prefix>.events`, `.subscriptions`, `.deliveries`, `.history`, `.queue`, `.outbox` and `.readiness`"},
	{"PULSE_DATA_DIR", "`./pulse-data`", "files of the embedded development database"},
	{"PULSE_LISTEN", "`127.0.0.1:8080`", "API address (`/v1`, and the probes of PULSE_PROBE_LISTEN too). A non-loopback address (`0.0.0.0`, a pod IP) needs `PULSE_API_TOKEN`, or the start stops with one line saying so"},
	{"PULSE_PROBE_LISTEN", "empty (none)", "a second listener serving only `/healthz`, `/readyz` and `/metrics`, without a token, for the kubelet's probes and Prometheus (the chart sets `0.0.0.0:8081`)"},
	{"PULSE_API_TOKEN", "empty", "comma-separated bearer tokens; when set, `/v1` needs `Authorization: Bearer <one of them>`. Rotate without downtime: add the new token, move the clients, remove the old one"},
	{"PULSE_API_READ_TOKEN", "empty", "comma-separated read-only tokens: `GET` routes of `/v1` only, other methods answer 403 `read_only_token`; needs `PULSE_API_TOKEN`"},
	{"PULSE_ALLOWED_HOSTS", "empty", "comma-separated host names (no port) the API answers besides IP addresses, `localhost` and `*.localhost`, such as the service name other containers use (`pulse`). On a loopback `PULSE_LISTEN`, and whenever this is set, a request with any other `Host` answers 403 `host_not_allowed` (see What a browser can reach, in docs/configuration.md)"},
	{"PULSE_ENCRYPTION_KEY", "empty", "comma-separated base64 32-byte keys (`openssl rand -base64 32`): endpoint signing secrets and header values are stored encrypted (AES-256-GCM); the first key encrypts, every key decrypts. See Secrets at rest, in docs/configuration.md"},
	{"PULSE_LOCK_TIMEOUT", "`30s`", "the lease timeout: lease length; heartbeats every third of it; 30ms to 1h"},
	{"PULSE_POLL_INTERVAL", "`1s`", "longest idle sleep of the dispatcher (a local publish wakes it at once); 5ms to 10m"},
	{"PULSE_CHANGE_STREAMS", "`auto`", "`auto`, `required` (refuse to start without them), `disabled`"},
	{"PULSE_EVENT_RETENTION", "`168h`", "how long events are kept after publication, a Go duration; `0` keeps forever"},
	{"PULSE_HISTORY_RETENTION", "`168h`", "how long terminal deliveries and ended attempts are kept, a Go duration; `0` keeps forever"},
	{"PULSE_ENDPOINTS_FILE", "empty", "YAML or JSON list of endpoints registered at start and re-applied when it changes (see Endpoints file, in docs/configuration.md)"},
	{"PULSE_DATABASE_TIMEOUT", "`5s`", "how long a database command waits for a reachable server (the driver's server selection timeout, overriding `serverSelectionTimeoutMS` of the URI): while the database is unreachable, every API request answers 503 `database_unavailable` within it, however many arrive together (publishes waiting for a group commit round that found no server answer with it); it also bounds the whole database work of one publish (an election, a half-open connection: 503 within it; a publish re-sent with the same ids is stored once), while other calls without a deadline of their own are bounded by max(`PULSE_LOCK_TIMEOUT`, 30s); 100ms to 5m"},
	{"PULSE_SCHEMA_TIMEOUT", "`1h`", "bound of the start's schema work: missing indexes (built with `commitQuorum: majority` on a replica set) and one-time migrations, each logging its progress; a migration stopped by it resumes at the next start; 1m to 48h. The rest of the start has 30 s more from its end; `/healthz` answers meanwhile and `/readyz` 503 says what the start waits for; the Helm chart sizes its `startupProbe` to it"},
	{"PULSE_SHUTDOWN_TIMEOUT", "`25s`", "grace for in-flight deliveries after SIGTERM; 0 to 1h"},
	{"PULSE_LOG_LEVEL", "`info`", "`debug`, `info`, `warn` or `error`"},
	{"PULSE_LOG_FORMAT", "`console` on a terminal, else `json`", "`json` (JSON lines on stdout) or `console` (for humans); unset, the log is `console` when stdout is a terminal and `json` when it is a pipe or a file"},
	{"OTEL_EXPORTER_OTLP_ENDPOINT", "empty", "OTLP/HTTP base URL to export trace spans to (`<url>/v1/traces`); empty: spans are made (webhook POSTs carry `traceparent`) but not exported"},
	{"PULSE_MAX_BODY_BYTES", "`1048576`", "publish body limit (413 above), 1024 to 16760832: each event is stored as one MongoDB document (at most 16 MiB), and 16 KiB are kept for the event's id, topic, headers and times, so a larger limit stops the start"},
	{"PULSE_WORKERS", "`64`", "worker slots for webhook POSTs per process, shared by consumer groups, 1 to 10000; see Fairness between endpoints in operating.md (a POST running longer than 1 s gives its slot back, so up to 17 × this many may be in flight, each group within its `maxConcurrency`)"},
	{"PULSE_DENY_CIDRS", "empty", "destinations webhooks may not reach: comma-separated CIDRs or single addresses (169.254.0.0/16, fe80::/10 and fd00:ec2::254 are always refused unless allowed)"},
	{"PULSE_ALLOW_CIDRS", "empty", "exceptions to `PULSE_DENY_CIDRS` and to the always-refused ranges: comma-separated CIDRs or single addresses"},
	{"PULSE_OUTBOUND_PROXY", "empty (`none`)", "`env`: webhook POSTs go through `HTTP_PROXY` (http URLs) and `HTTPS_PROXY` (https URLs, CONNECT), except `NO_PROXY` hosts and loopback (lower-case names are read too); without it those variables are ignored. See Outbound proxy, in docs/configuration.md"},
	{"HTTP_PROXY", "empty", "with `PULSE_OUTBOUND_PROXY=env`: the proxy of `http://` webhooks (else `http_proxy`), an http, https or socks5 URL"},
	{"HTTPS_PROXY", "empty", "with `PULSE_OUTBOUND_PROXY=env`: the proxy of `https://` webhooks, reached with CONNECT (else `https_proxy`)"},
	{"NO_PROXY", "empty", "with `PULSE_OUTBOUND_PROXY=env`: hosts, domains and CIDRs reached directly (else `no_proxy`); loopback always is"},
}

// Variables returns every configuration variable with its default and meaning, in the order of Config's
// fields. The caller may modify the returned slice.
func Variables() []Variable {
	return append([]Variable(nil), variables...)
}

// checkVariables reports how variables and Config's env tags disagree: a field without a described
// variable, a description without a field, another order, or a Default that differs from the envDefault
// tag. It returns nil when they agree (config_test.go requires that).
func checkVariables() error {
	var problems []string
	t := reflect.TypeOf(Config{})
	var names []string
	for i := range t.NumField() {
		f := t.Field(i)
		name := f.Tag.Get("env")
		if name == "" {
			continue
		}
		names = append(names, name)
		idx := -1
		for j, v := range variables {
			if v.Name == name {
				idx = j
			}
		}
		if idx < 0 {
			problems = append(problems, name+" has no meaning in config.variables")
			continue
		}
		if def, ok := f.Tag.Lookup("envDefault"); ok && variables[idx].Default != "`"+def+"`" {
			problems = append(problems, fmt.Sprintf("%s: Default %q, envDefault %q", name, variables[idx].Default, def))
		}
	}
	var described []string
	for _, v := range variables {
		described = append(described, v.Name)
	}
	if strings.Join(names, ",") != strings.Join(described, ",") {
		problems = append(problems, fmt.Sprintf("order or set differs: Config %v, variables %v", names, described))
	}
	if len(problems) > 0 {
		return fmt.Errorf("config.variables: %s", strings.Join(problems, "; "))
	}
	return nil
}

// MarkdownTable returns the table of docs/configuration.md: a header row, then one row per variable,
// "| `NAME` | default | meaning |", each line ending in a newline.
func MarkdownTable() string {
	var b strings.Builder
	b.WriteString("| variable | default | meaning |\n|---|---|---|\n")
	for _, v := range variables {
		fmt.Fprintf(&b, "| `%s` | %s | %s |\n", v.Name, v.Default, v.Meaning)
	}
	return b.String()
}

// HelpText returns the variables as `pulse serve --help` prints them: per variable a line with its name
// and default, then its meaning wrapped to width columns (at least 40) and indented by four spaces;
// backquotes are dropped.
func HelpText(width int) string {
	width = max(width, 40)
	var b strings.Builder
	for _, v := range variables {
		fmt.Fprintf(&b, "  %s (default: %s)\n", v.Name, plain(v.Default))
		line := "   "
		for _, word := range strings.Fields(plain(v.Meaning)) {
			if len(line)+1+len(word) > width && line != "   " {
				b.WriteString(line + "\n")
				line = "   "
			}
			line += " " + word
		}
		b.WriteString(line + "\n")
	}
	return b.String()
}

// plain drops the Markdown backquotes of s.
func plain(s string) string { return strings.ReplaceAll(s, "`", "") }
