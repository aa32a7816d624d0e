// Package endpointsfile registers the endpoints of PULSE_ENDPOINTS_FILE: a YAML or JSON list of PUT
// /v1/endpoints/{consumerGroup} bodies, each with its "consumerGroup", decoded by the API's own rules
// (httpapi.DecodeEndpoint) and audited as the API audits a PUT. Apply registers the file once, at start;
// Watcher re-applies it whenever its content changes. An invalid version is never applied in part.
package endpointsfile

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"go.yaml.in/yaml/v3"

	"github.com/pulse-sidecar/pulse/httpapi"
	"github.com/pulse-sidecar/pulse/internal/startstop"
	"github.com/pulse-sidecar/pulse/pulsetype"
)

// Poll is how often PULSE_ENDPOINTS_FILE is checked for changes (a mounted ConfigMap is
// replaced by a symlink swap, which content hashing sees and file watchers often miss).
const Poll = 5 * time.Second

// Load reads PULSE_ENDPOINTS_FILE: a YAML or JSON list of endpoints, each the body of
// PUT /v1/endpoints/{consumerGroup} plus its "consumerGroup". It returns the endpoints normalized (defaults
// filled), and an error naming the file and the first invalid entry (1-based index, consumer group and field) when
// any is invalid; then nothing should be applied. Unknown fields and duplicate consumer groups are errors.
func Load(path string) ([]*pulsetype.Endpoint, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("PULSE_ENDPOINTS_FILE=%q: %w", path, err)
	}
	js, err := yamlToJSON(raw)
	if err != nil {
		return nil, fmt.Errorf("PULSE_ENDPOINTS_FILE=%q is not valid YAML or JSON: %w", path, err)
	}
	if bytes.Equal(bytes.TrimSpace(js), []byte("null")) {
		return nil, nil // an empty file registers nothing
	}
	var entries []json.RawMessage
	if err := json.Unmarshal(js, &entries); err != nil {
		return nil, fmt.Errorf("PULSE_ENDPOINTS_FILE=%q must be a list of endpoints: %w", path, err)
	}
	seen := map[string]int{}
	out := make([]*pulsetype.Endpoint, 0, len(entries))
	for i, e := range entries {
		ep, err := httpapi.DecodeEndpoint(e)
		if err != nil {
			return nil, fmt.Errorf("PULSE_ENDPOINTS_FILE=%q: entry %d: %s", path, i+1, strings.TrimPrefix(err.Error(), "json: "))
		}
		if err := ep.Normalize(); err != nil {
			return nil, fmt.Errorf("PULSE_ENDPOINTS_FILE=%q: entry %d (consumerGroup %q): %w", path, i+1, ep.ConsumerGroup, err)
		}
		if j, dup := seen[ep.ConsumerGroup]; dup {
			return nil, fmt.Errorf("PULSE_ENDPOINTS_FILE=%q: entries %d and %d both register consumerGroup %q", path, j+1, i+1, ep.ConsumerGroup)
		}
		seen[ep.ConsumerGroup] = i
		out = append(out, ep)
	}
	return out, nil
}

// yamlToJSON converts a YAML document (JSON is YAML too) to JSON, so that the entries are decoded by
// httpapi.DecodeEndpoint with the API's own field names and rules. It returns an error for invalid YAML, a
// duplicate key, or a mapping key that is not a string.
func yamlToJSON(raw []byte) ([]byte, error) {
	var doc any
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return nil, err
	}
	if err := checkStringKeys(doc); err != nil {
		return nil, err
	}
	return json.Marshal(doc)
}

// checkStringKeys returns an error if v holds a mapping whose keys are not all strings (yaml.v3 decodes
// such a mapping as map[any]any, which JSON cannot hold).
func checkStringKeys(v any) error {
	switch v := v.(type) {
	case map[any]any:
		for k := range v {
			return fmt.Errorf("mapping key %v is not a string", k)
		}
	case map[string]any:
		for _, e := range v {
			if err := checkStringKeys(e); err != nil {
				return err
			}
		}
	case []any:
		for _, e := range v {
			if err := checkStringKeys(e); err != nil {
				return err
			}
		}
	}
	return nil
}

