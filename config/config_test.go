package config_test

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/pulse-sidecar/pulse/config"
	"github.com/pulse-sidecar/pulse/webhook"
)

// getenv returns a fake environment holding only vars.
func getenv(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

// field is one field of a loaded Config: the value Load gave and the one the test wants.
type field struct {
	name      string
	got, want any
}

// checkFields reports every field whose value is not the one wanted, with both types: a value of the wrong
// type (an int for a time.Duration) is never equal.
func checkFields(t *testing.T, fields []field) {
	t.Helper()
	for _, f := range fields {
		if f.got != f.want {
			t.Errorf("%s = %v (%T), want %v (%T)", f.name, f.got, f.got, f.want, f.want)
		}
	}
}

func TestLoadDefaults(t *testing.T) {
	t.Parallel()
	cfg, err := config.Load(getenv(nil))
	if err != nil {
		t.Fatalf("Load(empty environment) = %v, want nil", err)
	}
	checkFields(t, []field{
		{"MongoDBURI", cfg.MongoDBURI, ""},
		{"CollectionPrefix", cfg.CollectionPrefix, config.DefaultCollectionPrefix},
		{"DataDir", cfg.DataDir, config.DefaultDataDir},
		{"Listen", cfg.Listen, config.DefaultListen},
		{"APIToken", cfg.APIToken, ""},
		{"APIReadToken", cfg.APIReadToken, ""},
		{"ProbeListen", cfg.ProbeListen, ""},
		{"EncryptionKey", cfg.EncryptionKey, ""},
		{"LeaseTimeout", cfg.LeaseTimeout, config.DefaultLeaseTimeout},
		{"PollInterval", cfg.PollInterval, config.DefaultPollInterval},
		{"ChangeStreams", cfg.ChangeStreams, config.ChangeStreamsAuto},
		{"EventRetention", cfg.EventRetention, config.DefaultRetention},
		{"HistoryRetention", cfg.HistoryRetention, config.DefaultRetention},
		{"ShutdownTimeout", cfg.ShutdownTimeout, config.DefaultShutdownTimeout},
		{"SchemaTimeout", cfg.SchemaTimeout, config.DefaultSchemaTimeout},
		{"LogLevel", cfg.LogLevel, "info"},
		{"LogFormat", cfg.LogFormat, ""},
		{"MaxBodyBytes", cfg.MaxBodyBytes, int64(config.DefaultMaxBodyBytes)},
		{"Workers", cfg.Workers, config.DefaultWorkers},
		{"DenyCIDRs", cfg.DenyCIDRs, ""},
		{"AllowCIDRs", cfg.AllowCIDRs, ""},
	})
}

func TestLoadReadsValues(t *testing.T) {
	t.Parallel()
	cfg, err := config.Load(getenv(map[string]string{
		"PULSE_MONGODB_URI":       "mongodb://db:27017/events",
		"PULSE_DATABASE":          "events",
		"PULSE_COLLECTION_PREFIX": "px",
		"PULSE_LISTEN":            "localhost:9090",
		"PULSE_LOCK_TIMEOUT":      "600ms",
		"PULSE_POLL_INTERVAL":     "50ms",
		"PULSE_CHANGE_STREAMS":    "disabled",
		"PULSE_EVENT_RETENTION":   "0",
		"PULSE_HISTORY_RETENTION": "1h",
		"PULSE_LOG_FORMAT":        "console",
		"PULSE_LOG_LEVEL":         "debug",
		"PULSE_WORKERS":           "8",
		"PULSE_MAX_BODY_BYTES":    "2048",
		"PULSE_DENY_CIDRS":        "10.0.0.0/8, fd00::/8",
		"PULSE_ALLOW_CIDRS":       "10.1.2.0/24",
	}))
	if err != nil {
		t.Fatalf("Load = %v, want nil", err)
	}
	checkFields(t, []field{
		{"MongoDBURI", cfg.MongoDBURI, "mongodb://db:27017/events"},
		{"Database", cfg.Database, "events"},
		{"CollectionPrefix", cfg.CollectionPrefix, "px"},
		{"Listen", cfg.Listen, "localhost:9090"},
		{"LeaseTimeout", cfg.LeaseTimeout, 600 * time.Millisecond},
		{"PollInterval", cfg.PollInterval, 50 * time.Millisecond},
		{"ChangeStreams", cfg.ChangeStreams, config.ChangeStreamsDisabled},
		{"EventRetention (0 keeps forever)", cfg.EventRetention, time.Duration(0)},
		{"HistoryRetention", cfg.HistoryRetention, time.Hour},
		{"LogFormat", cfg.LogFormat, "console"},
		{"LogLevel", cfg.LogLevel, "debug"},
		{"Workers", cfg.Workers, 8},
		{"MaxBodyBytes", cfg.MaxBodyBytes, int64(2048)},
	})
	deny, err := webhook.ParseCIDRs(cfg.DenyCIDRs)
	want := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}
	if err != nil || len(deny) != 2 || deny[0] != want[0] || deny[1] != want[1] {
		t.Errorf("ParseCIDRs(%q) = %v, %v; want %v", cfg.DenyCIDRs, deny, err, want)
	}
}

