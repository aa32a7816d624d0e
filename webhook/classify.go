package webhook

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Outcome is what the caller should do with a delivery after one attempt.
type Outcome int

const (
	// OutcomeSuccess means the receiver accepted the event (any 2xx).
	OutcomeSuccess Outcome = iota
	// OutcomeRetry means the attempt failed in a way a later attempt may fix: a status outside the terminal
	// list, a timeout, a connection or TLS error.
	OutcomeRetry
	// OutcomeTerminal means retrying cannot help: a terminal status (400, 404, 405, 410, 413, 415, 422, 501),
	// a destination refused by the dial guard, or a request that cannot be built (bad URL, secret or header).
	OutcomeTerminal
)

// String returns "success", "retry" or "terminal".
func (o Outcome) String() string {
	switch o {
	case OutcomeSuccess:
		return "success"
	case OutcomeRetry:
		return "retry"
	case OutcomeTerminal:
		return "terminal"
	}
	return "Outcome(" + strconv.Itoa(int(o)) + ")"
}

// Result describes one delivery attempt. Send always returns one; there is no separate error.
type Result struct {
	Outcome Outcome
	// HTTPStatus is the response status code, 0 when no response was received.
	HTTPStatus int
	// Body holds at most MaxBodyBytes of the response body, cut at a byte boundary (not necessarily valid UTF-8).
	Body string
	// Message is a short human sentence, e.g. "HTTP 500 Internal Server Error", "timeout after 2s",
	// "connection refused", "blocked: 169.254.169.254 is link-local (cloud metadata)".
	Message string
	// RetryAfter is the delay asked for by a Retry-After header (delta-seconds or HTTP-date) on a response
	// whose Outcome is OutcomeRetry. It is 0 when the header is absent, invalid or in the past, and for any
	// other outcome. The caller applies its own cap.
	RetryAfter time.Duration
	// Duration is the wall time of the attempt, from sending the request to closing the response body.
	Duration time.Duration
}

// classifyStatus maps a response status to an outcome, per the delivery contract.
func classifyStatus(code int) Outcome {
	switch {
	case code >= 200 && code <= 299:
		return OutcomeSuccess
	}
	switch code {
	case http.StatusBadRequest, http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusGone,
		http.StatusRequestEntityTooLarge, http.StatusUnsupportedMediaType, http.StatusUnprocessableEntity,
		http.StatusNotImplemented:
		return OutcomeTerminal
	}
	return OutcomeRetry
}

// statusMessage is "HTTP 503 Service Unavailable", or "redirect to <location> not followed" for a 3xx that
// carries a Location.
func statusMessage(resp *http.Response) string {
	if resp.StatusCode >= 300 && resp.StatusCode <= 399 && resp.Header.Get("Location") != "" {
		loc := resp.Header.Get("Location")
		if u, err := resp.Location(); err == nil {
			loc = u.String()
		}
		return "redirect to " + loc + " not followed"
	}
	if text := http.StatusText(resp.StatusCode); text != "" {
		return "HTTP " + strconv.Itoa(resp.StatusCode) + " " + text
	}
	return "HTTP " + strconv.Itoa(resp.StatusCode)
}

// failure turns an error from sending the request or reading the response into an outcome and a message.
// parent is the caller's context, attempt the one carrying the request deadline of timeout.
func failure(err error, parent, attempt context.Context, timeout time.Duration) (Outcome, string) {
	var blocked *blockedError
	if errors.As(err, &blocked) {
		return OutcomeTerminal, blocked.Error()
	}
	if parent.Err() != nil {
		return OutcomeRetry, "aborted by caller: " + context.Cause(parent).Error()
	}
	if errors.Is(attempt.Err(), context.DeadlineExceeded) {
		return OutcomeRetry, "timeout after " + timeout.String()
	}
	return OutcomeRetry, errorMessage(err)
}

// errorMessage describes a transport error without Go's "Post \"url\": dial tcp ...:" prefixes.
func errorMessage(err error) string {
	var (
		dnsErr   *net.DNSError
		certErr  *tls.CertificateVerificationError
		recErr   tls.RecordHeaderError
		alertErr tls.AlertError
		urlErr   *url.Error
	)
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset by receiver"
	case errors.Is(err, syscall.EHOSTUNREACH):
		return "host unreachable"
	case errors.Is(err, syscall.ENETUNREACH):
		return "network unreachable"
	case errors.As(err, &dnsErr):
		return fmt.Sprintf("DNS lookup of %s failed: %s", dnsErr.Name, dnsErr.Err)
	case errors.As(err, &certErr):
		return "TLS certificate verification failed: " + certErr.Err.Error()
	case errors.Is(err, http.ErrSchemeMismatch):
		return "TLS handshake failed: receiver answered with plain HTTP"
	case errors.As(err, &recErr):
		return "TLS handshake failed: receiver did not answer with TLS"
	case errors.As(err, &alertErr):
		return "TLS handshake failed: " + alertErr.Error()
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "connection closed by receiver before a complete response"
	case errors.As(err, &urlErr):
		return "request failed: " + urlErr.Err.Error()
	}
	return "request failed: " + err.Error()
}

// parseRetryAfter reads a Retry-After value (RFC 9110 §10.2.3): delta-seconds (1*DIGIT) or an HTTP-date,
// relative to now. It returns 0 for an empty, malformed, zero or past value; a delta too large for a
// time.Duration saturates at the largest one.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if isDigits(v) {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n > int64(math.MaxInt64/time.Second) {
			return time.Duration(math.MaxInt64) // only overflow can fail on digits
		}
		return time.Duration(n) * time.Second
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0
	}
	if d := t.Sub(now); d > 0 {
		return d
	}
	return 0
}

func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}
