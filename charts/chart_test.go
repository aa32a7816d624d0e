// Package charts_test checks the packaging: the Helm chart (rendered with `helm template` and decoded strictly
// into the Kubernetes API types), docker-compose.yml and the Dockerfile. `bash .ci/packaging` runs it with helm
// installed; without helm on PATH the chart tests skip, unless CI=true, where they fail. The package is a module
// of its own (charts/go.mod, joined to the sidecar's by go.work), so the sidecar's go.mod holds no Kubernetes
// modules.
package charts_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

const (
	chartDir  = "pulse-sidecar"
	release   = "demo"
	namespace = "pulse-test"
)

// contractEnv lists the sidecar's configuration variables (docs/configuration.md).
var contractEnv = []string{
	"PULSE_MONGODB_URI", "PULSE_DATABASE", "PULSE_COLLECTION_PREFIX", "PULSE_DATA_DIR", "PULSE_LISTEN",
	"PULSE_PROBE_LISTEN", "PULSE_API_TOKEN", "PULSE_API_READ_TOKEN", "PULSE_ENCRYPTION_KEY", "PULSE_LOCK_TIMEOUT", "PULSE_POLL_INTERVAL", "PULSE_CHANGE_STREAMS",
	"PULSE_EVENT_RETENTION", "PULSE_HISTORY_RETENTION", "PULSE_ENDPOINTS_FILE", "PULSE_SHUTDOWN_TIMEOUT", "PULSE_SCHEMA_TIMEOUT",
	"PULSE_LOG_LEVEL", "PULSE_LOG_FORMAT",
}

// endpointKeys lists the fields of one entry of the endpoints file.
var endpointKeys = []string{
	"consumerGroup", "url", "topics", "delivery", "ordered", "offsetReset", "maxRetries", "retryDelay",
	"retryBackoffMultiplier", "maxRetryDelay", "timeout", "maxConcurrency", "headers", "secret",
}

// sidecar finds the sidecar container ("pulse") in containers or initContainers.
func sidecar(t *testing.T, spec *corev1.PodSpec) *corev1.Container {
	t.Helper()
	for _, list := range [][]corev1.Container{spec.Containers, spec.InitContainers} {
		for i := range list {
			if list[i].Name == "pulse" {
				return &list[i]
			}
		}
	}
	t.Fatal("no container named pulse in the pod")
	return nil
}

func envVar(c *corev1.Container, name string) *corev1.EnvVar {
	for i := range c.Env {
		if c.Env[i].Name == name {
			return &c.Env[i]
		}
	}
	return nil
}

func envValue(t *testing.T, c *corev1.Container, name string) string {
	t.Helper()
	e := envVar(c, name)
	if e == nil {
		t.Fatalf("sidecar has no %s", name)
	}
	if e.ValueFrom != nil {
		t.Fatalf("%s comes from %v, want a literal value", name, e.ValueFrom)
	}
	return e.Value
}

