// Package docs holds the one document the sidecar serves about itself: the OpenAPI 3.1 description of its
// HTTP API (openapi.yaml beside this file). The Markdown pages of this directory are for readers only.
package docs

import _ "embed"

// OpenAPI is the bytes of docs/openapi.yaml, served at GET /v1/openapi.yaml (package httpapi). Callers must
// not modify it.
//
//go:embed openapi.yaml
var OpenAPI []byte
