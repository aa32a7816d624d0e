package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"

	"github.com/pulse-sidecar/pulse/config"
)

// docPages returns README.md and every docs/*.md page, the pages whose links TestDocLinksResolve checks.
func docPages(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob(filepath.Join("docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	return append([]string{"README.md"}, pages...)
}

// Every relative link of the README and the docs pages resolves: the file exists, and a #fragment names a
// heading of the page it points to (GitHub's anchors).
func TestDocLinksResolve(t *testing.T) {
	t.Parallel()
	pages := docPages(t)
	if len(pages) < 9 {
		t.Fatalf("want README.md and the docs pages, found %v", pages)
	}
	links := 0
	for _, page := range pages {
		problems, n, err := brokenLinks(page)
		if err != nil {
			t.Fatal(err)
		}
		links += n
		for _, p := range problems {
			t.Errorf("%s: %s", page, p)
		}
	}
	if links < 40 {
		t.Errorf("only %d relative links found in %d pages: is the link pattern still right?", links, len(pages))
	}
}

// The link check itself finds a missing file, a missing anchor and a link to another page's missing anchor,
// and accepts the good links beside them (so TestDocLinksResolve can fail).
func TestBrokenLinksFindsBrokenLinks(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("b.md", "# B page\n\n## Pausing and disabling an endpoint\n")
	write("a.md", "# A\n\n## Exposure, tokens and audit\n\n## Exposure, tokens and audit\n\n"+
		"[ok](#exposure-tokens-and-audit) [dup](#exposure-tokens-and-audit-1) [file](b.md) "+
		"[other](b.md#pausing-and-disabling-an-endpoint) [web](https://example.com/x.md) `[code](gone.md)`\n"+
		"[missing](gone.md) [no anchor](#nowhere) [other missing](b.md#nowhere)\n\n```\n[fenced](gone2.md)\n```\n")
	problems, n, err := brokenLinks(filepath.Join(dir, "a.md"))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"gone.md: no such file", "#nowhere: no such heading", "b.md#nowhere: no such heading"}
	if n != 7 || fmt.Sprint(problems) != fmt.Sprint(want) {
		t.Errorf("brokenLinks found %d links, problems %q; want 7 links, %q", n, problems, want)
	}
}

var updateConfigTable = flag.Bool("update-config-table", false, "rewrite the table of docs/configuration.md from config.Variables")

// docs/configuration.md's table is the one config.Variables describes: the names, defaults and meanings
// that `pulse serve --help` prints. With -update-config-table the test writes it there first.
func TestConfigurationPageMatchesTheConfig(t *testing.T) {
	t.Parallel()
	path := filepath.Join("docs", "configuration.md")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := config.MarkdownTable()
	if *updateConfigTable {
		table := regexp.MustCompile(`(?m)^\| variable \| default \| meaning \|\n(?:\|.*\n)*`)
		if !table.Match(b) {
			t.Fatalf("%s has no table headed | variable | default | meaning |", path)
		}
		b = table.ReplaceAllLiteral(b, []byte(want))
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if !strings.Contains(string(b), "\n"+want+"\n") {
		t.Errorf("docs/configuration.md does not hold the table of config.Variables; run go test -run TestConfigurationPageMatchesTheConfig -update-config-table . or replace its table with:\n%s", want)
	}
	help := serveUsage()
	for _, v := range config.Variables() {
		if !strings.Contains(help, v.Name+" (default: ") {
			t.Errorf("pulse serve --help lacks %s", v.Name)
		}
	}
}

var (
	linkRE   = regexp.MustCompile(`\]\(([^()\s]+)\)`)
	fenceRE  = regexp.MustCompile("(?ms)^\\s*```.*?^\\s*```[^\\n]*$")
	codeRE   = regexp.MustCompile("`[^`\\n]*`")
	headerRE = regexp.MustCompile(`(?m)^#{1,6} +(.+?) *#*$`)
)

// brokenLinks returns the relative links of the Markdown file page that do not resolve, each as
// "<link>: <why>", and how many relative links it checked. Links in code (fenced blocks, `spans`) and
// absolute URLs are not links to check.
func brokenLinks(page string) (problems []string, checked int, err error) {
	b, err := os.ReadFile(page)
	if err != nil {
		return nil, 0, err
	}
	text := codeRE.ReplaceAllString(fenceRE.ReplaceAllString(string(b), ""), "")
	for _, m := range linkRE.FindAllStringSubmatch(text, -1) {
		link := m[1]
		if strings.Contains(link, "://") || strings.HasPrefix(link, "mailto:") {
			continue
		}
		checked++
		file, fragment, _ := strings.Cut(link, "#")
		target := page
		if file != "" {
			target = filepath.Join(filepath.Dir(page), filepath.FromSlash(file))
			if _, err := os.Stat(target); err != nil {
				problems = append(problems, link+": no such file")
				continue
			}
		}
		if fragment == "" {
			continue
		}
		anchors, err := headingAnchors(target)
		if err != nil {
			return nil, 0, err
		}
		if !anchors[fragment] {
			problems = append(problems, link+": no such heading")
		}
	}
	return problems, checked, nil
}

// headingAnchors returns the anchors GitHub gives the headings of the Markdown file path: the heading in
// lower case, without punctuation but hyphens and underscores, spaces as hyphens, and "-1", "-2"… after
// a repeated one. Headings inside fenced code blocks are not headings.
func headingAnchors(path string) (map[string]bool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	anchors := map[string]bool{}
	seen := map[string]int{}
	for _, m := range headerRE.FindAllStringSubmatch(fenceRE.ReplaceAllString(string(b), ""), -1) {
		var slug strings.Builder
		for _, r := range strings.ToLower(m[1]) {
			switch {
			case r == ' ':
				slug.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				slug.WriteRune(r)
			}
		}
		s := slug.String()
		if n := seen[s]; n > 0 {
			anchors[fmt.Sprintf("%s-%d", s, n)] = true
		} else {
			anchors[s] = true
		}
		seen[s]++
	}
	return anchors, nil
}
