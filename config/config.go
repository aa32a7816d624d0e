// Package config holds the sidecar's configuration: one Config struct parsed once from the environment with
// caarlos0/env, validated at start. Nothing else in the sidecar reads the environment.
package config

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"
	"golang.org/x/net/http/httpproxy"

	"github.com/pulse-sidecar/pulse/webhook"
)

// Defaults, as documented in docs/configuration.md (the table config.Variables describes).
const (
	DefaultDatabase         = "pulse"
	DefaultCollectionPrefix = "pulse"
	DefaultDataDir          = "./pulse-data"
	DefaultListen           = "127.0.0.1:8080"
	DefaultLeaseTimeout     = 30 * time.Second
	DefaultPollInterval     = time.Second
	DefaultRetention        = 168 * time.Hour
	DefaultShutdownTimeout  = 25 * time.Second
	DefaultDatabaseTimeout  = 5 * time.Second
	DefaultSchemaTimeout    = time.Hour
	DefaultMaxBodyBytes     = 1 << 20
	DefaultWorkers          = 64
)

// Limits of PULSE_MAX_BODY_BYTES.
const (
	// MaxBSONDocumentBytes is the most one MongoDB document may hold (16 MiB); each event is one document.
	MaxBSONDocumentBytes = 16 << 20
	// EventDocumentOverhead bounds, in bytes, what an event's document adds to its publish body: the id (≤ 128
	// characters), topic (≤ 200), times, flags, field names and BSON framing take under 1 KiB, and each of at
	// most 64 headers one byte more than its JSON spelling; data is stored as published (compacted) and no
	// stored string is longer than its JSON spelling. The rest is margin.
	EventDocumentOverhead = 16 << 10
	// MaxMaxBodyBytes is the largest PULSE_MAX_BODY_BYTES: a body of that size still fits one document.
	MaxMaxBodyBytes = MaxBSONDocumentBytes - EventDocumentOverhead
)

// Change stream modes (docs/delivery.md, "Polling and change streams").
const (
	ChangeStreamsAuto     = "auto"
	ChangeStreamsRequired = "required"
	ChangeStreamsDisabled = "disabled"
)

