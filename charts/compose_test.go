package charts_test

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// compose is docker-compose.yml decoded into maps: services by name.
type compose map[string]map[string]any

func loadCompose(t *testing.T) compose {
	t.Helper()
	b, err := os.ReadFile("../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	raw, ok := doc["services"].(map[string]any)
	if !ok || len(raw) == 0 {
		t.Fatal("docker-compose.yml has no services")
	}
	c := compose{}
	for name, s := range raw {
		svc, ok := s.(map[string]any)
		if !ok {
			t.Fatalf("service %s is not a mapping", name)
		}
		c[name] = svc
	}
	return c
}

// dependsOn returns the services s depends on, with their conditions ("" for the short list form).
func dependsOn(t *testing.T, name string, s map[string]any) map[string]string {
	t.Helper()
	deps := map[string]string{}
	switch d := s["depends_on"].(type) {
	case nil:
	case []any:
		for _, n := range d {
			deps[fmt.Sprint(n)] = ""
		}
	case map[string]any:
		for n, v := range d {
			cond, _ := v.(map[string]any)["condition"].(string)
			deps[n] = cond
		}
	default:
		t.Fatalf("service %s: depends_on is %T", name, d)
	}
	return deps
}

// environment returns a service's environment whether written as a mapping or as a list of K=V.
func environment(t *testing.T, name string, s map[string]any) map[string]string {
	t.Helper()
	env := map[string]string{}
	switch e := s["environment"].(type) {
	case nil:
	case map[string]any:
		for k, v := range e {
			env[k] = fmt.Sprint(v)
		}
	case []any:
		for _, kv := range e {
			k, v, _ := strings.Cut(fmt.Sprint(kv), "=")
			env[k] = v
		}
	default:
		t.Fatalf("service %s: environment is %T", name, e)
	}
	return env
}

// healthcheckTest returns a service's healthcheck test as a list.
func healthcheckTest(s map[string]any) []string {
	hc, _ := s["healthcheck"].(map[string]any)
	var out []string
	switch test := hc["test"].(type) {
	case []any:
		for _, a := range test {
			out = append(out, fmt.Sprint(a))
		}
	case string:
		out = []string{"CMD-SHELL", test}
	}
	return out
}

// buildTarget returns the Dockerfile target a service builds ("" for the default), and whether it builds at all.
func buildTarget(s map[string]any) (string, bool) {
	switch b := s["build"].(type) {
	case string:
		return "", true
	case map[string]any:
		target, _ := b["target"].(string)
		return target, true
	}
	return "", false
}

func TestComposeDependsOnDefinedServices(t *testing.T) {
	t.Parallel()
	c := loadCompose(t)
	for name, s := range c {
		for dep, cond := range dependsOn(t, name, s) {
			if _, ok := c[dep]; !ok {
				t.Errorf("service %s depends on %q, which is not defined", name, dep)
			}
			if dep == name {
				t.Errorf("service %s depends on itself", name)
			}
			if cond == "service_healthy" && len(healthcheckTest(c[dep])) == 0 {
				t.Errorf("service %s waits for %s to be healthy, but %s has no healthcheck", name, dep, dep)
			}
		}
	}
	// No cycles: compose could not start such a project.
	state := map[string]int{} // 1 visiting, 2 done
	var visit func(string, []string)
	visit = func(n string, path []string) {
		switch state[n] {
		case 1:
			t.Errorf("depends_on cycle: %s", strings.Join(append(path, n), " -> "))
			return
		case 2:
			return
		}
		state[n] = 1
		for dep := range dependsOn(t, n, c[n]) {
			if _, ok := c[dep]; ok {
				visit(dep, append(path, n))
			}
		}
		state[n] = 2
	}
	for n := range c {
		visit(n, nil)
	}
}

func TestComposeHealthchecks(t *testing.T) {
	t.Parallel()
	c := loadCompose(t)
	for name, s := range c {
		test := healthcheckTest(s)
		if len(test) < 2 || (test[0] != "CMD" && test[0] != "CMD-SHELL") {
			t.Errorf("service %s: healthcheck test = %v, want one", name, test)
			continue
		}
		// Our images are distroless: no shell, so the exec form only.
		if _, builds := buildTarget(s); builds && test[0] != "CMD" {
			t.Errorf("service %s: healthcheck %v needs a shell, which the image does not have", name, test)
		}
	}
}

func TestComposeWiring(t *testing.T) {
	t.Parallel()
	c := loadCompose(t)

	// The sidecar: the service with PULSE_MONGODB_URI.
	var sidecarName string
	for name, s := range c {
		if _, ok := environment(t, name, s)["PULSE_MONGODB_URI"]; ok {
			if sidecarName != "" {
				t.Fatalf("PULSE_MONGODB_URI set on both %s and %s", sidecarName, name)
			}
			sidecarName = name
		}
	}
	if sidecarName == "" {
		t.Fatal("no service sets PULSE_MONGODB_URI")
	}
	sidecar := c[sidecarName]
	env := environment(t, sidecarName, sidecar)
	if target, builds := buildTarget(sidecar); !builds || target != "" {
		t.Errorf("sidecar service %s: build target %q, want the Dockerfile's default (final) stage", sidecarName, target)
	}
	if got := healthcheckTest(sidecar); !slices.Equal(got, []string{"CMD", "/pulse", "healthcheck"}) {
		t.Errorf("sidecar healthcheck = %v, want [CMD /pulse healthcheck]", got)
	}

	// The image's API listens on all interfaces (the receiver publishes from its own container): that needs a
	// token, or the sidecar refuses to start; the receiver must carry the same one.
	if env["PULSE_API_TOKEN"] == "" {
		t.Error("sidecar has no PULSE_API_TOKEN, but its API listens beyond loopback (the image's PULSE_LISTEN)")
	}
	// The API answers the names of PULSE_ALLOWED_HOSTS (besides IP addresses and localhost): the name the
	// receiver publishes to must be one, and with it set a page whose name resolves to the host is refused.
	allowed := strings.Split(env["PULSE_ALLOWED_HOSTS"], ",")
	for name, s := range c {
		renv := environment(t, name, s)
		if renv["RECEIVER_PUBLISH_URL"] == "" {
			continue
		}
		if renv["RECEIVER_PUBLISH_TOKEN"] != env["PULSE_API_TOKEN"] {
			t.Errorf("service %s publishes without the sidecar's PULSE_API_TOKEN", name)
		}
		if u, err := url.Parse(renv["RECEIVER_PUBLISH_URL"]); err != nil || !slices.Contains(allowed, u.Hostname()) {
			t.Errorf("service %s publishes to %s, whose host is not in the sidecar's PULSE_ALLOWED_HOSTS %q", name, renv["RECEIVER_PUBLISH_URL"], allowed)
		}
	}

	// Its MongoDB host is the mongo service, a replica set initiated by that service's healthcheck.
	u, err := url.Parse(env["PULSE_MONGODB_URI"])
	if err != nil || u.Scheme != "mongodb" {
		t.Fatalf("PULSE_MONGODB_URI %q: %v", env["PULSE_MONGODB_URI"], err)
	}
	mongoName := u.Hostname()
	mongo, ok := c[mongoName]
	if !ok {
		t.Fatalf("PULSE_MONGODB_URI host %q is not a service", mongoName)
	}
	if img, _ := mongo["image"].(string); !strings.HasPrefix(img, "mongo:8") {
		t.Errorf("service %s image = %q, want mongo:8", mongoName, img)
	}
	if cond, ok := dependsOn(t, sidecarName, sidecar)[mongoName]; !ok || cond != "service_healthy" {
		t.Errorf("sidecar depends_on %s = %q, want condition service_healthy", mongoName, cond)
	}
	rs := u.Query().Get("replicaSet")
	if rs == "" && u.Query().Get("directConnection") != "true" {
		t.Errorf("PULSE_MONGODB_URI %q names neither replicaSet nor directConnection=true", u)
	}
	if rs != "" {
		cmd := fmt.Sprint(mongo["command"])
		if !strings.Contains(cmd, "--replSet") || !strings.Contains(cmd, rs) {
			t.Errorf("mongo command %s does not start replica set %s", cmd, rs)
		}
		hc := strings.Join(healthcheckTest(mongo), " ")
		for _, want := range []string{"rs.initiate", "'" + rs + "'", mongoName + ":27017"} {
			if !strings.Contains(hc, want) {
				t.Errorf("mongo healthcheck does not contain %q: %s", want, hc)
			}
		}
	}

	// Shutdown: compose waits longer than the sidecar's own grace.
	shutdown, err := time.ParseDuration(env["PULSE_SHUTDOWN_TIMEOUT"])
	if err != nil {
		shutdown = 25 * time.Second // the sidecar's default
	}
	if grace, err := time.ParseDuration(fmt.Sprint(sidecar["stop_grace_period"])); err != nil || grace <= shutdown {
		t.Errorf("sidecar stop_grace_period %v is not above the shutdown timeout %v", sidecar["stop_grace_period"], shutdown)
	}

	// The endpoints file is mounted where PULSE_ENDPOINTS_FILE says, and its URL names the receiver service.
	file := env["PULSE_ENDPOINTS_FILE"]
	var mounted bool
	for _, v := range sidecar["volumes"].([]any) {
		src, dst, _ := strings.Cut(fmt.Sprint(v), ":")
		dst, _, _ = strings.Cut(dst, ":")
		if dst == file && src == "./examples/endpoints.yaml" {
			mounted = true
		}
	}
	if !mounted {
		t.Errorf("PULSE_ENDPOINTS_FILE=%q, but ./examples/endpoints.yaml is not mounted there", file)
	}
	b, err := os.ReadFile("../examples/endpoints.yaml")
	if err != nil {
		t.Fatal(err)
	}
	eps := decodeEndpoints(t, b)
	var receiverName string
	for _, ep := range eps {
		u, err := url.Parse(fmt.Sprint(ep["url"]))
		if err != nil {
			t.Fatalf("endpoint url: %v", err)
		}
		receiverName = u.Hostname()
		receiver, ok := c[receiverName]
		if !ok {
			t.Fatalf("endpoint %v: url host %q is not a service", ep["consumerGroup"], receiverName)
		}
		if target, _ := buildTarget(receiver); target != "receiver" {
			t.Errorf("service %s builds target %q, want receiver", receiverName, target)
		}
		renv := environment(t, receiverName, receiver)
		if _, port, _ := net.SplitHostPort(renv["RECEIVER_LISTEN"]); port != u.Port() {
			t.Errorf("receiver listens on %q, the endpoint url says port %s", renv["RECEIVER_LISTEN"], u.Port())
		}
		if s, _ := ep["secret"].(string); s != renv["RECEIVER_SECRET"] {
			t.Errorf("endpoint secret and the receiver's RECEIVER_SECRET differ")
		}
		// The receiver publishes the demo topic to the sidecar service.
		pu, err := url.Parse(renv["RECEIVER_PUBLISH_URL"])
		if err != nil || pu.Hostname() != sidecarName || pu.Path != "/v1/events" {
			t.Errorf("RECEIVER_PUBLISH_URL = %q, want http://%s:8080/v1/events", renv["RECEIVER_PUBLISH_URL"], sidecarName)
		}
		topics, _ := ep["topics"].([]any)
		if !slices.Contains(topics, any(renv["RECEIVER_PUBLISH_TOPIC"])) {
			t.Errorf("receiver publishes %q, the endpoint subscribes to %v", renv["RECEIVER_PUBLISH_TOPIC"], topics)
		}
	}
	if ep := eps[0]; ep["consumerGroup"] != "demo" || !slices.Contains(ep["topics"].([]any), any("demo.hello")) {
		t.Errorf("examples/endpoints.yaml first entry = %v, want consumer group demo on demo.hello", ep)
	}

	// Build targets exist in the Dockerfile.
	stages := dockerStages(t)
	for name, s := range c {
		if target, builds := buildTarget(s); builds && target != "" {
			if !slices.ContainsFunc(stages, func(st stage) bool { return st.name == target }) {
				t.Errorf("service %s builds target %q, which the Dockerfile does not define", name, target)
			}
		}
	}
}
