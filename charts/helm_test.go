package charts_test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// helmPath returns helm's path, skipping the test when helm is missing, or failing it when CI=true.
func helmPath(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("helm")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("helm is not on PATH and CI=true: run `bash .ci/packaging`, which installs it")
		}
		t.Skip("helm is not on PATH: skipping the chart tests (install it with " +
			"`go install helm.sh/helm/v3/cmd/helm@v3.22.0`, or run `bash .ci/packaging`)")
	}
	return p
}

// helmTemplate renders chart with the given extra arguments; it returns helm's error output on failure.
func helmTemplate(t *testing.T, chart string, args ...string) (string, error) {
	t.Helper()
	helm := helmPath(t)
	cmd := exec.Command(helm, append([]string{"template", release, chart, "--namespace", namespace}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", errors.New(strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// rendered holds the decoded manifests of one render, by name.
type rendered struct {
	deployments     map[string]*appsv1.Deployment
	configMaps      map[string]*corev1.ConfigMap
	secrets         map[string]*corev1.Secret
	services        map[string]*corev1.Service
	serviceMonitors map[string]map[string]any
}

func (r *rendered) kinds() []string {
	var k []string
	for kind, n := range map[string]int{"Deployment": len(r.deployments), "ConfigMap": len(r.configMaps),
		"Secret": len(r.secrets), "Service": len(r.services), "ServiceMonitor": len(r.serviceMonitors)} {
		for range n {
			k = append(k, kind)
		}
	}
	slices.Sort(k)
	return k
}

var docSep = regexp.MustCompile(`(?m)^---\s*$`)

// decodeStrict decodes every YAML document of out into its API type, failing on unknown or duplicate fields
// and on kinds the chart should not render.
func decodeStrict(t *testing.T, out string) *rendered {
	t.Helper()
	r := &rendered{
		deployments: map[string]*appsv1.Deployment{}, configMaps: map[string]*corev1.ConfigMap{},
		secrets: map[string]*corev1.Secret{}, services: map[string]*corev1.Service{},
		serviceMonitors: map[string]map[string]any{},
	}
	for _, doc := range docSep.Split(out, -1) {
		if isEmptyDoc(doc) {
			continue
		}
		var meta struct {
			metav1.TypeMeta `json:",inline"`
			Metadata        metav1.ObjectMeta `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("document is not YAML: %v\n%s", err, doc)
		}
		gvk, name := meta.APIVersion+"/"+meta.Kind, meta.Metadata.Name
		if name == "" {
			t.Fatalf("%s without metadata.name:\n%s", gvk, doc)
		}
		if ns := meta.Metadata.Namespace; ns != "" && ns != namespace {
			t.Errorf("%s %s: namespace %q, want the release namespace", gvk, name, ns)
		}
		var obj any
		switch gvk {
		case "apps/v1/Deployment":
			obj = add(r.deployments, name)
		case "v1/ConfigMap":
			obj = add(r.configMaps, name)
		case "v1/Secret":
			obj = add(r.secrets, name)
		case "v1/Service":
			obj = add(r.services, name)
		case "monitoring.coreos.com/v1/ServiceMonitor":
			m := map[string]any{}
			if err := yaml.UnmarshalStrict([]byte(doc), &m); err != nil {
				t.Fatalf("ServiceMonitor %s: %v", name, err)
			}
			for k := range m {
				if !slices.Contains([]string{"apiVersion", "kind", "metadata", "spec"}, k) {
					t.Errorf("ServiceMonitor %s: unexpected top-level field %q", name, k)
				}
			}
			r.serviceMonitors[name] = m
			continue
		default:
			t.Fatalf("unexpected kind %s (%s):\n%s", gvk, name, doc)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			t.Fatalf("%s %s does not decode strictly: %v\n%s", gvk, name, err, doc)
		}
	}
	return r
}

// add puts a new, empty object under name in m and returns it, for the document to decode into.
func add[T any](m map[string]*T, name string) *T {
	obj := new(T)
	m[name] = obj
	return obj
}

func isEmptyDoc(doc string) bool {
	for _, line := range strings.Split(doc, "\n") {
		if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") {
			return false
		}
	}
	return true
}

// render renders this chart with args and decodes the result; a render error fails the test.
func render(t *testing.T, args ...string) *rendered {
	t.Helper()
	out, err := helmTemplate(t, chartDir, args...)
	if err != nil {
		t.Fatalf("helm template %v: %v", args, err)
	}
	return decodeStrict(t, out)
}

func only[T any](t *testing.T, what string, m map[string]T) (string, T) {
	t.Helper()
	if len(m) != 1 {
		t.Fatalf("want exactly one %s, got %d", what, len(m))
	}
	for k, v := range m {
		return k, v
	}
	panic("unreachable")
}

func containerNames(cs []corev1.Container) []string {
	var names []string
	for _, c := range cs {
		names = append(names, c.Name)
	}
	return names
}

// subset reports whether every key of a has the same value in b.
func subset(a, b map[string]string) bool {
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// dig walks nested maps by keys and returns the value as T, or T's zero value.
func dig[T any](m map[string]any, keys ...string) T {
	var cur any = m
	for _, k := range keys {
		mm, ok := cur.(map[string]any)
		if !ok {
			var zero T
			return zero
		}
		cur = mm[k]
	}
	v, _ := cur.(T)
	return v
}

func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}