// Config is the whole configuration of one sidecar process.
type Config struct {
	// MongoDBURI is the MongoDB connection string; empty starts the embedded development database.
	MongoDBURI string `env:"PULSE_MONGODB_URI"`
	// Database is the database name; default: the database in the URI path, else "pulse".
	Database string `env:"PULSE_DATABASE"`
	// CollectionPrefix names the collections <prefix>.events, .subscriptions, .deliveries, .history.
	CollectionPrefix string `env:"PULSE_COLLECTION_PREFIX" envDefault:"pulse"`
	// DataDir is where the embedded development database keeps its files.
	DataDir string `env:"PULSE_DATA_DIR" envDefault:"./pulse-data"`
	// Listen is the host:port of the ingest and admin API.
	Listen string `env:"PULSE_LISTEN" envDefault:"127.0.0.1:8080"`
	// ProbeListen, when set, is the host:port of a second listener serving only /healthz, /readyz and
	// /metrics (the kubelet's probes and Prometheus); they stay on Listen too. Empty: no second listener.
	ProbeListen string `env:"PULSE_PROBE_LISTEN"`
	// APIToken, when set, is a comma-separated list of bearer tokens, each accepted as
	// "Authorization: Bearer <token>" on every /v1 request (several at once so a token can be rotated without
	// downtime). Required when Listen is not a loopback address.
	APIToken string `env:"PULSE_API_TOKEN"`
	// APIReadToken is a comma-separated list of read-only bearer tokens: GET /v1 routes only. Needs APIToken.
	APIReadToken string `env:"PULSE_API_READ_TOKEN"`
	// AllowedHosts is a comma-separated list of host names (no port) the API listener answers besides IP
	// addresses, localhost and names under .localhost, such as the service name other containers call it by.
	// The API listener refuses requests naming any other Host (a web page whose name resolves to 127.0.0.1)
	// when Listen is a loopback address or AllowedHosts is set; see APIChecksHost.
	AllowedHosts []string `env:"PULSE_ALLOWED_HOSTS" envSeparator:","`
	// EncryptionKey is a comma-separated list of base64-encoded 32-byte keys (AES-256-GCM): the first encrypts
	// endpoint secrets and header values at rest, every one decrypts (key rotation). Empty: stored in clear.
	EncryptionKey string `env:"PULSE_ENCRYPTION_KEY"`
	// LeaseTimeout is the lease length of attempts, ordering and discovery; heartbeats run every third of it.
	LeaseTimeout time.Duration `env:"PULSE_LOCK_TIMEOUT" envDefault:"30s"`
	// PollInterval is how often an idle dispatcher looks for work without being woken.
	PollInterval time.Duration `env:"PULSE_POLL_INTERVAL" envDefault:"1s"`
	// ChangeStreams is auto, required or disabled.
	ChangeStreams string `env:"PULSE_CHANGE_STREAMS" envDefault:"auto"`
	// EventRetention is how long events are kept after publication; 0 keeps them forever.
	EventRetention time.Duration `env:"PULSE_EVENT_RETENTION" envDefault:"168h"`
	// HistoryRetention is how long terminal deliveries and ended attempts are kept; 0 keeps them forever.
	HistoryRetention time.Duration `env:"PULSE_HISTORY_RETENTION" envDefault:"168h"`
	// EndpointsFile is a YAML or JSON list of endpoints registered at start.
	EndpointsFile string `env:"PULSE_ENDPOINTS_FILE"`
	// DatabaseTimeout bounds how long a database command waits for a reachable server (the driver's server
	// selection timeout): while the database is unreachable every API request answers 503
	// database_unavailable with Retry-After within it, however many arrive together, and at once when the
	// database answers but refuses writes. A server that accepts connections but never answers is not bounded
	// by it.
	DatabaseTimeout time.Duration `env:"PULSE_DATABASE_TIMEOUT" envDefault:"5s"`
	// SchemaTimeout bounds the start's schema work: creating the collections, building the indexes that are
	// missing (on a large collection that takes long, waiting for a majority of the voting members) and the
	// one-time migrations, which record their progress and resume at the next start where they stopped. Each
	// step logs a line. Default 1h.
	SchemaTimeout time.Duration `env:"PULSE_SCHEMA_TIMEOUT" envDefault:"1h"`
	// ShutdownTimeout is the grace for in-flight deliveries after SIGTERM.
	ShutdownTimeout time.Duration `env:"PULSE_SHUTDOWN_TIMEOUT" envDefault:"25s"`
	// LogLevel is debug, info, warn or error.
	LogLevel string `env:"PULSE_LOG_LEVEL" envDefault:"info"`
	// LogFormat is json, console, or empty (the default): the format LogFormatFor chooses for the log's
	// destination, console on a terminal, json otherwise.
	LogFormat string `env:"PULSE_LOG_FORMAT"`
	// OTLPEndpoint is the standard OTEL_EXPORTER_OTLP_ENDPOINT, an OTLP/HTTP base URL (spans go to
	// <url>/v1/traces; the exporter reads the other OTEL_EXPORTER_OTLP_* variables itself). Default empty:
	// spans are made (webhook POSTs carry traceparent) but nothing is exported.
	OTLPEndpoint string `env:"OTEL_EXPORTER_OTLP_ENDPOINT"`
	// MaxBodyBytes bounds a publish request body, in bytes (413 above it); at most MaxMaxBodyBytes, so that
	// the largest event fits one MongoDB document.
	MaxBodyBytes int64 `env:"PULSE_MAX_BODY_BYTES" envDefault:"1048576"`
	// Workers is the number of worker slots for webhook POSTs in this process, shared by all consumer groups
	// (see package dispatcher for the fairness rules: a POST running longer than 1 s gives its slot back, so
	// up to 17 × Workers POSTs may be in flight, each group within its maxConcurrency).
	Workers int `env:"PULSE_WORKERS" envDefault:"64"`
	// DenyCIDRs are destination ranges webhooks may not reach (comma-separated), on top of link-local; a bare
	// address is one host. Parsed by webhook.ParseCIDRs.
	DenyCIDRs string `env:"PULSE_DENY_CIDRS"`
	// AllowCIDRs are exceptions to the deny list and to the link-local guard (comma-separated).
	AllowCIDRs string `env:"PULSE_ALLOW_CIDRS"`
	// OutboundProxy is how webhook POSTs reach their receivers: empty or "none" (default) connects directly,
	// whatever HTTP_PROXY says; "env" uses HTTPProxy, HTTPSProxy and NoProxy (net/http's rules).
	OutboundProxy string `env:"PULSE_OUTBOUND_PROXY"`
	// HTTPProxy is the proxy of http:// webhooks with PULSE_OUTBOUND_PROXY=env (HTTP_PROXY, else http_proxy).
	HTTPProxy string `env:"HTTP_PROXY"`
	// HTTPSProxy is the proxy of https:// webhooks (CONNECT) with PULSE_OUTBOUND_PROXY=env (HTTPS_PROXY, else
	// https_proxy).
	HTTPSProxy string `env:"HTTPS_PROXY"`
	// NoProxy lists hosts, domains and CIDRs reached directly (NO_PROXY, else no_proxy); loopback always is.
	NoProxy string `env:"NO_PROXY"`
}

