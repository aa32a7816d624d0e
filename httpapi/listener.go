package httpapi

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
)

// JSONErrorListener wraps ln so that the answers net/http's server writes itself, before any handler runs,
// are the API's JSON error ({"error": {"code", "message"}}) and not Go's plain text: a request it cannot
// parse (a malformed Host header, two Host headers, a bad header line: 400 bad_request), headers over the
// limit (431 headers_too_large), an unknown Transfer-Encoding (501 not_implemented). net/http has no
// option for these answers: it writes them on the connection as one write of "HTTP/1.1 <status>" followed
// by the headers "Content-Type: text/plain; charset=utf-8" and "Connection: close" and the text, then
// closes the connection, so the wrapped connection recognises that write (a handler's answer always has a
// Date header, so it never matches) and writes the JSON answer instead. Everything else passes untouched.
func JSONErrorListener(ln net.Listener) net.Listener { return jsonErrorListener{ln} }

type jsonErrorListener struct{ net.Listener }

func (l jsonErrorListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &jsonErrorConn{Conn: c}, nil
}

// jsonErrorConn rewrites net/http's own error answers (see JSONErrorListener). Only the connection's first
// write of each answer can be one: net/http writes its error answer in one call, never after a partial one.
type jsonErrorConn struct {
	net.Conn
	mu sync.Mutex
}

// goErrorHeaders are the headers between the status line and the text of net/http's own error answers.
const goErrorHeaders = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

func (c *jsonErrorConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out, ok := rewriteGoError(b)
	if !ok {
		return c.Conn.Write(b)
	}
	if _, err := c.Conn.Write(out); err != nil {
		return 0, err
	}
	return len(b), nil
}

// CloseWrite shuts down the writing side of the connection when it can (a TCP connection), as net/http does
// before closing a connection it answered 431 on, so the client reads the answer rather than a reset.
func (c *jsonErrorConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// rewriteGoError returns the JSON answer for b when b is a whole error answer of net/http's server.
func rewriteGoError(b []byte) ([]byte, bool) {
	rest, ok := bytes.CutPrefix(b, []byte("HTTP/1.1 "))
	if !ok {
		return nil, false
	}
	statusLine, text, ok := bytes.Cut(rest, []byte(goErrorHeaders))
	if !ok || bytes.ContainsAny(statusLine, "\r\n") || len(statusLine) < 3 {
		return nil, false
	}
	status, err := strconv.Atoi(string(statusLine[:3]))
	if err != nil || status < 400 {
		return nil, false
	}
	// The text is "<status> <reason>" or "<status> <reason>: <detail>".
	_, detail, _ := strings.Cut(string(text), ": ")
	var code, msg string
	switch {
	case status == 431:
		code, msg = "headers_too_large", "the request's headers are larger than the server accepts"
	case status == 501:
		code, msg = "not_implemented", "the request's Transfer-Encoding is not supported (chunked is)"
	case status == 505:
		code, msg = "http_version_not_supported", "the request's HTTP version is not supported (HTTP/1.0, HTTP/1.1 and HTTP/2 are)"
	case detail != "":
		code, msg = "bad_request", "the request is not valid HTTP: "+detail
	default:
		code, msg = "bad_request", "the request is not valid HTTP (for example it has two Host headers, or a header line that cannot be parsed)"
	}
	var body errorBody
	body.Error.Code, body.Error.Message = code, msg
	var js bytes.Buffer
	writeJSONTo(&js, body)
	return fmt.Appendf(nil, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		status, http.StatusText(status), js.Len(), js.Bytes()), true
}
