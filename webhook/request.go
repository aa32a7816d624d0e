package webhook

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// Request is one delivery attempt to send. The zero values of Timeout and Timestamp are replaced by defaults;
// URL and EventID are required.
type Request struct {
	// URL is the endpoint, http or https. Redirects from it are never followed.
	URL string
	// Body is sent byte-identical; the caller keeps it identical across attempts so signatures stay stable.
	Body []byte

	EventID       string // sent as Idempotency-Key and webhook-id, and signed as the Standard Webhooks id
	Topic         string // Pulse-Topic
	ConsumerGroup string // Pulse-Consumer-Group
	DeliveryID    string // Pulse-Delivery-Id
	Attempt       int    // Pulse-Attempt, 1-based; values below 1 are sent as 1

	// Headers are the endpoint's own headers. They cannot replace the headers this package sets (see
	// reservedHeaders); such entries are dropped.
	Headers map[string]string
	// BodyHeaders describe the body and are set after the endpoint's own headers, replacing them: the
	// ce-* headers of a CloudEvents binary-mode request, and Content-Type (application/json when absent).
	// Contract headers other than Content-Type cannot be replaced.
	BodyHeaders map[string]string
	// Secret is the Standard Webhooks signing secret ("whsec_<base64>"). Empty means the request is unsigned.
	Secret string
	// PreviousSecret, during a secret rotation's overlap, also signs the request: webhook-signature then
	// carries two space-separated signatures, Secret's first, as the Standard Webhooks spec allows for
	// rotations, so a receiver holding either secret verifies it. Ignored when empty, equal to Secret, or
	// when Secret is empty.
	PreviousSecret string
	// Timeout bounds the whole attempt: dial, TLS, sending, waiting for and reading the response.
	// Zero or negative means DefaultTimeout.
	Timeout time.Duration
	// InsecureSkipVerify disables TLS certificate verification for this request. Each use is logged.
	InsecureSkipVerify bool
	// Timestamp is sent as webhook-timestamp (unix seconds) and signed; zero means the time of the call.
	Timestamp time.Time
}

// reservedHeaders are set by Send on every request; an endpoint header with one of these names (in any case)
// is dropped. Go's client additionally ignores Host, Content-Length and Transfer-Encoding in a header map.
var reservedHeaders = map[string]bool{
	"Content-Type":         true,
	"Idempotency-Key":      true,
	"Webhook-Id":           true,
	"Webhook-Timestamp":    true,
	"Webhook-Signature":    true,
	"Pulse-Topic":          true,
	"Pulse-Consumer-Group": true,
	"Pulse-Delivery-Id":    true,
	"Pulse-Attempt":        true,
	"User-Agent":           true,
}

// invalidRequestError marks a request that cannot be sent as given; Send reports it as OutcomeTerminal.
type invalidRequestError struct{ msg string }

func (e *invalidRequestError) Error() string { return "invalid request: " + e.msg }

func invalid(msg string) error { return &invalidRequestError{msg: msg} }

// newHTTPRequest validates r and builds the POST with every contract header, signed when r.Secret is set
// (and by r.PreviousSecret too during a rotation).
// Errors are *invalidRequestError and never contain the secret or URL credentials.
func newHTTPRequest(ctx context.Context, r *Request, ts time.Time, userAgent string) (*http.Request, error) {
	u, err := url.Parse(r.URL)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // url.Error repeats the URL, which may carry a password
		}
		return nil, invalid("URL does not parse: " + err.Error())
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, invalid("URL scheme must be http or https, not " + strconv.Quote(u.Scheme))
	}
	if u.Host == "" {
		return nil, invalid("URL has no host")
	}
	if r.EventID == "" {
		return nil, invalid("event id is empty")
	}

	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), bytes.NewReader(r.Body))
	if err != nil {
		return nil, invalid(err.Error())
	}
	// Without GetBody the request is not replayable: Go's transport would otherwise send a request carrying
	// Idempotency-Key again, silently, when a reused keep-alive connection is closed before the answer. Each
	// POST that leaves the sidecar must be one recorded attempt; a failed connection is a failed attempt.
	req.GetBody = nil
	h := req.Header
	for name, value := range r.Headers {
		if !pulsetype.ValidHeaderName(name) {
			return nil, invalid("endpoint header name " + strconv.Quote(name) + " is not a valid token")
		}
		if !pulsetype.ValidHeaderValue(value) {
			return nil, invalid("endpoint header " + strconv.Quote(name) + " has a control character in its value")
		}
		if reservedHeaders[http.CanonicalHeaderKey(name)] {
			continue
		}
		h.Set(name, value)
	}

	h.Set("Content-Type", "application/json")
	for name, value := range r.BodyHeaders {
		if !pulsetype.ValidHeaderName(name) || !pulsetype.ValidHeaderValue(value) {
			return nil, invalid("body header " + strconv.Quote(name) + " is not a valid header")
		}
		if k := http.CanonicalHeaderKey(name); k == "Content-Type" || !reservedHeaders[k] {
			h.Set(name, value)
		}
	}
	h.Set("Idempotency-Key", r.EventID)
	h.Set(standardwebhooks.HeaderWebhookID, r.EventID)
	h.Set(standardwebhooks.HeaderWebhookTimestamp, strconv.FormatInt(ts.Unix(), 10))
	if r.Secret != "" {
		sig, err := sign(r.Secret, r.EventID, ts, r.Body)
		if err != nil {
			return nil, err
		}
		if r.PreviousSecret != "" && r.PreviousSecret != r.Secret {
			old, err := sign(r.PreviousSecret, r.EventID, ts, r.Body)
			if err != nil {
				return nil, err
			}
			sig += " " + old
		}
		h.Set(standardwebhooks.HeaderWebhookSignature, sig)
	}
	h.Set("Pulse-Topic", r.Topic)
	h.Set("Pulse-Consumer-Group", r.ConsumerGroup)
	h.Set("Pulse-Delivery-Id", r.DeliveryID)
	h.Set("Pulse-Attempt", strconv.Itoa(max(r.Attempt, 1)))
	h.Set("User-Agent", userAgent)
	return req, nil
}

// sign returns the webhook-signature value "v1,<base64 HMAC-SHA256 of id.timestamp.body>" computed by the
// Standard Webhooks library, so receivers using any Standard Webhooks verifier accept it.
func sign(secret, id string, ts time.Time, body []byte) (string, error) {
	if strings.TrimPrefix(secret, "whsec_") == "" {
		return "", invalid("secret is empty after the whsec_ prefix")
	}
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		return "", invalid("secret is not base64 after the whsec_ prefix")
	}
	sig, err := wh.Sign(id, ts, body)
	if err != nil {
		return "", invalid("cannot sign: " + err.Error())
	}
	return sig, nil
}
