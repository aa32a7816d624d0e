package endpointsfile

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pulse-sidecar/pulse/internal/testwait"
	"github.com/pulse-sidecar/pulse/pulsetype"
)

// putRecorder is a Store that records the URLs put; with block set, PutEndpoint waits until its
// context ends.
type putRecorder struct {
	mu        sync.Mutex
	urls      []string
	block     bool
	blocked   chan struct{} // closed when a put starts blocking
	cancelled bool          // a blocked put saw its context end
}

func (p *putRecorder) GetEndpoint(context.Context, string) (*pulsetype.Endpoint, error) {
	return nil, pulsetype.ErrNotFound
}

func (p *putRecorder) PutEndpoint(ctx context.Context, e *pulsetype.Endpoint) (*pulsetype.Endpoint, bool, error) {
	p.mu.Lock()
	block := p.block
	p.mu.Unlock()
	if block {
		close(p.blocked)
		<-ctx.Done()
		p.mu.Lock()
		p.cancelled = true
		p.mu.Unlock()
		return nil, false, ctx.Err()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.urls = append(p.urls, e.URL)
	return e, true, nil
}

func (p *putRecorder) put(url string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Contains(p.urls, url)
}

// The endpoints-file watcher re-applies a changed file, and Stop cancels an apply under way and waits for it.
func TestEndpointsWatcherReappliesAndStops(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "endpoints.yaml")
	write := func(url string) {
		t.Helper()
		if err := os.WriteFile(file, []byte("- consumerGroup: billing\n  url: "+url+"\n  topics: [payment.captured]\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("http://127.0.0.1:1/v1")
	store := &putRecorder{blocked: make(chan struct{})}
	applied, err := Apply(t.Context(), file, store, func(string) {}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	w := NewWatcher(file, applied, store, func(string) {}, zerolog.Nop())
	w.poll = 5 * time.Millisecond
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	write("http://127.0.0.1:1/v2")
	testwait.Eventually(t, 10*time.Second, "the changed file to be re-applied", func() bool { return store.put("http://127.0.0.1:1/v2") })

	store.mu.Lock()
	store.block = true
	store.mu.Unlock()
	write("http://127.0.0.1:1/v3")
	select {
	case <-store.blocked:
	case <-time.After(10 * time.Second):
		t.Fatal("the third version was not applied within 10s")
	}
	w.Stop()
	store.mu.Lock()
	cancelled := store.cancelled
	store.mu.Unlock()
	if !cancelled {
		t.Fatal("Stop returned before the apply under way returned")
	}
	w.Stop() // safe twice
}

// An endpoints file is read as the list of PUT bodies it holds: each entry normalized, and each error
// naming the file, the entry and the field, word for word.
func TestEndpointsFileEntries(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, tc := range []struct{ name, file, wantErr string }{
		{"empty", "", ""},
		{"not a list", "consumerGroup: a\n", `PULSE_ENDPOINTS_FILE="FILE" must be a list of endpoints: json: cannot unmarshal object into Go value of type []json.RawMessage`},
		{"not YAML", "- a: [\n", `PULSE_ENDPOINTS_FILE="FILE" is not valid YAML or JSON: yaml: line 1: did not find expected node content`},
		{"key not a string", "- 1: a\n", `PULSE_ENDPOINTS_FILE="FILE" is not valid YAML or JSON: mapping key 1 is not a string`},
		{"unknown field", "- consumerGroup: a\n  url: https://h.example/\n  topics: [t]\n  retries: 3\n", `PULSE_ENDPOINTS_FILE="FILE": entry 1: unknown field "retries"`},
		{"wrong type", "- consumerGroup: a\n  url: https://h.example/\n  topics: [t]\n  maxRetries: three\n", `PULSE_ENDPOINTS_FILE="FILE": entry 1: cannot unmarshal string into Go struct field Endpoint.maxRetries of type int`},
		{"bad duration", "- consumerGroup: a\n  url: https://h.example/\n  topics: [t]\n  timeout: soon\n", `PULSE_ENDPOINTS_FILE="FILE": entry 1: timeout: want a duration such as "1s", got "soon"`},
		{"bad time", "- consumerGroup: a\n  url: https://h.example/\n  topics: [t]\n  createdAt: yesterday\n", `PULSE_ENDPOINTS_FILE="FILE": entry 1: createdAt: parsing time "yesterday" as "2006-01-02T15:04:05Z07:00": cannot parse "yesterday" as "2006"`},
		{"invalid field", "- consumerGroup: a\n  url: https://h.example/\n  topics: [t]\n- consumerGroup: broken\n  url: nowhere\n  topics: [t]\n", `PULSE_ENDPOINTS_FILE="FILE": entry 2 (consumerGroup "broken"): url: must be an absolute http or https URL with a host and no credentials, got "nowhere"`},
		{"no group", "- url: https://h.example/\n  topics: [t]\n", `PULSE_ENDPOINTS_FILE="FILE": entry 1 (consumerGroup ""): consumerGroup: must be 1-100 characters of letters, digits, '.', '_' or '-', starting with a letter or digit`},
		{"duplicate", "- consumerGroup: a\n  url: https://h.example/\n  topics: [t]\n- consumerGroup: a\n  url: https://h.example/\n  topics: [u]\n", `PULSE_ENDPOINTS_FILE="FILE": entries 1 and 2 both register consumerGroup "a"`},
	} {
		path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")+".yaml")
		if err := os.WriteFile(path, []byte(tc.file), 0o600); err != nil {
			t.Fatal(err)
		}
		eps, err := Load(path)
		got := ""
		if err != nil {
			got = strings.ReplaceAll(err.Error(), path, "FILE")
		}
		if got != tc.wantErr || (err == nil && len(eps) != 0) {
			t.Errorf("%s: Load = %d endpoints, error\n%s\nwant\n%s", tc.name, len(eps), got, tc.wantErr)
		}
	}

	path := filepath.Join(dir, "full.yaml")
	if err := os.WriteFile(path, []byte(`- consumerGroup: billing
  url: https://h.example/x?a=1&b=2
  topics: [payment.captured, refund.created]
  delivery: at-least-once
  ordered: true
  format: cloudevents
  offsetReset: earliest
  maxRetries: 3
  retryDelay: 1500
  retryBackoffMultiplier: 1.5
  maxRetryDelay: 2m
  timeout: 5s
  maxConcurrency: 2
  headers: {X-Key: "k&v"}
  secret: whsec_cHVsc2UtZGVtby1zaWduaW5nLWtleS1ub3Qtc2VjcmV0
  insecureSkipVerify: true
  rateLimit: 2.5
  disableAfter: 1h
  createdAt: 2020-01-01T00:00:00Z
  previousSecretExpiresAt: 2031-05-06T07:08:09.123Z
- {"consumerGroup": "audit", "url": "http://127.0.0.1:9/", "topics": ["t"], "delivery": "at-most-once"}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	eps, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	d := func(v time.Duration) *pulsetype.Duration { p := pulsetype.Duration(v); return &p }
	created, expires := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2031, 5, 6, 7, 8, 9, 123_000_000, time.UTC)
	want := []*pulsetype.Endpoint{
		{ConsumerGroup: "billing", URL: "https://h.example/x?a=1&b=2", Topics: []string{"payment.captured", "refund.created"},
			Delivery: pulsetype.AtLeastOnce, Ordered: true, Format: pulsetype.FormatCloudEvents, OffsetReset: pulsetype.OffsetEarliest,
			MaxRetries: new(3), RetryDelay: d(1500 * time.Millisecond), RetryBackoffMultiplier: new(1.5), MaxRetryDelay: d(2 * time.Minute),
			Timeout: d(5 * time.Second), MaxConcurrency: new(2), Headers: map[string]string{"X-Key": "k&v"},
			Secret: "whsec_cHVsc2UtZGVtby1zaWduaW5nLWtleS1ub3Qtc2VjcmV0", InsecureSkipVerify: true, RateLimit: 2.5,
			DisableAfter: pulsetype.Duration(time.Hour), CreatedAt: created,
			PreviousSecretExpiresAt: &expires},
		{ConsumerGroup: "audit", URL: "http://127.0.0.1:9/", Topics: []string{"t"}, Delivery: pulsetype.AtMostOnce,
			Format: pulsetype.FormatEnvelope, OffsetReset: pulsetype.OffsetLatest, MaxRetries: new(0), RetryDelay: d(time.Second),
			RetryBackoffMultiplier: new(2.0), MaxRetryDelay: d(time.Hour), Timeout: d(30 * time.Second), MaxConcurrency: new(16)},
	}
	if !reflect.DeepEqual(eps, want) {
		for i := range max(len(eps), len(want)) {
			if i >= len(eps) || i >= len(want) || !reflect.DeepEqual(eps[i], want[i]) {
				t.Errorf("entry %d = %+v, want %+v", i+1, at(eps, i), at(want, i))
			}
		}
	}
}

func at(eps []*pulsetype.Endpoint, i int) any {
	if i < len(eps) {
		return *eps[i]
	}
	return nil
}