// Load parses the configuration from getenv and validates it. The error is one line naming the variable,
// its value and what is allowed.
func Load(getenv func(string) string) (*Config, error) {
	cfg := &Config{}
	environ := map[string]string{}
	t := reflect.TypeOf(*cfg)
	fieldVar := map[string]string{}
	for i := range t.NumField() {
		key := t.Field(i).Tag.Get("env")
		fieldVar[t.Field(i).Name] = key
		if v := getenv(key); v != "" {
			environ[key] = v
		}
	}
	for upper, lower := range map[string]string{"HTTP_PROXY": "http_proxy", "HTTPS_PROXY": "https_proxy", "NO_PROXY": "no_proxy"} {
		if environ[upper] == "" && getenv(lower) != "" {
			environ[upper] = getenv(lower)
		}
	}
	if err := env.ParseWithOptions(cfg, env.Options{Environment: environ}); err != nil {
		var agg env.AggregateError
		if errors.As(err, &agg) {
			for _, e := range agg.Errors {
				var pe env.ParseError
				if errors.As(e, &pe) {
					key := fieldVar[pe.Name]
					return nil, fmt.Errorf("%s=%q is invalid: want %s", key, environ[key], allowed(pe.Type))
				}
			}
		}
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return cfg, nil
}

func allowed(t reflect.Type) string {
	switch t {
	case reflect.TypeOf(time.Duration(0)):
		return "a Go duration such as 30s, 500ms or 1h"
	case reflect.TypeOf(int(0)), reflect.TypeOf(int64(0)):
		return "an integer"
	default:
		return "a " + t.Kind().String()
	}
}

// Validate checks every field and returns an error naming the first bad variable, its value and what is
// allowed.
func (c *Config) Validate() error {
	bad := func(key string, val any, want string) error {
		return fmt.Errorf("%s=%q is invalid: want %s", key, fmt.Sprint(val), want)
	}
	if strings.ContainsAny(c.Database, "/\\. \"$\x00") || len(c.Database) > 63 {
		return bad("PULSE_DATABASE", c.Database, "a database name of at most 63 characters without / \\ . space \" $")
	}
	if c.CollectionPrefix == "" || strings.ContainsAny(c.CollectionPrefix, "$\x00 ") {
		return bad("PULSE_COLLECTION_PREFIX", c.CollectionPrefix, "a non-empty name without '$', spaces or NUL")
	}
	if _, err := netip.ParseAddrPort(c.Listen); err != nil && !strings.HasPrefix(c.Listen, "localhost:") {
		return bad("PULSE_LISTEN", c.Listen, "host:port such as 127.0.0.1:8080 or 0.0.0.0:8080")
	}
	if c.ProbeListen != "" {
		if _, err := netip.ParseAddrPort(c.ProbeListen); err != nil && !strings.HasPrefix(c.ProbeListen, "localhost:") {
			return bad("PULSE_PROBE_LISTEN", c.ProbeListen, "host:port such as 0.0.0.0:8081, or empty for none")
		}
	}
	tokens, err := splitTokens(c.APIToken)
	if err != nil {
		return secretBad("PULSE_API_TOKEN", c.APIToken, "a comma-separated list of bearer tokens ("+err.Error()+")")
	}
	readTokens, err := splitTokens(c.APIReadToken)
	if err != nil {
		return secretBad("PULSE_API_READ_TOKEN", c.APIReadToken, "a comma-separated list of bearer tokens ("+err.Error()+")")
	}
	if len(readTokens) > 0 && len(tokens) == 0 {
		return secretBad("PULSE_API_READ_TOKEN", c.APIReadToken, "it together with PULSE_API_TOKEN: a read-only token alone would leave no token allowed to write")
	}
	for _, rt := range readTokens {
		if slices.Contains(tokens, rt) {
			return secretBad("PULSE_API_READ_TOKEN", c.APIReadToken, "tokens that are not also in PULSE_API_TOKEN")
		}
	}
	if len(tokens) == 0 && !IsLoopback(c.Listen) {
		return fmt.Errorf("PULSE_LISTEN=%q exposes the API beyond loopback without a token: anyone who reaches this address could register webhooks, read events and replay deliveries; set PULSE_API_TOKEN (e.g. to the output of `openssl rand -hex 32`; clients send Authorization: Bearer <token>), or listen on 127.0.0.1", c.Listen)
	}
	for _, h := range c.AllowedHosts {
		if !validHostName(h) {
			return bad("PULSE_ALLOWED_HOSTS", strings.Join(c.AllowedHosts, ","), "a comma-separated list of host names without scheme or port, such as pulse,pulse.default.svc")
		}
	}
	if _, err := ParseKeys(c.EncryptionKey); err != nil {
		return secretBad("PULSE_ENCRYPTION_KEY", c.EncryptionKey, "a comma-separated list of base64-encoded 32-byte keys, such as the output of `openssl rand -base64 32` ("+err.Error()+")")
	}
	if c.LeaseTimeout < 30*time.Millisecond || c.LeaseTimeout > time.Hour {
		return bad("PULSE_LOCK_TIMEOUT", c.LeaseTimeout, "a duration between 30ms and 1h")
	}
	if c.PollInterval < 5*time.Millisecond || c.PollInterval > 10*time.Minute {
		return bad("PULSE_POLL_INTERVAL", c.PollInterval, "a duration between 5ms and 10m")
	}
	switch c.ChangeStreams {
	case ChangeStreamsAuto, ChangeStreamsRequired, ChangeStreamsDisabled:
	default:
		return bad("PULSE_CHANGE_STREAMS", c.ChangeStreams, "auto, required or disabled")
	}
	if c.EventRetention < 0 {
		return bad("PULSE_EVENT_RETENTION", c.EventRetention, "a duration ≥ 0 (0 keeps forever)")
	}
	if c.HistoryRetention < 0 {
		return bad("PULSE_HISTORY_RETENTION", c.HistoryRetention, "a duration ≥ 0 (0 keeps forever)")
	}
	if c.DatabaseTimeout < 100*time.Millisecond || c.DatabaseTimeout > 5*time.Minute {
		return bad("PULSE_DATABASE_TIMEOUT", c.DatabaseTimeout, "a duration between 100ms and 5m")
	}
	if c.SchemaTimeout < time.Minute || c.SchemaTimeout > 48*time.Hour {
		return bad("PULSE_SCHEMA_TIMEOUT", c.SchemaTimeout, "a duration between 1m and 48h")
	}
	if c.ShutdownTimeout < 0 || c.ShutdownTimeout > time.Hour {
		return bad("PULSE_SHUTDOWN_TIMEOUT", c.ShutdownTimeout, "a duration between 0 and 1h")
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		return bad("PULSE_LOG_LEVEL", c.LogLevel, "debug, info, warn or error")
	}
	switch c.LogFormat {
	case "", "json", "console":
	default:
		return bad("PULSE_LOG_FORMAT", c.LogFormat, "json or console (unset: console on a terminal, json otherwise)")
	}
	if c.MaxBodyBytes < 1024 || c.MaxBodyBytes > MaxMaxBodyBytes {
		return bad("PULSE_MAX_BODY_BYTES", c.MaxBodyBytes, fmt.Sprintf("a byte count between 1024 and %d: the largest event of a body is stored as one MongoDB document, at most %d bytes (16 MiB), of which %d are kept for the event's id, topic, headers and times",
			MaxMaxBodyBytes, MaxBSONDocumentBytes, EventDocumentOverhead))
	}
	if c.Workers < 1 || c.Workers > 10000 {
		return bad("PULSE_WORKERS", c.Workers, "an integer between 1 and 10000")
	}
	if _, err := webhook.ParseCIDRs(c.DenyCIDRs); err != nil {
		return bad("PULSE_DENY_CIDRS", c.DenyCIDRs, "comma-separated CIDRs or addresses such as 10.0.0.0/8,fd00::/8 ("+err.Error()+")")
	}
	if _, err := webhook.ParseCIDRs(c.AllowCIDRs); err != nil {
		return bad("PULSE_ALLOW_CIDRS", c.AllowCIDRs, "comma-separated CIDRs or addresses such as 10.1.2.0/24 ("+err.Error()+")")
	}
	switch c.OutboundProxy {
	case "", OutboundProxyNone:
	case OutboundProxyEnv:
		if c.HTTPProxy == "" && c.HTTPSProxy == "" {
			return bad("PULSE_OUTBOUND_PROXY", c.OutboundProxy, "env together with HTTP_PROXY or HTTPS_PROXY (both are empty)")
		}
		for key, v := range map[string]string{"HTTP_PROXY": c.HTTPProxy, "HTTPS_PROXY": c.HTTPSProxy} {
			if v != "" && !validProxyURL(v) {
				return bad(key, v, "a proxy URL such as http://proxy.internal:3128")
			}
		}
	default:
		return bad("PULSE_OUTBOUND_PROXY", c.OutboundProxy, "none (connect directly) or env (HTTP_PROXY, HTTPS_PROXY, NO_PROXY)")
	}
	return nil
}

// secretBad is the error of a variable whose value is secret: it tells the value's length, never the value.
func secretBad(key, val, want string) error {
	return fmt.Errorf("%s (%d characters, not shown) is invalid: want %s", key, len(val), want)
}

// APITokens returns the bearer tokens of PULSE_API_TOKEN (Validate has checked them); nil when none.
func (c *Config) APITokens() []string {
	t, _ := splitTokens(c.APIToken)
	return t
}

// APIReadTokens returns the read-only bearer tokens of PULSE_API_READ_TOKEN; nil when none.
func (c *Config) APIReadTokens() []string {
	t, _ := splitTokens(c.APIReadToken)
	return t
}

// EncryptionKeys returns the keys of PULSE_ENCRYPTION_KEY (Validate has checked them), first the one that
// encrypts; nil when none.
func (c *Config) EncryptionKeys() [][]byte {
	k, _ := ParseKeys(c.EncryptionKey)
	return k
}

// splitTokens splits a comma-separated token list; spaces around a token are dropped. An empty list gives
// nil; an empty item, or a token holding a space or a control character, is an error that does not quote it.
func splitTokens(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []string
	for i, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			return nil, fmt.Errorf("item %d is empty", i+1)
		}
		if strings.ContainsFunc(part, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
			return nil, fmt.Errorf("item %d holds a space or control character", i+1)
		}
		out = append(out, part)
	}
	return out, nil
}

