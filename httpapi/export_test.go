package httpapi

import "github.com/go-chi/chi/v5"

// Routes exposes the router of Handler, before the browser guard, to the tests of package httpapi_test
// (openapi_test.go walks it with chi.Walk).
func (s *Server) Routes() chi.Routes { return s.routes() }