// checkSidecar asserts what every injected sidecar must have, and returns the container.
func checkSidecar(t *testing.T, spec *corev1.PodSpec, secretName string) *corev1.Container {
	t.Helper()
	c := sidecar(t, spec)

	sc := c.SecurityContext
	if sc == nil {
		t.Fatal("sidecar has no securityContext")
	}
	if sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Error("securityContext.runAsNonRoot is not true")
	}
	if sc.RunAsUser == nil || *sc.RunAsUser != 65532 {
		t.Errorf("securityContext.runAsUser = %v, want 65532", sc.RunAsUser)
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Error("securityContext.readOnlyRootFilesystem is not true")
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Error("securityContext.allowPrivilegeEscalation is not false")
	}
	if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 {
		t.Errorf("securityContext.capabilities = %+v, want drop [ALL] and nothing added", sc.Capabilities)
	}
	if sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("securityContext.seccompProfile = %+v, want RuntimeDefault", sc.SeccompProfile)
	}
	if sc.Privileged != nil && *sc.Privileged {
		t.Error("sidecar is privileged")
	}

	// Ports and probes: the API listens on the pod's loopback only, so nothing else in the cluster reaches
	// /v1; the probes and /metrics have a port of their own on all interfaces, which the kubelet reaches.
	if len(c.Ports) != 1 || c.Ports[0].ContainerPort != 8081 {
		t.Fatalf("ports = %+v, want one port, the probe port 8081 (the API is not exposed)", c.Ports)
	}
	portName := c.Ports[0].Name
	if got := envValue(t, c, "PULSE_LISTEN"); got != "127.0.0.1:8080" {
		t.Errorf("PULSE_LISTEN = %q, want the API on loopback, 127.0.0.1:8080", got)
	}
	if got := envValue(t, c, "PULSE_PROBE_LISTEN"); got != "0.0.0.0:8081" {
		t.Errorf("PULSE_PROBE_LISTEN = %q, want 0.0.0.0:8081", got)
	}
	for _, p := range []struct {
		what  string
		probe *corev1.Probe
		path  string
	}{{"readinessProbe", c.ReadinessProbe, "/readyz"}, {"livenessProbe", c.LivenessProbe, "/healthz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("%s is not an httpGet probe", p.what)
			continue
		}
		if p.probe.HTTPGet.Path != p.path {
			t.Errorf("%s path = %q, want %q", p.what, p.probe.HTTPGet.Path, p.path)
		}
		if port := p.probe.HTTPGet.Port.String(); port != portName && port != "8081" {
			t.Errorf("%s port = %q, want the probe port %q or 8081", p.what, port, portName)
		}
	}
	for _, name := range []string{"PULSE_API_TOKEN", "PULSE_API_READ_TOKEN", "PULSE_ENCRYPTION_KEY"} {
		if e := envVar(c, name); e != nil && (e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.Value != "") {
			t.Errorf("%s = %+v, want it from the Secret only", name, e)
		}
	}

	// Grace period above the shutdown timeout.
	shutdown, err := time.ParseDuration(envValue(t, c, "PULSE_SHUTDOWN_TIMEOUT"))
	if err != nil {
		t.Fatalf("PULSE_SHUTDOWN_TIMEOUT: %v", err)
	}
	if spec.TerminationGracePeriodSeconds == nil {
		t.Fatal("pod has no terminationGracePeriodSeconds")
	}
	if grace := time.Duration(*spec.TerminationGracePeriodSeconds) * time.Second; grace <= shutdown {
		t.Errorf("terminationGracePeriodSeconds %v is not above PULSE_SHUTDOWN_TIMEOUT %v", grace, shutdown)
	}

	// The MongoDB URI and the API token come from the Secret.
	uri := envVar(c, "PULSE_MONGODB_URI")
	if uri == nil || uri.Value != "" || uri.ValueFrom == nil || uri.ValueFrom.SecretKeyRef == nil {
		t.Fatalf("PULSE_MONGODB_URI = %+v, want valueFrom.secretKeyRef", uri)
	}
	if ref := uri.ValueFrom.SecretKeyRef; ref.Name != secretName || ref.Key == "" {
		t.Errorf("PULSE_MONGODB_URI secretKeyRef = %s/%s, want Secret %s", ref.Name, ref.Key, secretName)
	}
	if tok := envVar(c, "PULSE_API_TOKEN"); tok != nil {
		if tok.ValueFrom == nil || tok.ValueFrom.SecretKeyRef == nil || tok.ValueFrom.SecretKeyRef.Name != secretName {
			t.Errorf("PULSE_API_TOKEN = %+v, want a secretKeyRef to %s", tok, secretName)
		}
	}

	// Env names: no duplicates, and every PULSE_* one is in the contract.
	seen := map[string]bool{}
	for _, e := range c.Env {
		if seen[e.Name] {
			t.Errorf("env %s set twice", e.Name)
		}
		seen[e.Name] = true
		if strings.HasPrefix(e.Name, "PULSE_") && !slices.Contains(contractEnv, e.Name) {
			t.Errorf("env %s is not a contract variable", e.Name)
		}
	}
	if got := envValue(t, c, "PULSE_DATA_DIR"); got != "/data" {
		t.Errorf("PULSE_DATA_DIR = %q, want /data", got)
	}

	// Writable emptyDirs at /tmp and /data; every mount names a pod volume.
	volumes := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		if _, dup := volumes[v.Name]; dup {
			t.Errorf("volume %s defined twice", v.Name)
		}
		volumes[v.Name] = v
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		v, ok := volumes[m.Name]
		if !ok {
			t.Errorf("volumeMount %s at %s names no pod volume", m.Name, m.MountPath)
		}
		mounts[m.MountPath] = m
		if (m.MountPath == "/tmp" || m.MountPath == "/data") && (v.EmptyDir == nil || m.ReadOnly) {
			t.Errorf("%s is not a writable emptyDir", m.MountPath)
		}
	}
	for _, p := range []string{"/tmp", "/data"} {
		if _, ok := mounts[p]; !ok {
			t.Errorf("nothing mounted at %s (the root filesystem is read-only)", p)
		}
	}
	if c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources = %+v, want memory requests and limits", c.Resources)
	}
	return c
}

