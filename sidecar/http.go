package sidecar

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/pulse-sidecar/pulse/httpapi"
)

// httpServers are the API's HTTP servers (the API and, with PULSE_PROBE_LISTEN, the probes).
type httpServers struct {
	servers []*http.Server
	serving sync.WaitGroup
	failed  chan error // the first error of a Serve that failed
}

func newHTTPServers() *httpServers { return &httpServers{failed: make(chan error, 1)} }

// serve serves h on ln in a goroutine until shutdown. The answers net/http writes before h runs (a malformed
// or second Host header, headers over the limit) are JSON errors too (httpapi.JSONErrorListener).
func (s *httpServers) serve(h http.Handler, ln net.Listener) {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: time.Minute, IdleTimeout: 2 * time.Minute}
	s.servers = append(s.servers, srv)
	s.serving.Go(func() {
		if err := srv.Serve(httpapi.JSONErrorListener(ln)); !errors.Is(err, http.ErrServerClosed) {
			select {
			case s.failed <- err:
			default: // another server failed first
			}
		}
	})
}

// shutdown closes the servers, gives open requests 5 s to finish before closing their connections, and
// blocks until every Serve returned. It is safe twice.
func (s *httpServers) shutdown() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, srv := range s.servers {
		if srv.Shutdown(ctx) != nil {
			_ = srv.Close()
		}
	}
	s.serving.Wait()
}
