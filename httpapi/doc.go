// Package httpapi serves the sidecar's public HTTP API (docs/api.md, docs/openapi.yaml) with chi:
// ingest (POST /v1/events), endpoint registration, inspection, /healthz and /readyz. ProbeHandler serves the
// probe routes alone, for a listener of their own. The JSON shapes of requests and answers live here
// (Endpoint, Timestamp, Duration and the unexported answer types), converted from and to the pulsetype
// domain, which carries no JSON tags; testdata/answers pins every answer byte for byte.
//
// Invariants: every 4xx/5xx body is {"error": {"code": "<snake_case>", "message": "<sentence>"}}; a rejected
// request stores nothing; a publish answers 202 only once its events are durable; request bodies are read
// through a size limit while reading, never after; secrets are never returned in full; every administrative
// action that succeeds logs one audit line (component "audit") naming the token that made it, never a
// token, a secret or a header value.
package httpapi