// checkEndpointsMount asserts PULSE_ENDPOINTS_FILE names a file in a mounted ConfigMap, and returns the
// decoded entries of that file.
func checkEndpointsMount(t *testing.T, spec *corev1.PodSpec, c *corev1.Container, cms map[string]*corev1.ConfigMap) []map[string]any {
	t.Helper()
	file := envValue(t, c, "PULSE_ENDPOINTS_FILE")
	dir, key := filepath.Split(file)
	for _, m := range c.VolumeMounts {
		if filepath.Clean(m.MountPath) != filepath.Clean(dir) {
			continue
		}
		if !m.ReadOnly {
			t.Errorf("endpoints mount %s is not readOnly", m.MountPath)
		}
		for _, v := range spec.Volumes {
			if v.Name != m.Name {
				continue
			}
			if v.ConfigMap == nil {
				t.Fatalf("volume %s is not a ConfigMap", v.Name)
			}
			cm, ok := cms[v.ConfigMap.Name]
			if !ok {
				t.Fatalf("volume %s names ConfigMap %q, which is not rendered", v.Name, v.ConfigMap.Name)
			}
			content, ok := cm.Data[key]
			if !ok {
				t.Fatalf("ConfigMap %s has no key %s", cm.Name, key)
			}
			return decodeEndpoints(t, []byte(content))
		}
	}
	t.Fatalf("PULSE_ENDPOINTS_FILE=%s, but nothing is mounted at %s", file, dir)
	return nil
}

// decodeEndpoints decodes an endpoints file and checks each entry's fields against the contract.
func decodeEndpoints(t *testing.T, content []byte) []map[string]any {
	t.Helper()
	var eps []map[string]any
	if err := yaml.UnmarshalStrict(content, &eps); err != nil {
		t.Fatalf("endpoints file: %v\n%s", err, content)
	}
	if len(eps) == 0 {
		t.Fatal("endpoints file is empty")
	}
	for i, ep := range eps {
		for k := range ep {
			if !slices.Contains(endpointKeys, k) {
				t.Errorf("endpoint %d: unknown field %q", i, k)
			}
		}
		for _, k := range []string{"consumerGroup", "url", "topics"} {
			if _, ok := ep[k]; !ok {
				t.Errorf("endpoint %d: missing %s", i, k)
			}
		}
	}
	return eps
}

// withURI is the MongoDB URI every render needs unless it names an existing Secret or opts in to devDatabase.
var withURI = []string{"--set", "secret.mongodbUri=mongodb://mongo-0.mongo:27017/?replicaSet=rs0"}

