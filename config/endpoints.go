package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// LoadEndpointsFile reads PULSE_ENDPOINTS_FILE: a YAML or JSON list of endpoints, each the body of
// PUT /v1/endpoints/{consumerGroup} plus its "consumerGroup". It returns the endpoints normalized (defaults
// filled), and an error naming the file and the first invalid entry (1-based index, consumer group and field) when
// any is invalid; then nothing should be applied. Unknown fields and duplicate consumer groups are errors.
func LoadEndpointsFile(path string) ([]*pulsetype.Endpoint, error) {
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
		var ep pulsetype.Endpoint
		dec := json.NewDecoder(bytes.NewReader(e))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&ep); err != nil {
			return nil, fmt.Errorf("PULSE_ENDPOINTS_FILE=%q: entry %d: %s", path, i+1, strings.TrimPrefix(err.Error(), "json: "))
		}
		if err := ep.Normalize(); err != nil {
			return nil, fmt.Errorf("PULSE_ENDPOINTS_FILE=%q: entry %d (consumerGroup %q): %w", path, i+1, ep.ConsumerGroup, err)
		}
		if j, dup := seen[ep.ConsumerGroup]; dup {
			return nil, fmt.Errorf("PULSE_ENDPOINTS_FILE=%q: entries %d and %d both register consumerGroup %q", path, j+1, i+1, ep.ConsumerGroup)
		}
		seen[ep.ConsumerGroup] = i
		out = append(out, &ep)
	}
	return out, nil
}

// yamlToJSON converts a YAML document (JSON is YAML too) to JSON, so that the entries are decoded by
// encoding/json with the API's own field names and rules. It returns an error for invalid YAML, a
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
