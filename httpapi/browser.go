package httpapi

import (
	"cmp"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/go-chi/chi/v5"
)

// The browser rules of the API listener. A web page the operator opens can make the browser send requests to
// the sidecar's loopback address, and with no token configured nothing else stands in its way. The rules
// below refuse every such request, so that a page of another origin can neither change nor read anything:
//
//   - Host: on a loopback listener, a request whose Host is a DNS name other than localhost, *.localhost or
//     one of Options.AllowedHosts is refused (403 host_not_allowed). A page whose own name resolves to
//     127.0.0.1 (DNS rebinding) is same-origin in the browser's eyes, so only its Host tells it apart.
//   - Origin: a request that a browser marks as coming from another origin is refused (403
//     cross_origin_request), whatever its method: net/http's CrossOriginProtection (Sec-Fetch-Site, else
//     Origin against Host) decides, applied to reads too, since answers of this API are not for other pages.
//     Requests without either header (curl, SDKs, the application) and the console's own same-origin calls
//     pass. A top-level navigation to the console's static files (GET or HEAD under /ui/) passes too: the
//     files hold no data.
//   - Media types: a request body is read only with its documented media type (415 unsupported_media_type),
//     see requireJSON; a page can send text/plain, form encodings or no Content-Type without a preflight.
//
// The probe listener (ProbeHandler) is meant for the kubelet and Prometheus only and has none of these rules.

// crossOrigin is the library check; Check's verdict is asked of every request as if it were a POST (see
// browserGuard).
var crossOrigin = http.NewCrossOriginProtection()

// browserGuard applies the Host and Origin rules above to every route of the API listener.
func (s *Server) browserGuard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.opts.CheckHost && !s.hostAllowed(r.Host) {
			writeError(w, http.StatusForbidden, "host_not_allowed", "Host "+strconv.Quote(r.Host)+" is not a loopback name: the API answers localhost, *.localhost, IP addresses and PULSE_ALLOWED_HOSTS only (a web page whose name resolves to 127.0.0.1 is refused)")
			return
		}
		if !consoleNavigation(r) {
			// CrossOriginProtection exempts safe methods; the same verdict is wanted for reads, so the check sees
			// the request as unsafe. Check only reads the method and headers of the shallow copy.
			unsafe := *r
			unsafe.Method = http.MethodPost
			if err := crossOrigin.Check(&unsafe); err != nil {
				writeError(w, http.StatusForbidden, "cross_origin_request", "a browser sent this request for a page of another origin ("+
					describeOrigin(r)+"): the API refuses cross-origin requests; call it from the application or the console at /ui/")
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// consoleNavigation reports whether r loads one of the console's static files (GET or HEAD under /ui), which
// a link from anywhere may do.
func consoleNavigation(r *http.Request) bool {
	return (r.Method == http.MethodGet || r.Method == http.MethodHead) && (r.URL.Path == "/ui" || strings.HasPrefix(r.URL.Path, "/ui/"))
}

// describeOrigin names what made the request cross-origin, for the error message.
func describeOrigin(r *http.Request) string {
	var parts []string
	if v := r.Header.Get("Sec-Fetch-Site"); v != "" {
		parts = append(parts, "Sec-Fetch-Site: "+v)
	}
	if v := r.Header.Get("Origin"); v != "" {
		parts = append(parts, "Origin: "+v)
	}
	return strings.Join(parts, ", ")
}

// hostAllowed reports whether a Host header (host or host:port) names this sidecar without DNS: an IP
// address, localhost or a name under .localhost (RFC 6761 §6.3: resolved to loopback by the client itself),
// or one of Options.AllowedHosts (compared without case, port ignored).
func (s *Server) hostAllowed(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(strings.Trim(host, "[]")), ".")
	if _, err := netip.ParseAddr(host); err == nil {
		return true
	}
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	return slices.ContainsFunc(s.opts.AllowedHosts, func(a string) bool { return strings.EqualFold(a, host) })
}

// requireJSON refuses a request that carries a body whose Content-Type is not application/json (415
// unsupported_media_type): a body is read only with its documented media type. A request without a body
// (Content-Length 0) passes whatever it says, and so does a GET or HEAD, whose body is never read. It guards every /v1 route but the publish, which also takes the
// CloudEvents media types and checks them itself.
func requireJSON(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A GET's body is never read, so its media type does not matter.
		if r.Method != http.MethodGet && r.Method != http.MethodHead && r.ContentLength != 0 && r.Body != nil && r.Body != http.NoBody {
			ct := r.Header.Get("Content-Type")
			if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
				if ct == "" {
					ct = "none"
				}
				writeError(w, http.StatusUnsupportedMediaType, "unsupported_media_type", "the body of "+r.Method+" "+r.URL.Path+
					" must be sent with Content-Type: application/json, got "+ct)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// methodNotAllowed answers 405 with an Allow header listing the methods the path does take (RFC 9110
// §15.5.6), found by asking router for each method.
func methodNotAllowed(router chi.Routes) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		path := cmp.Or(r.URL.RawPath, r.URL.Path) // what chi routes on
		var allow []string
		for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
			if router.Match(chi.NewRouteContext(), m, path) {
				allow = append(allow, m)
			}
		}
		if slices.Contains(allow, http.MethodGet) && !slices.Contains(allow, http.MethodHead) {
			allow = slices.Insert(allow, 1, http.MethodHead) // middleware.GetHead answers HEAD wherever GET is routed
		}
		w.Header().Set("Allow", strings.Join(allow, ", "))
		writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", r.Method+" is not allowed on "+r.URL.Path)
	}
}

// pathParam returns the route parameter name of r, percent-decoded once: chi matches on the escaped path
// (r.URL.RawPath) when the client escaped a character the decoded path would not say the same way (RFC 3986
// §2.1), and on the decoded path otherwise, so /v1/events/a%3Ab names the event "a:b", as /v1/events/a:b does,
// and /v1/events/a%253Ab names "a%3Ab".
func pathParam(r *http.Request, name string) string {
	raw := chi.URLParam(r, name)
	if r.URL.RawPath == "" {
		return raw // chi routed on the decoded path
	}
	if v, err := url.PathUnescape(raw); err == nil {
		return v
	}
	return raw
}
