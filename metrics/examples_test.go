package metrics

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.yaml.in/yaml/v3"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// The example alert rules and Grafana dashboard of examples/monitoring parse, and every pulse_ series they
// query is one /metrics serves, so they cannot drift from the metrics' names.
func TestMonitoringExamplesUseServedMetrics(t *testing.T) {
	m := New()
	m.CountPendingWith(func(context.Context) (map[string]int64, error) { return map[string]int64{"billing": 1}, nil }, 0, zerolog.Nop())
	m.OldestPendingWith(func(context.Context) (map[string]time.Time, error) {
		return map[string]time.Time{"billing": time.Now()}, nil
	})
	m.ReadStatesWith(func(context.Context) (map[string]pulsetype.EndpointState, error) {
		return map[string]pulsetype.EndpointState{"billing": pulsetype.EndpointActive}, nil
	})
	m.AttemptDone("billing", "success", time.Millisecond)
	m.Reconciled("fanout")
	m.LeaseLost("billing")
	m.WorkerLost("billing")
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	served := map[string]bool{}
	for _, line := range strings.Split(rec.Body.String(), "\n") {
		if name, ok := strings.CutPrefix(line, "# TYPE "); ok {
			served[strings.Fields(name)[0]] = true
		}
	}

	var rules struct {
		Groups []struct {
			Rules []struct{ Alert, Expr string }
		}
	}
	raw, err := os.ReadFile("../examples/monitoring/alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, &rules); err != nil {
		t.Fatalf("alerts.yaml: %v", err)
	}
	var exprs []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" || r.Expr == "" {
				t.Errorf("alerts.yaml: a rule without alert or expr: %+v", r)
			}
			exprs = append(exprs, r.Expr)
		}
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	raw, err = os.ReadFile("../examples/monitoring/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("grafana-dashboard.json: %v", err)
	}
	for _, p := range dash.Panels {
		for _, q := range p.Targets {
			exprs = append(exprs, q.Expr)
		}
	}
	if len(exprs) < 5 {
		t.Fatalf("found %d queries in the examples, want the rules and panels", len(exprs))
	}
	name := regexp.MustCompile(`pulse_[a-z_]+`)
	oldest := false
	for _, e := range exprs {
		for _, n := range name.FindAllString(e, -1) {
			base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_count"), "_sum")
			if !served[base] {
				t.Errorf("the examples query %s, which /metrics does not serve (expression %s)", n, e)
			}
			oldest = oldest || base == "pulse_oldest_pending_delivery_age_seconds"
		}
	}
	if !oldest {
		t.Error("the examples do not use pulse_oldest_pending_delivery_age_seconds")
	}
}
