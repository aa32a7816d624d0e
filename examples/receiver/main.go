// Command receiver is the demo webhook receiver for the Pulse sidecar. It logs every delivery it gets,
// verifies the Standard Webhooks signature when it knows the endpoint's secret, and can publish a demo event
// to the sidecar at a fixed interval so that `docker compose up` shows events flowing end to end.
//
// It uses the standard library only. Configuration, all optional:
//
//	RECEIVER_LISTEN         address to listen on (default ":3000")
//	RECEIVER_PATH           path that accepts deliveries (default "/hooks/pulse")
//	RECEIVER_SECRET         the endpoint's "whsec_..." secret; when set, unsigned or badly signed requests get 401
//	RECEIVER_PUBLISH_URL    the sidecar's ingest URL, e.g. http://pulse:8080/v1/events; empty = do not publish
//	RECEIVER_PUBLISH_TOPIC  topic of the published demo events (default "demo.hello")
//	RECEIVER_PUBLISH_EVERY  interval between published events, a Go duration (default "5s")
//	RECEIVER_PUBLISH_TOKEN  bearer token for the sidecar's /v1 API (PULSE_API_TOKEN), if it has one
//
// `receiver -healthcheck` asks the running receiver's /healthz and exits 0 when it answers 200; it serves as the
// container healthcheck, since the image has no shell.
package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

const (
	defaultListen       = ":3000"
	defaultPath         = "/hooks/pulse"
	defaultPublishTopic = "demo.hello"
	defaultPublishEvery = 5 * time.Second

	// maxBody bounds what the receiver reads of one delivery.
	maxBody = 1 << 20
	// signatureTolerance is how far webhook-timestamp may be from now (Standard Webhooks' recommendation).
	signatureTolerance = 5 * time.Minute
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv); err != nil {
		fmt.Fprintln(os.Stderr, "receiver:", err)
		os.Exit(1)
	}
}

// run parses flags and the environment (through getenv) and serves until ctx is done.
func run(ctx context.Context, args []string, getenv func(string) string) error {
	fs := flag.NewFlagSet("receiver", flag.ContinueOnError)
	health := fs.Bool("healthcheck", false, "ask the running receiver's /healthz and exit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	listen := cmp.Or(getenv("RECEIVER_LISTEN"), defaultListen)
	if *health {
		return healthcheck(ctx, listen)
	}

	log := slog.New(slog.NewTextHandler(os.Stdout, nil))
	every := defaultPublishEvery
	if s := getenv("RECEIVER_PUBLISH_EVERY"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			return fmt.Errorf("RECEIVER_PUBLISH_EVERY=%q: want a positive Go duration such as 5s", s)
		}
		every = d
	}
	h, err := newHandler(getenv("RECEIVER_SECRET"), log)
	if err != nil {
		return err
	}

	mux := http.NewServeMux()
	mux.Handle("POST "+cmp.Or(getenv("RECEIVER_PATH"), defaultPath), h)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	srv := &http.Server{Addr: listen, Handler: mux, ReadHeaderTimeout: 10 * time.Second}

	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	log.Info("receiver listening", "addr", ln.Addr().String(), "signatures", h.key != nil)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()

	if u := getenv("RECEIVER_PUBLISH_URL"); u != "" {
		p := &publisher{
			url:   u,
			topic: cmp.Or(getenv("RECEIVER_PUBLISH_TOPIC"), defaultPublishTopic),
			token: getenv("RECEIVER_PUBLISH_TOKEN"),
			host:  hostname(),
			http:  &http.Client{Timeout: 10 * time.Second},
		}
		go p.loop(ctx, every, log)
	}

	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return srv.Shutdown(shutdownCtx)
}

// delivery is the body the sidecar POSTs to a consumer group's URL.
type delivery struct {
	ID        string            `json:"id"`
	Topic     string            `json:"topic"`
	CreatedAt string            `json:"createdAt"`
	Data      json.RawMessage   `json:"data"`
	Headers   map[string]string `json:"headers,omitempty"`
}

// handler logs deliveries and, when it has a key, rejects those whose signature does not verify.
type handler struct {
	key []byte // nil when no secret is configured
	log *slog.Logger
	now func() time.Time
}

