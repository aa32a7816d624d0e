package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/rs/zerolog"

	"github.com/pulse-sidecar/pulse/config"
	"github.com/pulse-sidecar/pulse/httpapi"
	"github.com/pulse-sidecar/pulse/pulsetype"
)

// endpointsFilePoll is how often PULSE_ENDPOINTS_FILE is checked for changes (a mounted ConfigMap is
// replaced by a symlink swap, which content hashing sees and file watchers often miss).
const endpointsFilePoll = 5 * time.Second

type endpointPutter interface {
	GetEndpoint(ctx context.Context, group string) (*pulsetype.Endpoint, error)
	PutEndpoint(ctx context.Context, e *pulsetype.Endpoint) (*pulsetype.Endpoint, bool, error)
}

// applyEndpointsFile registers every endpoint of the file (replacing same-named consumer groups), and logs
// an audit line for each one it creates or changes. It returns the file's hash, or an error naming the
// invalid entry.
func applyEndpointsFile(ctx context.Context, path string, store endpointPutter, changed func(string), log zerolog.Logger) ([32]byte, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return [32]byte{}, fmt.Errorf("PULSE_ENDPOINTS_FILE=%q: %w", path, err)
	}
	eps, err := config.LoadEndpointsFile(path)
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

// watchEndpointsFile re-applies the file whenever its content changes, until ctx is done. An invalid new
// version is logged and skipped; the endpoints registered before stay.
func watchEndpointsFile(ctx context.Context, path string, applied [32]byte, store endpointPutter, changed func(string), log zerolog.Logger) {
	t := time.NewTimer(pulsetype.Jittered(endpointsFilePoll))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			t.Reset(pulsetype.Jittered(endpointsFilePoll))
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			log.Warn().Err(err).Str("file", path).Msg("endpoints file unreadable; keeping the endpoints registered")
			continue
		}
		if sum := sha256.Sum256(raw); bytes.Equal(sum[:], applied[:]) {
			continue
		}
		sum, err := applyEndpointsFile(ctx, path, store, changed, log)
		if err != nil {
			log.Error().Err(err).Str("file", path).Msg("endpoints file changed but is invalid; keeping the endpoints registered")
			applied = sha256.Sum256(raw) // report once per version
			continue
		}
		applied = sum
		log.Info().Str("file", path).Msg("endpoints file re-applied")
	}
}
