package webhook

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"golang.org/x/net/http/httpproxy"
)

// connectProxy is a forward proxy on loopback: it tunnels CONNECT to target (whatever host was asked for)
// and records every request line it got.
type connectProxy struct {
	*httptest.Server
	mu   sync.Mutex
	seen []string
}

func newConnectProxy(t *testing.T, target string) *connectProxy {
	p := &connectProxy{}
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		p.seen = append(p.seen, r.Method+" "+r.Host)
		p.mu.Unlock()
		if r.Method != http.MethodConnect {
			w.WriteHeader(http.StatusOK)
			return
		}
		up, err := net.Dial("tcp", target)
		if err != nil {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		w.WriteHeader(http.StatusOK)
		conn, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			up.Close()
			return
		}
		go func() { _, _ = io.Copy(up, rw); up.Close() }()
		_, _ = io.Copy(conn, up)
		conn.Close()
	}))
	t.Cleanup(p.Close)
	return p
}

func (p *connectProxy) lines() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.seen...)
}

// An https webhook goes through HTTPS_PROXY with CONNECT (TLS end to end) once its name resolved to
// addresses the guard allows (the proxy's own loopback address is not refused by a deny list covering it); a
// name resolving to a refused address never reaches the proxy.
func TestSendThroughProxyChecksTheDestination(t *testing.T) {
	t.Parallel()
	rc := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	t.Cleanup(rc.Close)
	proxy := newConnectProxy(t, rc.Listener.Addr().String())
	_, port, _ := net.SplitHostPort(rc.Listener.Addr().String())
	dns := map[string]string{"receiver.example": "192.0.2.10", "metadata.example": "169.254.169.254", "denied.example": "10.1.2.3"}
	client := New(Options{
		Proxy:     &httpproxy.Config{HTTPSProxy: proxy.URL, NoProxy: "direct.example"},
		DenyCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("127.0.0.0/8")},
		LookupNetIP: func(_ context.Context, _, host string) ([]netip.Addr, error) {
			if a, ok := dns[host]; ok {
				return []netip.Addr{netip.MustParseAddr(a)}, nil
			}
			return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
		},
	})

	req := newRequest("https://receiver.example:" + port + "/hook")
	req.InsecureSkipVerify = true // the test server's certificate names 127.0.0.1
	if res := client.Send(t.Context(), req); res.Outcome != OutcomeSuccess || res.HTTPStatus != http.StatusNoContent {
		t.Fatalf("through the proxy: %+v, want success 204", res)
	}
	for _, tc := range []struct{ host, want string }{
		{"metadata.example", "blocked: 169.254.169.254 is link-local (cloud metadata)"},
		{"denied.example", "blocked: 10.1.2.3 is in denied range 10.0.0.0/8"},
	} {
		res := client.Send(t.Context(), newRequest("https://"+tc.host+"/hook"))
		if res.Outcome != OutcomeTerminal || res.Message != tc.want {
			t.Errorf("%s: %v %q, want terminal %q", tc.host, res.Outcome, res.Message, tc.want)
		}
	}
	if res := client.Send(t.Context(), newRequest("https://unknown.example/hook")); res.Outcome != OutcomeRetry || !strings.Contains(res.Message, "unknown.example") {
		t.Errorf("unresolvable: %v %q, want retry naming the host", res.Outcome, res.Message)
	}
	if got := proxy.lines(); len(got) != 1 || got[0] != "CONNECT receiver.example:"+port {
		t.Errorf("the proxy saw %q, want only CONNECT receiver.example:%s", got, port)
	}
}