// Without a MongoDB URI the render fails, unless the development database is chosen explicitly.
func TestChartDefaultsNeedAMongoDBURI(t *testing.T) {
	t.Parallel()
	if _, err := helmTemplate(t, chartDir); err == nil || !strings.Contains(err.Error(), "no MongoDB URI") ||
		!strings.Contains(err.Error(), "devDatabase=true") {
		t.Fatalf("default render: err = %v, want a failure naming secret.mongodbUri and devDatabase=true", err)
	}
	for _, args := range [][]string{withURI, {"--set", "devDatabase=true"}} {
		r := render(t, args...)
		if got := r.kinds(); !slices.Equal(got, []string{"Secret"}) {
			t.Fatalf("render %v = %v, want just the Secret (the sidecar goes into your own Deployment)", args, got)
		}
		name, s := only(t, "Secret", r.secrets)
		if name != release+"-pulse-sidecar" {
			t.Errorf("Secret name = %q", name)
		}
		want := strings.TrimPrefix(args[1], "secret.mongodbUri=")
		if args[1] == "devDatabase=true" {
			want = "" // the embedded development database
		}
		if uri, ok := s.StringData["mongodb-uri"]; !ok || uri != want {
			t.Errorf("render %v: Secret stringData = %v, want mongodb-uri %q", args, s.StringData, want)
		}
		if _, ok := s.StringData["api-token"]; ok {
			t.Error("Secret has an api-token although apiToken is empty")
		}
	}
}

func TestChartExampleAndServiceMonitor(t *testing.T) {
	t.Parallel()
	r := render(t, append(slices.Clone(withURI), "--set", "example.enabled=true", "--set", "serviceMonitor.enabled=true")...)
	if got, want := r.kinds(), []string{"Deployment", "Secret", "Service", "ServiceMonitor"}; !slices.Equal(got, want) {
		t.Fatalf("kinds = %v, want %v", got, want)
	}
	secretName, _ := only(t, "Secret", r.secrets)
	_, d := only(t, "Deployment", r.deployments)
	spec := &d.Spec.Template.Spec
	c := checkSidecar(t, spec, secretName)
	if envVar(c, "PULSE_ENDPOINTS_FILE") != nil {
		t.Error("PULSE_ENDPOINTS_FILE is set although no endpoints are configured")
	}
	if got := envValue(t, c, "PULSE_SHUTDOWN_TIMEOUT"); got != "25s" {
		t.Errorf("PULSE_SHUTDOWN_TIMEOUT = %q, want the default 25s", got)
	}
	if g := spec.TerminationGracePeriodSeconds; g == nil || *g != 30 {
		t.Errorf("terminationGracePeriodSeconds = %v, want 30", g)
	}
	if c.Image != "ghcr.io/pulse-sidecar/pulse:"+chartAppVersion(t) {
		t.Errorf("sidecar image = %q, want the chart's appVersion as tag", c.Image)
	}
	if len(spec.Containers) != 2 || spec.Containers[0].Name != "app" {
		t.Errorf("containers = %v, want the app then the sidecar", containerNames(spec.Containers))
	}
	if sel := d.Spec.Selector.MatchLabels; !subset(sel, d.Spec.Template.Labels) {
		t.Errorf("Deployment selector %v does not match its pod labels %v", sel, d.Spec.Template.Labels)
	}
	checkServiceAndMonitor(t, r, d.Spec.Template.Labels, c.Ports[0].Name)
}

