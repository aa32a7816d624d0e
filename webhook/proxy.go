package webhook

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"

	"golang.org/x/net/http/httpproxy"
)

// proxyRouter sends requests through the proxies of an httpproxy.Config (the rules of net/http's
// ProxyFromEnvironment, from values the caller read) and keeps the destination guard meaningful: through a
// proxy, the sidecar only dials the proxy, so the destination is resolved here and every one of its
// addresses is checked by the guard before the request is handed to the proxy. What moves to the proxy: it
// resolves the name again and connects, so an answer that changes between the two lookups (DNS rebinding) is
// the proxy's to refuse; for http URLs it sees the whole request, for https it sees only the host and port
// of the CONNECT (TLS stays end to end). The proxies' own addresses are configuration, not destinations:
// the guard does not check them. It is immutable and safe for concurrent use.
type proxyRouter struct {
	choose  func(*url.URL) (*url.URL, error)
	guard   *guard
	lookup  func(ctx context.Context, network, host string) ([]netip.Addr, error)
	proxies map[string]bool // host:port of every configured proxy, as the transport dials it
}

func newProxyRouter(cfg *httpproxy.Config, g *guard, lookup func(context.Context, string, string) ([]netip.Addr, error)) *proxyRouter {
	if lookup == nil {
		lookup = net.DefaultResolver.LookupNetIP
	}
	p := &proxyRouter{choose: cfg.ProxyFunc(), guard: g, lookup: lookup, proxies: map[string]bool{}}
	for _, raw := range []string{cfg.HTTPProxy, cfg.HTTPSProxy} {
		if addr := proxyAddr(raw); addr != "" {
			p.proxies[addr] = true
		}
	}
	return p
}

// proxyAddr returns the host:port the transport dials for a proxy setting ("" when empty or unparsable),
// with the default port of its scheme, as httpproxy reads it (no scheme means http).
func proxyAddr(raw string) string {
	if raw == "" {
		return ""
	}
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || !strings.Contains(raw, "://") {
		if u, err = url.Parse("http://" + raw); err != nil {
			return ""
		}
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443", "socks5": "1080", "socks5h": "1080"}[u.Scheme]
	}
	return net.JoinHostPort(strings.ToLower(u.Hostname()), port)
}

// proxy is an http.Transport Proxy function. It returns nil for a direct connection (checked at dial time as
// always), or the proxy URL once every address of the destination passed the guard. A refused destination
// is a *blockedError (terminal), a failed lookup a *net.DNSError (retried).
func (p *proxyRouter) proxy(req *http.Request) (*url.URL, error) {
	u, err := p.choose(req.URL)
	if err != nil || u == nil {
		return nil, err
	}
	if err := p.checkDestination(req.Context(), req.URL.Hostname()); err != nil {
		return nil, err
	}
	return u, nil
}

func (p *proxyRouter) checkDestination(ctx context.Context, host string) error {
	if a, err := netip.ParseAddr(host); err == nil {
		return p.guard.check(a)
	}
	addrs, err := p.lookup(ctx, "ip", host)
	if err != nil {
		return err
	}
	if len(addrs) == 0 {
		return &net.DNSError{Err: "no addresses", Name: host, IsNotFound: true}
	}
	for _, a := range addrs {
		if err := p.guard.check(a); err != nil {
			return err
		}
	}
	return nil
}

// dialContext dials a configured proxy without the guard and everything else through guarded.
func (p *proxyRouter) dialContext(guarded, unguarded *net.Dialer) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if p.proxies[strings.ToLower(addr)] {
			return unguarded.DialContext(ctx, network, addr)
		}
		return guarded.DialContext(ctx, network, addr)
	}
}
