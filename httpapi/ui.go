package httpapi

import (
	"embed"
	"io/fs"
	"net/http"
)

// consoleFiles are the operator console's page, script and style sheet (httpapi/ui), built into the binary.
//
//go:embed ui
var consoleFiles embed.FS

// consoleCSP lets the console load only its own files and call only its own origin: no inline script or
// style, no frames (of it or in it), no form submission, no plugins.
const consoleCSP = "default-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'; object-src 'none'"

// consoleHandler serves the operator console, mounted at /ui on the API listener only (never the probe
// listener): GET /ui redirects to /ui/, which is index.html; /ui/app.js and /ui/app.css follow. The files are
// static and hold no data, so they load without a token; the page calls /v1 with the token the operator types
// (sent as Authorization: Bearer, kept in the tab's sessionStorage, never in a URL). Every answer carries
// consoleCSP, X-Content-Type-Options nosniff, Referrer-Policy no-referrer and X-Frame-Options DENY. Methods
// other than GET and HEAD answer 405.
func consoleHandler() http.Handler {
	sub, err := fs.Sub(consoleFiles, "ui")
	if err != nil {
		panic(err) // the embedded tree always has ui/
	}
	files := http.StripPrefix("/ui", http.FileServerFS(sub))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", consoleCSP)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Cache-Control", "no-cache")
		switch {
		case r.Method != http.MethodGet && r.Method != http.MethodHead:
			h.Set("Allow", "GET, HEAD")
			writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", r.Method+" is not allowed on "+r.URL.Path)
		case r.URL.Path == "/ui":
			http.Redirect(w, r, "/ui/", http.StatusMovedPermanently)
		default:
			files.ServeHTTP(w, r)
		}
	})
}
