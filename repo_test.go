package main

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pulse-sidecar/pulse/httpapi"
	"github.com/pulse-sidecar/pulse/pulsetype"
)

// The repository speaks of this project alone: no links to files outside it and no wording that only made
// sense beside other projects' documents.
func TestRepositoryIsSelfContained(t *testing.T) {
	t.Parallel()
	banned := []string{
		"../" + "shared/", "shared/" + "design", "shared/" + "seed", "reference" + " design", "the reference" + "'s",
		"these" + " machines", "the target is" + " 3", "the " + "seed",
	}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != "." && (strings.HasPrefix(name, ".") && name != ".ci" || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		switch filepath.Ext(path) {
		case ".go", ".md", ".yaml", ".yml", ".tpl", ".txt", "":
		default:
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		text := strings.ToLower(string(b))
		for _, s := range banned {
			if strings.Contains(text, s) {
				t.Errorf("%s mentions %q", path, s)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for file, want := range map[string]string{"LICENSE": "Apache License\n                           Version 2.0", "CHANGELOG.md": "## [Unreleased]"} {
		if b, err := os.ReadFile(file); err != nil || !strings.Contains(string(b), want) {
			t.Errorf("%s: %v, want it to contain %q", file, err, want)
		}
	}
}

// The docs document the rules the code applies (docs/api.md: topic and group names, durations, at-most-once,
// insecureSkipVerify) and the README the minimum Go version and the license.
func TestReadmeDocumentsRules(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join("docs", "api.md"))
	if err != nil {
		t.Fatal(err)
	}
	api := string(b)
	b, err = os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	samples := []string{"a", "payment.captured", "orders:eu-1", "a_b-c", ".x", "-x", "", "a b", "é", "a/b",
		strings.Repeat("a", 100), strings.Repeat("a", 101), strings.Repeat("a", 200), strings.Repeat("a", 201)}
	for name, valid := range map[string]func(string) bool{"Topics": pulsetype.ValidTopic, "Consumer group names": pulsetype.ValidConsumerGroup} {
		m := regexp.MustCompile(`(?s)\*\*` + name + `\*\*.*?match ` + "`(\\^[^`]+)`").FindStringSubmatch(api)
		if m == nil {
			t.Errorf("docs/api.md: no **%s** rule", name)
			continue
		}
		re := regexp.MustCompile(m[1])
		for _, s := range samples {
			if re.MatchString(s) != valid(s) {
				t.Errorf("docs/api.md's %s rule %s says %v for %q, the code %v", name, m[1], re.MatchString(s), s, valid(s))
			}
		}
	}
	var d httpapi.Duration
	if err := json.Unmarshal([]byte("1500"), &d); err != nil || time.Duration(d) != 1500*time.Millisecond {
		t.Errorf("a bare JSON number 1500 reads as %v (%v); docs/api.md says milliseconds", time.Duration(d), err)
	}
	for _, want := range []string{"read\n  as **milliseconds**", "`at-most-once` records", "**`insecureSkipVerify`**"} {
		if !strings.Contains(api, want) {
			t.Errorf("docs/api.md does not contain %q", want)
		}
	}
	gomod, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	goVersion := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(gomod)
	for _, want := range []string{"Requires Go " + string(goVersion[1]) + " or newer", "Apache License 2.0"} {
		if !strings.Contains(readme, want) {
			t.Errorf("README does not contain %q", want)
		}
	}
}