// EncryptionKeySize is the size in bytes of each PULSE_ENCRYPTION_KEY key (AES-256).
const EncryptionKeySize = 32

// ParseKeys parses a comma-separated list of base64-encoded (standard or URL alphabet, padded or not)
// 32-byte keys; empty gives nil. The error names the item, never its value.
func ParseKeys(s string) ([][]byte, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out [][]byte
	for i, part := range strings.Split(s, ",") {
		part = strings.TrimRight(strings.TrimSpace(part), "=")
		var key []byte
		var err error
		if strings.ContainsAny(part, "-_") {
			key, err = base64.RawURLEncoding.DecodeString(part)
		} else {
			key, err = base64.RawStdEncoding.DecodeString(part)
		}
		if err != nil {
			return nil, fmt.Errorf("item %d is not base64", i+1)
		}
		if len(key) != EncryptionKeySize {
			return nil, fmt.Errorf("item %d decodes to %d bytes", i+1, len(key))
		}
		out = append(out, key)
	}
	return out, nil
}

// APIChecksHost reports whether the API listener answers only the Hosts of PULSE_ALLOWED_HOSTS besides IP
// addresses and localhost names: when it listens on loopback, where browsers of the same machine reach it, or
// when PULSE_ALLOWED_HOSTS is set.
func (c *Config) APIChecksHost() bool { return IsLoopback(c.Listen) || len(c.AllowedHosts) > 0 }

