package sidecar

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/pulse-sidecar/pulse/config"
	"github.com/pulse-sidecar/pulse/internal/startstop"
	"github.com/pulse-sidecar/pulse/internal/testdb"
)

func load(t *testing.T, env map[string]string) *config.Config {
	t.Helper()
	cfg, err := config.Load(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// The lifecycle of internal/startstop: Stop before Start and twice is safe; Start returns once the API
// answers at Addr, a second Start is ErrStarted; Stop shuts down (the API stops answering) and Wait then
// returns nil, a requested shutdown.
func TestSidecarLifecycle(t *testing.T) {
	t.Parallel()
	_, dbName := testdb.Database(t)
	cfg := load(t, map[string]string{"PULSE_MONGODB_URI": testdb.URI(t), "PULSE_DATABASE": dbName, "PULSE_LISTEN": "127.0.0.1:0"})
	New(cfg, Options{}).Stop()
	s := New(cfg, Options{})
	s.Stop() // before Start: does nothing, and the Start below runs as usual
	if err := s.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	if err := s.Start(t.Context()); !errors.Is(err, startstop.ErrStarted) {
		t.Fatalf("second Start = %v, want startstop.ErrStarted", err)
	}
	resp, err := http.Get("http://" + s.Addr() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /readyz after Start answered %d, want 200", resp.StatusCode)
	}
	s.Stop()
	s.Stop()
	if err := s.Wait(); err != nil {
		t.Fatalf("Wait after Stop = %v, want nil", err)
	}
	if resp, err := http.Get("http://" + s.Addr() + "/readyz"); err == nil {
		resp.Body.Close()
		t.Fatalf("GET /readyz after Stop answered %d, want no answer", resp.StatusCode)
	}
}

// The end of Start's ctx shuts the sidecar down as Stop does.
func TestSidecarStopsWithItsContext(t *testing.T) {
	t.Parallel()
	_, dbName := testdb.Database(t)
	cfg := load(t, map[string]string{"PULSE_MONGODB_URI": testdb.URI(t), "PULSE_DATABASE": dbName, "PULSE_LISTEN": "127.0.0.1:0"})
	ctx, cancel := context.WithCancel(t.Context())
	s := New(cfg, Options{})
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := s.Wait(); err != nil {
		t.Fatalf("Wait after the context ended = %v, want nil", err)
	}
}

// A busy port stops Start before anything else, with an error naming PULSE_LISTEN, and undoes nothing
// it did not do (goleak in TestMain checks that nothing was left running).
func TestSidecarStartOnABusyPort(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	s := New(load(t, map[string]string{"PULSE_MONGODB_URI": "mongodb://127.0.0.1:1/", "PULSE_LISTEN": ln.Addr().String()}), Options{})
	if err := s.Start(t.Context()); err == nil || !strings.Contains(err.Error(), "PULSE_LISTEN") {
		t.Fatalf("Start on a busy port = %v, want an error naming PULSE_LISTEN", err)
	}
	if s.Addr() != "" {
		t.Fatalf("Addr after a failed Start = %q, want empty", s.Addr())
	}
	s.Stop() // safe after a failed Start
}
