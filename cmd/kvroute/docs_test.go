package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

var (
	// mdLink is a Markdown link's target.
	mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	// repoPath is a path into one of the repository's top-level directories,
	// as the docs name files in passing (`internal/sim`, docs/operations.md).
	repoPath = regexp.MustCompile(`(?:^|[^A-Za-z0-9_./-])((?:\.\./)*(?:cmd|internal|docs|deploy|scripts|\.ci)/[A-Za-z0-9_./-]*[A-Za-z0-9_])`)
	// otherRepo precedes a path in another project's repository, cited as a
	// source (docs/epp.md: "llm-d-router `deploy/...`").
	otherRepo = regexp.MustCompile("(GIE|llm-d-router|llm-d|lwepp|caddy|grpc-go|vLLM|SGLang|Envoy|envoy)[` ]*$")
)

// TestDocsReferToFilesThatExist: every relative link and every path into the
// repository that README.md and docs/*.md name exists, and no doc refers to
// a design document that is not in the repository.
func TestDocsReferToFilesThatExist(t *testing.T) {
	root := filepath.Join("..", "..")
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	docs = append(docs, filepath.Join(root, "README.md"))
	for _, doc := range docs {
		data, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		name, _ := filepath.Rel(root, doc)
		for i, line := range strings.Split(string(data), "\n") {
			where := name + ":" + strconv.Itoa(i+1)
			if strings.Contains(line, "DESIGN §") || strings.Contains(line, "DESIGN.md") {
				t.Errorf("%s refers to the design document, which is not in the repository: %q", where, line)
			}
			for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
				target, _, _ := strings.Cut(m[1], "#")
				if target == "" || strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				if _, err := os.Stat(filepath.Join(filepath.Dir(doc), target)); err != nil {
					t.Errorf("%s links to %s, which does not exist", where, m[1])
				}
			}
			for _, m := range repoPath.FindAllStringSubmatchIndex(line, -1) {
				p := line[m[2]:m[3]]
				if otherRepo.MatchString(line[:m[2]]) {
					continue
				}
				base := root // a path from the repository's root ...
				if strings.HasPrefix(p, "../") {
					base = filepath.Dir(doc) // ... or from the doc's directory
				}
				if _, err := os.Stat(filepath.Join(base, p)); err != nil {
					t.Errorf("%s names %s, which is not in the repository", where, p)
				}
			}
		}
	}
}

var (
	// reasonLine is a line of the router that sets a routing reason; its
	// last string literal is the reason.
	reasonLine = regexp.MustCompile(`(?i)^\s*[^/]*\breason\w*\b[^"]*(?:=|:)[^"]*(?:"[^"]*"[^"]*)*"([a-z][a-z0-9-]*)"`)
	decideCall = regexp.MustCompile(`(?i)\bdecide\([^,]+, "([a-z][a-z0-9-]*)"`)
)

// TestReadmeListsEveryRouteReason: every X-Kvroute-Route value the policies
// set (read from their source) is in the README's table of them.
func TestReadmeListsEveryRouteReason(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, table, _ := strings.Cut(string(readme), "| policy | `X-Kvroute-Route` |")
	table, _, _ = strings.Cut(table, "\n\n")
	files, _ := filepath.Glob(filepath.Join("..", "..", "internal", "router", "*.go"))
	policies, _ := filepath.Glob(filepath.Join("..", "..", "internal", "router", "*", "*.go"))
	files = append(files, policies...)
	files = append(files, filepath.Join("..", "..", "internal", "proxy", "forward.go"))
	reasons := map[string]string{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(src), "\n") {
			for _, re := range []*regexp.Regexp{reasonLine, decideCall} {
				if m := re.FindStringSubmatch(line); m != nil {
					reasons[m[1]] = filepath.Base(f) + ":" + strconv.Itoa(i+1)
				}
			}
		}
	}
	if len(reasons) < 10 {
		t.Fatalf("found only %d reasons in the source: %v", len(reasons), reasons)
	}
	for r, where := range reasons {
		if !strings.Contains(table, "`"+r+"`") {
			t.Errorf("the README's X-Kvroute-Route table lacks `%s` (set at %s)", r, where)
		}
	}
}
