package webhook

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/net/http/httpproxy"
)

const (
	// DefaultTimeout is used when Request.Timeout is zero or negative; it matches the endpoint default.
	DefaultTimeout = 30 * time.Second
	// DefaultUserAgent is used when Options.UserAgent is empty.
	DefaultUserAgent = "pulse-sidecar"
	// MaxBodyBytes is how much of a response body Result.Body keeps.
	MaxBodyBytes = 4 << 10
	// MaxDrainBytes is how much more of a response body is read and discarded, so that a short remainder still
	// lets the connection be reused. Anything beyond it is not read: the connection is closed instead.
	MaxDrainBytes = 64 << 10

	maxIdleConns           = 256
	maxIdleConnsPerHost    = 16
	idleConnTimeout        = 90 * time.Second
	keepAlive              = 30 * time.Second
	maxResponseHeaderBytes = 64 << 10
)

// Options configures a Client. The zero value is usable: default user agent, no deny list, no allow list,
// logging disabled.
type Options struct {
	// UserAgent is sent as User-Agent, e.g. "pulse-sidecar/1.4.0". Default DefaultUserAgent.
	UserAgent string
	// DenyCIDRs are destinations refused at dial time, in addition to the built-in link-local and cloud
	// metadata ranges (169.254.0.0/16, fe80::/10, fd00:ec2::254/128). Default none.
	DenyCIDRs []netip.Prefix
	// AllowCIDRs are destinations always permitted. Allow wins over both DenyCIDRs and the built-in ranges,
	// so an operator can reopen, say, 169.254.10.0/24 for a link-local receiver. Default none.
	AllowCIDRs []netip.Prefix
	// Logger receives one warning per request sent with TLS verification disabled. The zero Logger discards.
	Logger zerolog.Logger
	// Proxy, when non-nil, sends requests through proxies by net/http's rules (HTTPProxy for http URLs,
	// HTTPSProxy for https URLs through CONNECT, NoProxy exceptions; loopback destinations are never
	// proxied). Before a request goes to a proxy its destination is resolved and every address checked
	// against the deny and allow lists; the proxies' own addresses are not checked. Default nil: no proxy,
	// whatever the environment says.
	Proxy *httpproxy.Config
	// LookupNetIP resolves destinations sent through a proxy. Default net.DefaultResolver.LookupNetIP.
	LookupNetIP func(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Client sends delivery attempts. It holds two connection pools, one verifying TLS certificates and one not,
// both behind the same dial guard. A Client is safe for concurrent use; create one per process and share it.
type Client struct {
	secure    *http.Client
	insecure  *http.Client
	userAgent string
	log       zerolog.Logger
	bufs      sync.Pool // *[MaxBodyBytes]byte
}

// New returns a Client configured by opts. It does not block and performs no I/O.
func New(opts Options) *Client {
	g := newGuard(opts.DenyCIDRs, opts.AllowCIDRs)
	dialer := &net.Dialer{KeepAlive: keepAlive, Control: g.control}
	var proxy func(*http.Request) (*url.URL, error)
	dial := dialer.DialContext
	if opts.Proxy != nil {
		r := newProxyRouter(opts.Proxy, g, opts.LookupNetIP)
		proxy, dial = r.proxy, r.dialContext(dialer, &net.Dialer{KeepAlive: keepAlive})
	}
	noRedirect := func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	ua := opts.UserAgent
	if ua == "" {
		ua = DefaultUserAgent
	}
	return &Client{
		secure: &http.Client{
			Transport:     newTransport(proxy, dial, nil),
			CheckRedirect: noRedirect,
		},
		insecure: &http.Client{
			Transport:     newTransport(proxy, dial, &tls.Config{InsecureSkipVerify: true}), //nolint:gosec // per-endpoint opt-in, logged
			CheckRedirect: noRedirect,
		},
		userAgent: ua,
		log:       opts.Logger.With().Str("component", "webhook").Logger(),
		bufs:      sync.Pool{New: func() any { return new([MaxBodyBytes]byte) }},
	}
}

// newTransport builds a pooled transport. proxy is nil unless Options.Proxy is set (then a proxyRouter checks
// the destination before handing it to the proxy: the dial guard alone would see only the proxy's address).
// No transport timeout is set; the request context carries the single per-attempt deadline.
func newTransport(proxy func(*http.Request) (*url.URL, error), dial func(context.Context, string, string) (net.Conn, error), tlsConf *tls.Config) *http.Transport {
	return &http.Transport{
		Proxy:                  proxy,
		DialContext:            dial,
		TLSClientConfig:        tlsConf,
		ForceAttemptHTTP2:      true, // needed for HTTP/2 over https with a custom dialer and TLS config
		MaxIdleConns:           maxIdleConns,
		MaxIdleConnsPerHost:    maxIdleConnsPerHost,
		IdleConnTimeout:        idleConnTimeout,
		MaxResponseHeaderBytes: maxResponseHeaderBytes,
		DisableCompression:     true, // Result.Body is the bytes the receiver sent
	}
}

// Send makes one POST attempt for r and classifies the answer. It blocks until the response body has been
// read and closed, r.Timeout (default DefaultTimeout) has passed, or ctx is done, whichever comes first. It
// never returns an error and never panics on bad input: every failure is a Result, see Outcome for which
// failures are terminal. It is safe for concurrent use.
func (c *Client) Send(ctx context.Context, r Request) Result {
	start := time.Now()
	timeout := r.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	ts := r.Timestamp
	if ts.IsZero() {
		ts = start
	}
	attemptCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	req, err := newHTTPRequest(attemptCtx, &r, ts, c.userAgent)
	if err != nil {
		return Result{Outcome: OutcomeTerminal, Message: err.Error(), Duration: time.Since(start)}
	}
	hc := c.secure
	if r.InsecureSkipVerify && req.URL.Scheme == "https" {
		hc = c.insecure
		c.log.Warn().Str("host", req.URL.Host).Str("consumer_group", r.ConsumerGroup).
			Str("delivery_id", r.DeliveryID).Msg("tls certificate verification disabled for delivery")
	}

	resp, err := hc.Do(req)
	if err != nil {
		outcome, msg := failure(err, ctx, attemptCtx, timeout)
		return Result{Outcome: outcome, Message: msg, Duration: time.Since(start)}
	}
	body, readErr := c.readBody(resp.Body)
	res := Result{
		Outcome:    classifyStatus(resp.StatusCode),
		HTTPStatus: resp.StatusCode,
		Body:       body,
		Message:    statusMessage(resp),
	}
	if readErr != nil {
		// The status line is the receiver's answer; a body cut short does not change the outcome.
		_, why := failure(readErr, ctx, attemptCtx, timeout)
		res.Message += " (response body incomplete: " + why + ")"
	}
	if res.Outcome == OutcomeRetry {
		res.RetryAfter = parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
	}
	res.Duration = time.Since(start)
	return res
}

// readBody keeps the first MaxBodyBytes of body, discards at most MaxDrainBytes more and closes it. Reads run
// under the request context, so a slow body ends at the attempt deadline. io.EOF is not an error.
func (c *Client) readBody(body io.ReadCloser) (string, error) {
	defer body.Close()
	buf := c.bufs.Get().(*[MaxBodyBytes]byte)
	defer c.bufs.Put(buf)

	var n int
	var err error
	for n < len(buf) && err == nil {
		var m int
		m, err = body.Read(buf[n:])
		n += m
	}
	kept := string(buf[:n])
	if err == nil {
		_, err = io.Copy(io.Discard, io.LimitReader(body, MaxDrainBytes))
	}
	if err == io.EOF {
		err = nil
	}
	return kept, err
}

// CloseIdleConnections closes pooled connections that are not in use, in both pools. It does not block
// in-flight requests; call it at shutdown after the last Send returned.
func (c *Client) CloseIdleConnections() {
	c.secure.CloseIdleConnections()
	c.insecure.CloseIdleConnections()
}