func TestChartFullExample(t *testing.T) {
	t.Parallel()
	r := render(t, "-f", filepath.Join(chartDir, "ci", "example-values.yaml"))
	if got, want := r.kinds(), []string{"ConfigMap", "Deployment", "Secret", "Service", "ServiceMonitor"}; !slices.Equal(got, want) {
		t.Fatalf("kinds = %v, want %v", got, want)
	}
	secretName, s := only(t, "Secret", r.secrets)
	if s.StringData["mongodb-uri"] == "" || s.StringData["api-token"] != "change-me" {
		t.Errorf("Secret stringData = %v", s.StringData)
	}
	_, d := only(t, "Deployment", r.deployments)
	spec := &d.Spec.Template.Spec
	c := checkSidecar(t, spec, secretName)
	eps := checkEndpointsMount(t, spec, c, r.configMaps)
	if eps[0]["consumerGroup"] != "demo" {
		t.Errorf("endpoints = %v", eps)
	}
	for name, want := range map[string]string{
		"PULSE_LOG_LEVEL": "debug", "PULSE_EVENT_RETENTION": "24h", "PULSE_HISTORY_RETENTION": "0", "GOMEMLIMIT": "200MiB",
	} {
		if got := envValue(t, c, name); got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
	if tok := envVar(c, "PULSE_API_TOKEN"); tok == nil || tok.ValueFrom.SecretKeyRef.Key != "api-token" {
		t.Errorf("PULSE_API_TOKEN = %+v", tok)
	}
	if d.Spec.Template.Annotations["checksum/pulse-endpoints"] == "" {
		t.Error("pod template has no checksum/pulse-endpoints annotation")
	}
	checkServiceAndMonitor(t, r, d.Spec.Template.Labels, c.Ports[0].Name)
	_, sm := only(t, "ServiceMonitor", r.serviceMonitors)
	if labels := dig[map[string]any](sm, "metadata", "labels"); labels["release"] != "prometheus" {
		t.Errorf("ServiceMonitor labels = %v, want serviceMonitor.labels merged in", labels)
	}
}

// checkServiceAndMonitor asserts the Service selects the pods and the ServiceMonitor scrapes /metrics
// through it.
func checkServiceAndMonitor(t *testing.T, r *rendered, podLabels map[string]string, portName string) {
	t.Helper()
	_, svc := only(t, "Service", r.services)
	if !subset(svc.Spec.Selector, podLabels) || len(svc.Spec.Selector) == 0 {
		t.Errorf("Service selector %v does not select the pod labels %v", svc.Spec.Selector, podLabels)
	}
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].TargetPort.String() != portName {
		t.Errorf("Service ports = %+v, want one targeting %q", svc.Spec.Ports, portName)
	}
	_, sm := only(t, "ServiceMonitor", r.serviceMonitors)
	if sm["apiVersion"] != "monitoring.coreos.com/v1" || sm["kind"] != "ServiceMonitor" {
		t.Errorf("ServiceMonitor is %v %v", sm["apiVersion"], sm["kind"])
	}
	eps := dig[[]any](sm, "spec", "endpoints")
	if len(eps) != 1 {
		t.Fatalf("ServiceMonitor endpoints = %v, want one", eps)
	}
	ep, _ := eps[0].(map[string]any)
	if ep["path"] != "/metrics" || ep["port"] != svc.Spec.Ports[0].Name {
		t.Errorf("ServiceMonitor endpoint = %v, want path /metrics on port %q", ep, svc.Spec.Ports[0].Name)
	}
	matchLabels := map[string]string{}
	for k, v := range dig[map[string]any](sm, "spec", "selector", "matchLabels") {
		matchLabels[k], _ = v.(string)
	}
	if len(matchLabels) == 0 || !subset(matchLabels, svc.Labels) {
		t.Errorf("ServiceMonitor selector %v does not select the Service labels %v", matchLabels, svc.Labels)
	}
}

func TestChartExistingSecretAndNativeSidecar(t *testing.T) {
	t.Parallel()
	r := render(t, "--set", "example.enabled=true", "--set", "secret.existingSecret=my-pulse",
		"--set", "secret.apiTokenKey=token", "--set", "nativeSidecar=true",
		"--set", "shutdownTimeout=1m", "--set", "terminationGracePeriodSeconds=75")
	if len(r.secrets) != 0 {
		t.Errorf("a Secret is rendered although existingSecret is set")
	}
	_, d := only(t, "Deployment", r.deployments)
	spec := &d.Spec.Template.Spec
	c := checkSidecar(t, spec, "my-pulse")
	if len(spec.InitContainers) != 1 || spec.InitContainers[0].Name != "pulse" {
		t.Fatalf("initContainers = %v, want the sidecar there", containerNames(spec.InitContainers))
	}
	if c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Error("native sidecar has no restartPolicy Always")
	}
	if tok := envVar(c, "PULSE_API_TOKEN"); tok == nil || tok.ValueFrom.SecretKeyRef.Key != "token" ||
		tok.ValueFrom.SecretKeyRef.Optional == nil || !*tok.ValueFrom.SecretKeyRef.Optional {
		t.Errorf("PULSE_API_TOKEN = %+v, want optional key token of my-pulse", tok)
	}
}

