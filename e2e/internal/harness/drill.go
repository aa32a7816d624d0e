package harness

import (
	"net/url"

	"github.com/pulse-sidecar/pulse/internal/drill"
)

// StartDrill starts a drill.Proxy in front of the test database (b.URI's host), closed in t.Cleanup, and
// returns it with its connection string (b.URI with the proxy's host). Point a sidecar at it with
// FastEnv(map[string]string{"PULSE_MONGODB_URI": uri}).
func (b *Bundle) StartDrill() (*drill.Proxy, string) {
	b.T.Helper()
	u, err := url.Parse(b.URI)
	if err != nil {
		b.T.Fatalf("drill: parse %s: %v", b.URI, err)
	}
	p, err := drill.Listen(u.Host)
	if err != nil {
		b.T.Fatal(err)
	}
	b.T.Cleanup(func() { _ = p.Close() })
	u.Host = p.Addr()
	return p, u.String()
}