// Store is the storage the endpoints file is registered in (mongo.Store implements it).
type Store interface {
	GetEndpoint(ctx context.Context, group string) (*pulsetype.Endpoint, error)
	PutEndpoint(ctx context.Context, e *pulsetype.Endpoint) (*pulsetype.Endpoint, bool, error)
}

// Apply registers every endpoint of the file (replacing same-named consumer groups), and logs
// an audit line for each one it creates or changes. It returns the file's hash, or an error naming the
// invalid entry.
func Apply(ctx context.Context, path string, store Store, changed func(string), log zerolog.Logger) ([32]byte, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return [32]byte{}, fmt.Errorf("PULSE_ENDPOINTS_FILE=%q: %w", path, err)
	}
	eps, err := Load(path)
	if err != nil {
		return [32]byte{}, err
	}
	audit := log.With().Str("component", "audit").Logger()
	for _, ep := range eps {
		prev, err := store.GetEndpoint(ctx, ep.ConsumerGroup)
		if err != nil && !errors.Is(err, pulsetype.ErrNotFound) && !errors.Is(err, pulsetype.ErrUndecryptable) {
			return [32]byte{}, err
		}
		stored, created, err := store.PutEndpoint(ctx, ep)
		if err != nil {
			return [32]byte{}, err
		}
		changed(ep.ConsumerGroup)
		action, msg := httpapi.ActionEndpointChanged, "endpoint changed"
		if created {
			action, msg, prev = httpapi.ActionEndpointCreated, "endpoint created", nil
		}
		if fields := httpapi.ChangedFields(prev, stored); created || len(fields) > 0 {
			audit.Info().Str("action", action).Str("auth", "PULSE_ENDPOINTS_FILE").Str("file", path).
				Str("consumer_group", ep.ConsumerGroup).Strs("changed", fields).Msg(msg)
		}
	}
	return sha256.Sum256(raw), nil
}

// Watcher re-applies PULSE_ENDPOINTS_FILE whenever its content changes, checking every
// Poll (jittered). An invalid new version is logged and skipped; the endpoints registered
// before stay.
type Watcher struct {
	path    string
	applied [32]byte      // hash of the version applied (or reported invalid) last
	poll    time.Duration // period of the checks (Poll), jittered
	store   Store
	changed func(group string)
	log     zerolog.Logger
	run     startstop.Base
}

// NewWatcher returns a watcher of the file at path, whose version of hash applied is registered; once
// started it checks the file every Poll (jittered).
func NewWatcher(path string, applied [32]byte, store Store, changed func(string), log zerolog.Logger) *Watcher {
	return &Watcher{path: path, applied: applied, poll: Poll, store: store, changed: changed, log: log}
}

// Start runs the checks in a goroutine and returns at once; it returns startstop.ErrStarted when the
// watcher runs already.
func (w *Watcher) Start(ctx context.Context) error {
	return w.run.StartTicking(ctx, 0, func() time.Duration { return w.poll }, w.check)
}

// Stop ends the checks and blocks until their goroutine returned. It is safe twice and before Start.
func (w *Watcher) Stop() { w.run.Stop() }

// check re-applies the file if its content changed since the version last applied.
func (w *Watcher) check(ctx context.Context) {
	raw, err := os.ReadFile(w.path)
	if err != nil {
		w.log.Warn().Err(err).Str("file", w.path).Msg("endpoints file unreadable; keeping the endpoints registered")
		return
	}
	if sum := sha256.Sum256(raw); bytes.Equal(sum[:], w.applied[:]) {
		return
	}
	sum, err := Apply(ctx, w.path, w.store, w.changed, w.log)
	if err != nil && ctx.Err() != nil {
		return // stopped while applying: the version is not invalid, and not applied either
	}
	if err != nil {
		w.log.Error().Err(err).Str("file", w.path).Msg("endpoints file changed but is invalid; keeping the endpoints registered")
		w.applied = sha256.Sum256(raw) // report once per version
		return
	}
	w.applied = sum
	w.log.Info().Str("file", w.path).Msg("endpoints file re-applied")
}