func TestChartRejectsBadValues(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"grace equal to shutdown", []string{"--set", "terminationGracePeriodSeconds=25"}, "must be greater than shutdownTimeout"},
		{"grace below shutdown", []string{"--set", "example.enabled=true", "--set", "shutdownTimeout=1m"}, "must be greater than shutdownTimeout"},
		{"grace below shutdown in ms", []string{"--set", "terminationGracePeriodSeconds=2", "--set", "shutdownTimeout=2500ms"}, "must be greater than shutdownTimeout"},
		{"bad duration", []string{"--set", "shutdownTimeout=25 seconds"}, "not a Go duration"},
		{"no secret", []string{"--set", "secret.create=false"}, "secret.existingSecret"},
		{"monitor without selector", []string{"--set", "serviceMonitor.enabled=true"}, "service.selector"},
		{"env the chart owns", []string{"--set", "example.enabled=true", "--set", "extraEnv[0].name=PULSE_LISTEN", "--set", "extraEnv[0].value=x"}, "extraEnv sets PULSE_LISTEN"},
		{"unknown config", []string{"--set", "config.logLevell=debug"}, "unknown config.logLevell"},
		{"API beyond loopback without a token", []string{"--set", "listenAddress=0.0.0.0"}, "without a token"},
		{"API and probes on one port", []string{"--set", "probePort=8080"}, "a port each"},
		{"owned probe listener", []string{"--set", "extraEnv[0].name=PULSE_PROBE_LISTEN", "--set", "extraEnv[0].value=x"}, "extraEnv sets PULSE_PROBE_LISTEN"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := helmTemplate(t, chartDir, append(slices.Clone(withURI), tc.args...)...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("helm template %v: err = %v, want one containing %q", tc.args, err, tc.want)
			}
		})
	}
	// The same check accepts a grace period above a fractional timeout.
	if _, err := helmTemplate(t, chartDir, append(slices.Clone(withURI), "--set", "terminationGracePeriodSeconds=3", "--set", "shutdownTimeout=2500ms")...); err != nil {
		t.Errorf("grace 3s above shutdown 2.5s rejected: %v", err)
	}
}

// TestChartIncludedFromParentChart renders testdata/app, a user's chart that has this chart as a dependency and
// includes the sidecar in its own Deployment: the names it computes must match what the subchart renders.
func TestChartIncludedFromParentChart(t *testing.T) {
	t.Parallel()
	helmPath(t)
	dir := filepath.Join(t.TempDir(), "app")
	copyDir(t, filepath.Join("testdata", "app"), dir)
	copyDir(t, chartDir, filepath.Join(dir, "charts", "pulse-sidecar"))
	out, err := helmTemplate(t, dir)
	if err != nil {
		t.Fatalf("helm template testdata/app: %v", err)
	}
	r := decodeStrict(t, out)
	if got, want := r.kinds(), []string{"ConfigMap", "Deployment"}; !slices.Equal(got, want) {
		t.Fatalf("kinds = %v, want %v (existingSecret set, so no Secret)", got, want)
	}
	d := r.deployments[release+"-app"]
	if d == nil {
		t.Fatalf("no Deployment %s-app", release)
	}
	spec := &d.Spec.Template.Spec
	c := checkSidecar(t, spec, "billing-pulse")
	if ref := envVar(c, "PULSE_MONGODB_URI").ValueFrom.SecretKeyRef; ref.Key != "uri" {
		t.Errorf("PULSE_MONGODB_URI key = %q, want the parent's value uri", ref.Key)
	}
	if got := envValue(t, c, "PULSE_SHUTDOWN_TIMEOUT"); got != "40s" || *spec.TerminationGracePeriodSeconds != 45 {
		t.Errorf("shutdown %q, grace %d: want the parent's 40s and 45", got, *spec.TerminationGracePeriodSeconds)
	}
	if got := envValue(t, c, "PULSE_CHANGE_STREAMS"); got != "required" {
		t.Errorf("PULSE_CHANGE_STREAMS = %q, want required", got)
	}
	eps := checkEndpointsMount(t, spec, c, r.configMaps)
	if eps[0]["consumerGroup"] != "billing" {
		t.Errorf("endpoints = %v, want the parent's", eps)
	}
	if !slices.Equal(containerNames(spec.Containers), []string{"app", "pulse"}) || len(spec.Volumes) != 4 {
		t.Errorf("containers %v, %d volumes: want app and pulse, and cache plus the sidecar's three",
			containerNames(spec.Containers), len(spec.Volumes))
	}

	// A grace period at or below the timeout fails the parent's render too.
	if _, err := helmTemplate(t, dir, "--set", "pulse-sidecar.terminationGracePeriodSeconds=40"); err == nil ||
		!strings.Contains(err.Error(), "must be greater than shutdownTimeout") {
		t.Errorf("parent render with grace 40 <= 40s: err = %v", err)
	}
}