// validHostName reports whether h is a DNS host name as RFC 1123 §2.1 writes them: dot-separated labels of
// 1-63 letters, digits and '-', neither starting nor ending with '-', 253 characters at most.
func validHostName(h string) bool {
	if h == "" || len(h) > 253 {
		return false
	}
	for _, label := range strings.Split(strings.TrimSuffix(h, "."), ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
		}
	}
	return true
}

// IsLoopback reports whether listen (host:port) binds only a loopback address: 127.0.0.0/8, ::1 or
// localhost. An empty host or a wildcard (0.0.0.0, ::) is not loopback.
func IsLoopback(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	addr, err := netip.ParseAddr(host)
	return err == nil && addr.Unmap().IsLoopback()
}

// Outbound proxy modes (PULSE_OUTBOUND_PROXY).
const (
	OutboundProxyNone = "none"
	OutboundProxyEnv  = "env"
)

// validProxyURL reports whether v is a proxy setting net/http can use: http, https or socks5 URL with a
// host, or a bare host[:port] (read as http).
func validProxyURL(v string) bool {
	if !strings.Contains(v, "://") {
		v = "http://" + v
	}
	u, err := url.Parse(v)
	return err == nil && u.Hostname() != "" && (u.Scheme == "http" || u.Scheme == "https" || u.Scheme == "socks5" || u.Scheme == "socks5h")
}

// ProxyConfig returns the outbound proxy settings, or nil when webhooks connect directly.
func (c *Config) ProxyConfig() *httpproxy.Config {
	if c.OutboundProxy != OutboundProxyEnv {
		return nil
	}
	return &httpproxy.Config{HTTPProxy: c.HTTPProxy, HTTPSProxy: c.HTTPSProxy, NoProxy: c.NoProxy}
}

// LogFormatFor returns the log format for a log written to a terminal (terminal true) or not: PULSE_LOG_FORMAT
// when set, else "console" (lines for humans) on a terminal and "json" (one JSON object a line) elsewhere, a
// pipe, a file or a container's log collector.
func (c *Config) LogFormatFor(terminal bool) string {
	switch {
	case c.LogFormat != "":
		return c.LogFormat
	case terminal:
		return "console"
	}
	return "json"
}