func TestLoadRejectsBadValues(t *testing.T) {
	t.Parallel()
	tests := []struct{ key, value string }{
		{"PULSE_LOCK_TIMEOUT", "abc"},
		{"PULSE_LOCK_TIMEOUT", "10ms"},
		{"PULSE_LOCK_TIMEOUT", "2h"},
		{"PULSE_POLL_INTERVAL", "1ms"},
		{"PULSE_CHANGE_STREAMS", "maybe"},
		{"PULSE_LOG_FORMAT", "xml"},
		{"PULSE_LOG_LEVEL", "verbose"},
		{"PULSE_DENY_CIDRS", "10.0.0.0/33"},
		{"PULSE_DENY_CIDRS", "10.0.0.0/8,nonsense"},
		{"PULSE_ALLOW_CIDRS", "300.1.1.1/32"},
		{"PULSE_EVENT_RETENTION", "-1s"},
		{"PULSE_HISTORY_RETENTION", "-5m"},
		{"PULSE_HISTORY_RETENTION", "forever"},
		{"PULSE_SHUTDOWN_TIMEOUT", "2h"},
		{"PULSE_WORKERS", "0"},
		{"PULSE_WORKERS", "many"},
		{"PULSE_MAX_BODY_BYTES", "1k"},
		{"PULSE_MAX_BODY_BYTES", "100"},
		{"PULSE_MAX_BODY_BYTES", "16777216"}, // one event of 16 MiB cannot be one MongoDB document
		{"PULSE_MAX_BODY_BYTES", "67108864"},
		{"PULSE_OUTBOUND_PROXY", "sometimes"},
		{"PULSE_OUTBOUND_PROXY", "env"}, // neither HTTP_PROXY nor HTTPS_PROXY
		{"PULSE_LISTEN", "nope"},
		{"PULSE_LISTEN", "8080"},
		{"PULSE_ALLOWED_HOSTS", "pulse:8080"},
		{"PULSE_ALLOWED_HOSTS", "http://pulse"},
		{"PULSE_ALLOWED_HOSTS", "pulse, other"},
		{"PULSE_ALLOWED_HOSTS", "*.example"},
		{"PULSE_LISTEN", "0.0.0.0:8080"}, // beyond loopback without PULSE_API_TOKEN
		{"PULSE_LISTEN", ":8080"},
		{"PULSE_LISTEN", "10.1.2.3:8080"},
		{"PULSE_PROBE_LISTEN", "8081"},
		{"PULSE_COLLECTION_PREFIX", "a b"},
		{"PULSE_COLLECTION_PREFIX", "pre$fix"},
	}
	for _, tt := range tests {
		t.Run(tt.key+"="+tt.value, func(t *testing.T) {
			t.Parallel()
			cfg, err := config.Load(getenv(map[string]string{tt.key: tt.value}))
			if err == nil {
				t.Fatalf("Load(%s=%q) = %+v, nil; want an error", tt.key, tt.value, cfg)
			}
			msg := err.Error()
			if !strings.Contains(msg, tt.key) {
				t.Errorf("error %q does not name the variable %s", msg, tt.key)
			}
			if !strings.Contains(msg, tt.value) {
				t.Errorf("error %q does not show the bad value %q", msg, tt.value)
			}
			if strings.ContainsAny(msg, "\r\n") {
				t.Errorf("error %q is more than one line", msg)
			}
			if cfg != nil {
				t.Errorf("Load returned a config with its error: %+v", cfg)
			}
		})
	}
}

