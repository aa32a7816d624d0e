// Package webhook sends one delivery attempt to a webhook endpoint and classifies the answer.
//
// It knows nothing about leases or retry schedules: the caller builds a Request (its body and body headers
// with Body, the webhook's wire format in the endpoint's format: the envelope or CloudEvents binary mode),
// calls Client.Send and acts on the Result. Of this project it imports pulsetype only.
//
// Invariants:
//
//   - Send never returns an error and never follows a redirect. Every failure, including a request that
//     cannot be built, is a Result with an Outcome and a one-line Message.
//   - Classification follows the delivery contract: any 2xx is OutcomeSuccess; 400, 404, 405, 410, 413, 415,
//     422 and 501 are OutcomeTerminal; every other status (3xx, 401, 403, 408, 409, 425, 429, other 4xx and
//     5xx), timeouts, connection and TLS errors are OutcomeRetry. Once a status line arrived, the status
//     decides the outcome even if reading the body then fails.
//   - A destination refused by the dial guard, and a request that cannot be built (bad URL, empty event id,
//     bad secret, bad endpoint header) are OutcomeTerminal: retrying cannot fix configuration.
//   - One deadline, Request.Timeout, covers dial, TLS handshake, writing the request, waiting for the
//     response and reading its body. A receiver that accepts and never answers costs exactly that long.
//   - Memory per attempt is bounded: at most MaxBodyBytes of the body is kept, at most MaxDrainBytes more is
//     read and discarded, then the body is closed (the connection is dropped when more remains). Response
//     headers are limited to 64 KiB.
//   - The request body is sent byte-identical. The headers of the contract (Content-Type, Idempotency-Key,
//     webhook-id, webhook-timestamp, webhook-signature, Pulse-*, User-Agent) always win over endpoint headers
//     of the same name. The signature is computed by the Standard Webhooks library with the event id as
//     message id, so any Standard Webhooks verifier accepts it. During a secret rotation webhook-signature
//     holds two space-separated signatures, the new secret's first; a verifier accepts either.
//   - The SSRF guard runs at dial time (net.Dialer.Control) on the IP address actually being connected to,
//     after DNS resolution, so a rebinding DNS answer cannot slip past it. IPv4-mapped IPv6 addresses are
//     unmapped and zones dropped before checking. 169.254.0.0/16, fe80::/10 and fd00:ec2::254 are always
//     refused, and DenyCIDRs too, unless the address is in AllowCIDRs: allow wins over both. Loopback and
//     private ranges are allowed by default. Environment proxies are ignored because the guard would only
//     see the proxy's address.
//   - TLS certificates are verified unless Request.InsecureSkipVerify is set; such requests use a separate
//     connection pool, so a verified connection is never reused unverified or the other way round, and each
//     one logs a warning.
package webhook
