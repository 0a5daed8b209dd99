package shareddata_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/shareddata"
	"github.com/kvroute/kvroute/internal/shareddata/sharedtest"
)

// The pinned checksums and sizes are those of the files CI has.
func TestFilesMatchSharedData(t *testing.T) {
	for _, f := range shareddata.Files {
		t.Run(f.Name, func(t *testing.T) {
			p := sharedtest.Require(t, f.Name)
			data, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			sum := sha256.Sum256(data)
			if got := hex.EncodeToString(sum[:]); got != f.SHA256 || int64(len(data)) != f.Size {
				t.Errorf("%s: sha256 %s, %d bytes; pinned %s, %d bytes", p, got, len(data), f.SHA256, f.Size)
			}
		})
	}
}

// docs/data.md cites every file's upstream URL and checksum.
func TestDocsCiteEveryFile(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "data.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range shareddata.Files {
		for _, want := range []string{f.URL, f.SHA256} {
			if !strings.Contains(string(doc), want) {
				t.Errorf("docs/data.md does not cite %s of %s", want, f.Name)
			}
		}
	}
}

// isolate makes the data lookup see only dir: no module root above the
// working directory (so no ../shared/data) and dir as the data directory.
func isolate(t *testing.T, dir string) {
	t.Chdir(t.TempDir())
	t.Setenv(shareddata.EnvDir, dir)
}

func TestPathMissingNamesTheStep(t *testing.T) {
	dir := t.TempDir()
	isolate(t, dir)
	_, err := shareddata.Path("mooncake/conversation_trace.jsonl")
	if !errors.Is(err, shareddata.ErrMissing) || !strings.Contains(err.Error(), "kvroute data fetch") ||
		!strings.Contains(err.Error(), dir) {
		t.Fatalf("err = %v, want ErrMissing naming %s and `kvroute data fetch`", err, dir)
	}
	p := filepath.Join(dir, "mooncake", "conversation_trace.jsonl")
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("{}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := shareddata.Path("mooncake/conversation_trace.jsonl"); err != nil || got != p {
		t.Errorf("Path = %q, %v; want %q", got, err, p)
	}
}

// testFiles serves contents (name → bytes) on a loopback server and returns
// the Files that point at it, with their true checksums.
func testFiles(t *testing.T, contents map[string]string) []shareddata.File {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, ok := contents[strings.TrimPrefix(r.URL.Path, "/")]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	var files []shareddata.File
	for _, name := range []string{"a/one.jsonl", "b/two.csv"} {
		sum := sha256.Sum256([]byte(contents[name]))
		files = append(files, shareddata.File{Name: name, URL: srv.URL + "/" + name,
			SHA256: hex.EncodeToString(sum[:]), Size: int64(len(contents[name]))})
	}
	return files
}

func TestFetch(t *testing.T) {
	contents := map[string]string{"a/one.jsonl": "{\"x\":1}\n", "b/two.csv": "T,C,G\n1,2,3\n"}
	files := testFiles(t, contents)
	dir := t.TempDir()
	var log strings.Builder
	if err := shareddata.Fetch(context.Background(), nil, dir, files, &log); err != nil {
		t.Fatal(err)
	}
	for name, want := range contents {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || string(got) != want {
			t.Errorf("%s = %q, %v; want %q", name, got, err, want)
		}
	}
	log.Reset()
	if err := shareddata.Fetch(context.Background(), nil, dir, files, &log); err != nil {
		t.Fatal(err)
	}
	if strings.Count(log.String(), "have ") != 2 {
		t.Errorf("second fetch downloaded again:\n%s", log.String())
	}
}

func TestFetchRefusesWrongBytes(t *testing.T) {
	files := testFiles(t, map[string]string{"a/one.jsonl": "good\n", "b/two.csv": "good\n"})
	files[0].SHA256 = strings.Repeat("0", 64)
	dir := t.TempDir()
	err := shareddata.Fetch(context.Background(), nil, dir, files, &strings.Builder{})
	if !errors.Is(err, shareddata.ErrChecksum) {
		t.Fatalf("err = %v, want ErrChecksum", err)
	}
	entries, _ := os.ReadDir(filepath.Join(dir, "a"))
	if len(entries) != 0 {
		t.Errorf("a wrong download left %v behind", entries)
	}
	files = testFiles(t, map[string]string{})
	if err := shareddata.Fetch(context.Background(), nil, dir, files, &strings.Builder{}); err == nil ||
		!strings.Contains(err.Error(), "404") {
		t.Errorf("a missing upstream file: err = %v, want 404", err)
	}
}