func newHandler(secret string, log *slog.Logger) (*handler, error) {
	h := &handler{log: log, now: time.Now}
	if secret != "" {
		key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
		if err != nil || len(key) == 0 {
			return nil, errors.New("RECEIVER_SECRET: want whsec_ followed by base64")
		}
		h.key = key
	}
	return h, nil
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		http.Error(w, "body too large", http.StatusRequestEntityTooLarge)
		return
	}
	if h.key != nil {
		if err := verify(h.key, r.Header, body, h.now()); err != nil {
			h.log.Warn("delivery rejected", "reason", err.Error(), "webhookId", r.Header.Get("webhook-id"))
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
	}
	var d delivery
	if err := json.Unmarshal(body, &d); err != nil {
		h.log.Warn("delivery rejected", "reason", "body is not a JSON delivery", "error", err.Error())
		http.Error(w, "want a JSON delivery", http.StatusBadRequest)
		return
	}
	h.log.Info("delivery received",
		"id", d.ID,
		"topic", d.Topic,
		"consumerGroup", r.Header.Get("Pulse-Consumer-Group"),
		"attempt", r.Header.Get("Pulse-Attempt"),
		"signed", h.key != nil,
		"data", string(d.Data),
	)
	w.WriteHeader(http.StatusNoContent)
}

// verify checks a Standard Webhooks signature: one of the space-separated "v1,<base64>" entries of
// webhook-signature must be the HMAC-SHA256 of "<webhook-id>.<webhook-timestamp>.<body>", and the timestamp must
// be within signatureTolerance of now.
func verify(key []byte, hdr http.Header, body []byte, now time.Time) error {
	id, ts, sigs := hdr.Get("webhook-id"), hdr.Get("webhook-timestamp"), hdr.Get("webhook-signature")
	if id == "" || ts == "" || sigs == "" {
		return errors.New("missing webhook-id, webhook-timestamp or webhook-signature")
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return errors.New("webhook-timestamp is not unix seconds")
	}
	if d := now.Sub(time.Unix(sec, 0)); d > signatureTolerance || d < -signatureTolerance {
		return errors.New("webhook-timestamp outside the tolerance")
	}
	mac := hmac.New(sha256.New, key)
	fmt.Fprintf(mac, "%s.%s.", id, ts)
	mac.Write(body)
	want := mac.Sum(nil)
	for _, s := range strings.Fields(sigs) {
		version, sig, ok := strings.Cut(s, ",")
		if !ok || version != "v1" {
			continue
		}
		got, err := base64.StdEncoding.DecodeString(sig)
		if err == nil && hmac.Equal(got, want) {
			return nil
		}
	}
	return errors.New("no matching v1 signature")
}

// publisher posts one demo event every tick to the sidecar's ingest API.
type publisher struct {
	url, topic, token, host string
	http                    *http.Client
	n                       atomic.Int64
}

func (p *publisher) loop(ctx context.Context, every time.Duration, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n := p.n.Add(1)
		status, err := p.publish(ctx, n)
		if err != nil {
			if ctx.Err() == nil {
				log.Warn("publish failed", "seq", n, "error", err.Error())
			}
			continue
		}
		log.Info("event published", "seq", n, "topic", p.topic, "status", status)
	}
}

func (p *publisher) publish(ctx context.Context, n int64) (int, error) {
	body, err := json.Marshal(map[string]any{
		"topic": p.topic,
		"data":  map[string]any{"message": "hello from the demo receiver", "seq": n, "from": p.host},
	})
	if err != nil {
		return 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	if p.token != "" {
		req.Header.Set("Authorization", "Bearer "+p.token)
	}
	resp, err := p.http.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode/100 != 2 {
		return resp.StatusCode, fmt.Errorf("status %d: %s", resp.StatusCode, bytes.TrimSpace(msg))
	}
	return resp.StatusCode, nil
}

// healthcheck asks the receiver listening on listen for /healthz.
func healthcheck(ctx context.Context, listen string) error {
	_, port, err := net.SplitHostPort(listen)
	if err != nil {
		return fmt.Errorf("RECEIVER_LISTEN=%q: %w", listen, err)
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:"+port+"/healthz", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("healthz: status %d", resp.StatusCode)
	}
	return nil
}

func hostname() string {
	h, _ := os.Hostname()
	return cmp.Or(h, "receiver")
}