// PULSE_MAX_BODY_BYTES stops at what one MongoDB document can hold, and says why.
func TestMaxBodyBytesFitsOneDocument(t *testing.T) {
	t.Parallel()
	cfg, err := config.Load(getenv(map[string]string{"PULSE_MAX_BODY_BYTES": "16760832"}))
	if err != nil || cfg.MaxBodyBytes != 16760832 || config.MaxMaxBodyBytes != 16760832 {
		t.Fatalf("Load(PULSE_MAX_BODY_BYTES=16760832) = %v; want the largest limit accepted", err)
	}
	_, err = config.Load(getenv(map[string]string{"PULSE_MAX_BODY_BYTES": "16760833"}))
	if err == nil || !strings.Contains(err.Error(), "MongoDB document") || !strings.Contains(err.Error(), "16 MiB") {
		t.Fatalf("Load(PULSE_MAX_BODY_BYTES=16760833) = %v; want an error giving the MongoDB document limit as the reason", err)
	}
}

// The CIDR settings accept what the webhook guard parses (webhook.ParseCIDRs): prefixes and bare addresses.
func TestLoadAcceptsCIDRsAndAddresses(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"", " , ", "10.1.2.3/8", "192.168.0.0/16,fe80::/10", "10.0.0.1", "10.0.0.0/8, ::1"} {
		if _, err := config.Load(getenv(map[string]string{"PULSE_DENY_CIDRS": v, "PULSE_ALLOW_CIDRS": v})); err != nil {
			t.Errorf("PULSE_DENY_CIDRS and PULSE_ALLOW_CIDRS=%q: %v", v, err)
		}
	}
}

// The API binds beyond loopback only with a token; tokens are comma-separated lists, read-only tokens need
// full ones, and errors about tokens and keys never show them.
func TestTokensAndExposure(t *testing.T) {
	t.Parallel()
	for _, listen := range []string{"127.0.0.1:8080", "127.1.2.3:0", "[::1]:8080", "localhost:8080"} {
		if _, err := config.Load(getenv(map[string]string{"PULSE_LISTEN": listen})); err != nil {
			t.Errorf("PULSE_LISTEN=%s without a token: %v, want accepted (loopback)", listen, err)
		}
	}
	_, err := config.Load(getenv(map[string]string{"PULSE_LISTEN": "0.0.0.0:8080"}))
	if err == nil || !strings.Contains(err.Error(), "PULSE_API_TOKEN") || !strings.Contains(err.Error(), "beyond loopback") {
		t.Fatalf("0.0.0.0 without a token: %v, want an error saying why and naming PULSE_API_TOKEN", err)
	}
	cfg, err := config.Load(getenv(map[string]string{"PULSE_LISTEN": "0.0.0.0:8080", "PULSE_API_TOKEN": " new-token , old-token ",
		"PULSE_API_READ_TOKEN": "viewer", "PULSE_PROBE_LISTEN": "0.0.0.0:8081"}))
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.APITokens(); len(got) != 2 || got[0] != "new-token" || got[1] != "old-token" {
		t.Errorf("APITokens() = %q", got)
	}
	if got := cfg.APIReadTokens(); len(got) != 1 || got[0] != "viewer" {
		t.Errorf("APIReadTokens() = %q", got)
	}
	for _, env := range []map[string]string{
		{"PULSE_API_TOKEN": "sekrit-a,,sekrit-b"},
		{"PULSE_API_TOKEN": "sekrit a"},
		{"PULSE_API_READ_TOKEN": "sekrit-r"},                                // no full token
		{"PULSE_API_TOKEN": "sekrit-a", "PULSE_API_READ_TOKEN": "sekrit-a"}, // both lists
		{"PULSE_ENCRYPTION_KEY": "sekrit-not-base64!"},
		{"PULSE_ENCRYPTION_KEY": "c2Vrcml0LXNob3J0"}, // 12 bytes
	} {
		_, err := config.Load(getenv(env))
		if err == nil {
			t.Errorf("Load(%v) = nil, want an error", env)
			continue
		}
		if strings.Contains(err.Error(), "sekrit") || strings.Contains(err.Error(), "c2Vrcml0") {
			t.Errorf("error %q shows the secret value", err)
		}
	}
}