func TestChartImageTagIsAppVersion(t *testing.T) {
	t.Parallel()
	var values struct {
		Image struct {
			Tag string `json:"tag"`
		} `json:"image"`
		Example struct {
			Image struct {
				Tag string `json:"tag"`
			} `json:"image"`
		} `json:"example"`
	}
	b, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &values); err != nil {
		t.Fatal(err)
	}
	v := chartAppVersion(t)
	if values.Image.Tag != v || values.Example.Image.Tag != v {
		t.Errorf("values.yaml image tags %q and %q, want Chart.yaml appVersion %q (update them together)",
			values.Image.Tag, values.Example.Image.Tag, v)
	}
}

func chartAppVersion(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(chartDir, "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var chart struct {
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(b, &chart); err != nil || chart.AppVersion == "" {
		t.Fatalf("Chart.yaml appVersion: %q, %v", chart.AppVersion, err)
	}
	return chart.AppVersion
}

// Exposing the API beyond the pod's loopback is explicit, needs a token, and declares the API port next to the
// probe port; the read-only token and the encryption key come from the Secret.
func TestChartExposedAPIAndSecrets(t *testing.T) {
	t.Parallel()
	r := render(t, append(slices.Clone(withURI), "--set", "example.enabled=true", "--set", "listenAddress=0.0.0.0",
		"--set", `secret.apiToken=tok-a\,tok-b`, "--set", "secret.apiReadToken=viewer",
		"--set", "secret.encryptionKey=MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=")...)
	_, s := only(t, "Secret", r.secrets)
	if s.StringData["api-token"] != "tok-a,tok-b" || s.StringData["api-read-token"] != "viewer" || s.StringData["encryption-key"] == "" {
		t.Errorf("Secret stringData = %v", s.StringData)
	}
	_, d := only(t, "Deployment", r.deployments)
	c := sidecar(t, &d.Spec.Template.Spec)
	if got := envValue(t, c, "PULSE_LISTEN"); got != "0.0.0.0:8080" {
		t.Errorf("PULSE_LISTEN = %q, want 0.0.0.0:8080", got)
	}
	if len(c.Ports) != 2 || c.Ports[0].ContainerPort != 8081 || c.Ports[1].ContainerPort != 8080 || c.Ports[1].Name != "pulse" {
		t.Errorf("ports = %+v, want the probe port and the API port", c.Ports)
	}
	for name, key := range map[string]string{"PULSE_API_TOKEN": "api-token", "PULSE_API_READ_TOKEN": "api-read-token", "PULSE_ENCRYPTION_KEY": "encryption-key"} {
		if e := envVar(c, name); e == nil || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.ValueFrom.SecretKeyRef.Key != key {
			t.Errorf("%s = %+v, want secretKeyRef key %s", name, e, key)
		}
	}
	if c.ReadinessProbe.HTTPGet.Port.String() != "pulse-probes" {
		t.Errorf("readinessProbe port = %s, want pulse-probes", c.ReadinessProbe.HTTPGet.Port.String())
	}
}

// The chart's default images are the ones a release pushes: .goreleaser.yaml builds an image of each
// repository values.yaml names, tagged with the version (which the release workflow also writes into
// values.yaml and Chart.yaml's appVersion).
func TestChartImagesAreTheReleasedOnes(t *testing.T) {
	t.Parallel()
	var values struct {
		Image struct {
			Repository string `json:"repository"`
		} `json:"image"`
		Example struct {
			Image struct {
				Repository string `json:"repository"`
			} `json:"image"`
		} `json:"example"`
	}
	b, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &values); err != nil {
		t.Fatal(err)
	}
	var release struct {
		DockersV2 []struct {
			Images []string `json:"images"`
			Tags   []string `json:"tags"`
		} `json:"dockers_v2"`
	}
	b, err = os.ReadFile("../.goreleaser.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &release); err != nil {
		t.Fatal(err)
	}
	for _, repo := range []string{values.Image.Repository, values.Example.Image.Repository} {
		found := false
		for _, d := range release.DockersV2 {
			if slices.Contains(d.Images, repo) {
				found = true
				if !slices.Contains(d.Tags, "{{ .Version }}") {
					t.Errorf(".goreleaser.yaml tags %s with %q, want {{ .Version }} (the chart's appVersion)", repo, d.Tags)
				}
			}
		}
		if !found {
			t.Errorf("values.yaml's image %s is built by no dockers_v2 entry of .goreleaser.yaml", repo)
		}
	}
}

