package httpapi

import (
	"encoding/json"
	"maps"
	"net/http"
	"slices"

	"github.com/rs/zerolog"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// Audit actions: the "action" field of the audit log's lines (component "audit", info level), one line per
// administrative request that succeeded.
const (
	ActionEndpointCreated   = "endpoint.created"
	ActionEndpointChanged   = "endpoint.changed"
	ActionEndpointDeleted   = "endpoint.deleted"
	ActionDeliveryRetried   = "delivery.retried"
	ActionDeliveriesReplayd = "deliveries.replayed"
	ActionDeliveryCancelled = "delivery.cancelled"
	ActionSecretRotated     = "endpoint.secret_rotated"
	ActionEndpointPaused    = "endpoint.paused"
	ActionEndpointResumed   = "endpoint.resumed"
)

// auditFieldsSkipped are the endpoint's JSON fields that are not settings: they never count as changed.
var auditFieldsSkipped = []string{"consumerGroup", "createdAt", "updatedAt", "state", "stateReason", "stateSince"}

// ChangedFields returns the endpoint settings next has that prev (nil for a new endpoint) has not, by JSON
// field name, sorted; a header is named "headers.<Name>" (added, removed or given a new value). It never
// returns a value, so secrets and header values stay out of logs.
func ChangedFields(prev, next *pulsetype.Endpoint) []string {
	a, b := endpointFields(prev), endpointFields(next)
	changed := []string{}
	for _, k := range slices.Sorted(maps.Keys(merge(a, b))) {
		if k == "headers" || slices.Contains(auditFieldsSkipped, k) {
			continue
		}
		if string(a[k]) != string(b[k]) {
			changed = append(changed, k)
		}
	}
	var ha, hb map[string]string
	if prev != nil {
		ha = prev.Headers
	}
	if next != nil {
		hb = next.Headers
	}
	for _, name := range slices.Sorted(maps.Keys(merge(ha, hb))) {
		va, okA := ha[name]
		vb, okB := hb[name]
		if okA != okB || va != vb {
			changed = append(changed, "headers."+name)
		}
	}
	return changed
}

func endpointFields(e *pulsetype.Endpoint) map[string]json.RawMessage {
	out := map[string]json.RawMessage{}
	if e == nil {
		return out
	}
	b, err := json.Marshal(EndpointOf(e))
	if err == nil {
		_ = json.Unmarshal(b, &out)
	}
	return out
}

func merge[V any](a, b map[string]V) map[string]V {
	out := maps.Clone(a)
	if out == nil {
		out = map[string]V{}
	}
	maps.Copy(out, b)
	return out
}

// audit starts the audit line of an administrative action made by request r: the action, who made it (the
// token's variable and position, never the token) and from where. The caller adds the target and the changed
// fields, and sends it with a constant message.
func (s *Server) audit(r *http.Request, action string) *zerolog.Event {
	return s.auditLog.Info().Str("action", action).Str("auth", principal(r)).Str("remote_addr", r.RemoteAddr)
}