func TestParseKeys(t *testing.T) {
	t.Parallel()
	a := "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=" // "0123456789abcdef0123456789abcdef"
	keys, err := config.ParseKeys(a + ", " + strings.TrimRight(a, "="))
	if err != nil || len(keys) != 2 || string(keys[0]) != "0123456789abcdef0123456789abcdef" || string(keys[1]) != string(keys[0]) {
		t.Fatalf("ParseKeys = %q, %v", keys, err)
	}
	if keys, err := config.ParseKeys(""); keys != nil || err != nil {
		t.Errorf("ParseKeys(\"\") = %v, %v; want nil, nil", keys, err)
	}
}

// Every variable of Config has its meaning in Variables, in field order, with the envDefault it is given.
func TestVariablesDescribeEveryField(t *testing.T) {
	t.Parallel()
	if err := config.CheckVariables(); err != nil {
		t.Fatal(err)
	}
	for _, v := range config.Variables() {
		if v.Meaning == "" || strings.HasSuffix(v.Meaning, ".") {
			t.Errorf("%s: meaning %q: want a text without a final period", v.Name, v.Meaning)
		}
	}
	help := config.HelpText(100)
	for _, v := range config.Variables() {
		if !strings.Contains(help, "  "+v.Name+" (default: ") {
			t.Errorf("HelpText lacks %s", v.Name)
		}
	}
	for _, line := range strings.Split(strings.TrimSuffix(help, "\n"), "\n") {
		if len(line) > 100 && strings.Contains(strings.TrimSpace(line), " ") {
			t.Errorf("HelpText line longer than 100 columns: %q", line)
		}
	}
}

// Unset, PULSE_LOG_FORMAT follows the log's destination: console on a terminal, json on a pipe or a file;
// set, it is what it says on both.
func TestLogFormatFollowsTheTerminal(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		set            string
		terminal, pipe string
	}{{"", "console", "json"}, {"json", "json", "json"}, {"console", "console", "console"}} {
		vars := map[string]string{}
		if c.set != "" {
			vars["PULSE_LOG_FORMAT"] = c.set
		}
		cfg, err := config.Load(getenv(vars))
		if err != nil {
			t.Fatalf("PULSE_LOG_FORMAT=%q: %v", c.set, err)
		}
		if got := cfg.LogFormatFor(true); got != c.terminal {
			t.Errorf("PULSE_LOG_FORMAT=%q on a terminal: %q, want %q", c.set, got, c.terminal)
		}
		if got := cfg.LogFormatFor(false); got != c.pipe {
			t.Errorf("PULSE_LOG_FORMAT=%q on a pipe: %q, want %q", c.set, got, c.pipe)
		}
	}
}