// The sidecar's startupProbe asks /readyz on the probe port for the whole start: the schema work the chart
// sets as PULSE_SCHEMA_TIMEOUT (schemaTimeout), the 30 s bound of the start's work after it, and a margin;
// liveness and readiness wait for it, so a long index build never has the pod killed. A schemaTimeout
// outside PULSE_SCHEMA_TIMEOUT's range fails the render.
func TestChartStartupProbeCoversTheSchemaTimeout(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args   []string
		env    string
		budget time.Duration
	}{
		{nil, "1h", time.Hour},
		{[]string{"--set", "schemaTimeout=4h"}, "4h", 4 * time.Hour},
		{[]string{"--set", "schemaTimeout=90m", "--set", "startupProbe.periodSeconds=30"}, "90m", 90 * time.Minute},
	} {
		r := render(t, append(slices.Clone(withURI), append([]string{"--set", "example.enabled=true"}, tc.args...)...)...)
		_, d := only(t, "Deployment", r.deployments)
		c := sidecar(t, &d.Spec.Template.Spec)
		if got := envValue(t, c, "PULSE_SCHEMA_TIMEOUT"); got != tc.env {
			t.Errorf("%v: PULSE_SCHEMA_TIMEOUT = %q, want %q", tc.args, got, tc.env)
		}
		p := c.StartupProbe
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/readyz" || p.HTTPGet.Port.String() != c.Ports[0].Name {
			t.Fatalf("%v: startupProbe = %+v, want GET /readyz on the probe port %s", tc.args, p, c.Ports[0].Name)
		}
		allowed := time.Duration(p.FailureThreshold*p.PeriodSeconds) * time.Second
		if min := tc.budget + 30*time.Second; allowed < min || allowed > min+3*time.Minute {
			t.Errorf("%v: startupProbe allows %s (failureThreshold %d × periodSeconds %d), want between %s and 3m more", tc.args, allowed, p.FailureThreshold, p.PeriodSeconds, min)
		}
	}
	for _, bad := range []string{"30s", "49h", "an hour"} {
		if _, err := helmTemplate(t, chartDir, append(slices.Clone(withURI), "--set", "schemaTimeout="+bad)...); err == nil || !strings.Contains(err.Error(), "schemaTimeout") {
			t.Errorf("schemaTimeout=%s: err = %v, want one naming schemaTimeout", bad, err)
		}
	}
}
