package main

import (
	"bufio"
	"errors"
	"go/build"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// architectureDoc holds the package table TestArchitectureTableMatchesImports
// keeps true, in its section archSection.
const (
	architectureDoc = "docs/architecture.md"
	archSection     = "## The packages"
)

var (
	// backticked is a name in backticks, as the table names packages.
	backticked = regexp.MustCompile("`([^`]+)`")
	// parenthesized is a note in an imports cell ("`proxy` (its transport)"),
	// whose names are not imports.
	parenthesized = regexp.MustCompile(`\([^)]*\)`)
)

// archRow is one row of the package table: the packages its first cell
// names (as the table names them: `router` for internal/router,
// `cmd/kvroute`) and the project's packages its imports column lists.
type archRow struct {
	line     int
	packages []string
	imports  []string
}

// TestArchitectureTableMatchesImports keeps docs/architecture.md's package
// table true to the tree: every package under internal/ and cmd/ has a row,
// no row names a package that is not there, and each row's imports column
// lists exactly the project's packages that package imports (not its tests).
// Imports are read with go/build from the sources, for this machine's
// GOOS and GOARCH: no network, no module download. A failure says which row
// to add, remove or correct, and what it should read.
func TestArchitectureTableMatchesImports(t *testing.T) {
	root := filepath.Join("..", "..")
	pkgs := projectImports(t, root)
	rows := architectureRows(t, filepath.Join(root, architectureDoc))

	seen := map[string]int{} // package → the line of its row
	for _, r := range rows {
		where := architectureDoc + ":" + strconv.Itoa(r.line)
		for _, p := range r.packages {
			if line, dup := seen[p]; dup {
				t.Errorf("%s: `%s` has a row at line %d already; keep one", where, p, line)
				continue
			}
			seen[p] = r.line
			want, ok := pkgs[p]
			if !ok {
				t.Errorf("%s: the row names `%s`, which is not a package under internal/ or cmd/: remove it, or name the package as the table does (`router` for internal/router, `cmd/kvroute`)", where, p)
				continue
			}
			if slices.Equal(want, r.imports) {
				continue
			}
			if len(r.packages) > 1 {
				t.Errorf("%s: `%s` shares a row whose imports column lists %s, but it imports %s: give it a row of its own, or correct the column",
					where, p, importsCell(r.imports), importsCell(want))
				continue
			}
			var change []string
			if add := setDiff(want, r.imports); len(add) > 0 {
				change = append(change, "add "+importsCell(add))
			}
			if remove := setDiff(r.imports, want); len(remove) > 0 {
				change = append(change, "remove "+importsCell(remove))
			}
			t.Errorf("%s: row `%s`: the imports column should read %s (%s)", where, p, importsCell(want), strings.Join(change, "; "))
		}
	}
	var missing []string
	for p := range pkgs {
		if _, ok := seen[p]; !ok {
			missing = append(missing, p)
		}
	}
	slices.Sort(missing)
	for _, p := range missing {
		t.Errorf("%s (%s): no row for `%s`; add one:\n| `%s` | what it owns | %s |", architectureDoc, archSection, p, p, importsCell(pkgs[p]))
	}
}

// projectImports maps each package under root's internal/ and cmd/ (named
// as the table names it) to the project's packages it imports, sorted.
func projectImports(t *testing.T, root string) map[string][]string {
	t.Helper()
	module := modulePath(t, root)
	pkgs := map[string][]string{}
	for _, top := range []string{"internal", "cmd"} {
		err := filepath.WalkDir(filepath.Join(root, top), func(dir string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return err
			}
			if name := d.Name(); name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") {
				return filepath.SkipDir // as the go tool skips them
			}
			pkg, err := build.ImportDir(dir, 0)
			var noGo *build.NoGoError
			if errors.As(err, &noGo) {
				return nil // no package here (or tests only)
			}
			if err != nil {
				return err
			}
			rel, err := filepath.Rel(root, dir)
			if err != nil {
				return err
			}
			imports := []string{}
			for _, imp := range pkg.Imports {
				if p, ok := strings.CutPrefix(imp, module+"/"); ok {
					imports = append(imports, tableName(p))
				}
			}
			slices.Sort(imports)
			pkgs[tableName(filepath.ToSlash(rel))] = imports
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(pkgs) == 0 {
		t.Fatal("no packages found under internal/ and cmd/")
	}
	return pkgs
}

// tableName is how the table names the package at path (from the module's
// root): internal/ left out, cmd/ kept.
func tableName(path string) string {
	if p, ok := strings.CutPrefix(path, "internal/"); ok {
		return p
	}
	return path
}

// modulePath reads the module's path from root's go.mod.
func modulePath(t *testing.T, root string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if m, ok := strings.CutPrefix(strings.TrimSpace(line), "module "); ok {
			return strings.Trim(strings.TrimSpace(m), `"`)
		}
	}
	t.Fatal("go.mod names no module")
	return ""
}

// architectureRows reads the package table: the rows of the first table
// in archSection, after its header and separator.
func architectureRows(t *testing.T, doc string) []archRow {
	t.Helper()
	f, err := os.Open(doc)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var (
		rows            []archRow
		inSection       bool
		inTable, header bool
	)
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "## "):
			if inTable {
				return rows
			}
			inSection = line == archSection
			continue
		case !inSection:
			continue
		case !strings.HasPrefix(line, "|"):
			if inTable {
				return rows
			}
			continue
		}
		if !inTable {
			inTable, header = true, true // the header row
			continue
		}
		if header { // the separator row
			header = false
			continue
		}
		cells := strings.Split(strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(strings.ReplaceAll(line, `\|`, "")), "|"), "|"), "|")
		if len(cells) != 3 {
			t.Fatalf("%s:%d: a row of the package table has %d cells, not 3 (package | owns | imports): %q", architectureDoc, n, len(cells), line)
		}
		r := archRow{line: n, packages: backtickedNames(cells[0]), imports: backtickedNames(parenthesized.ReplaceAllString(cells[2], ""))}
		if len(r.packages) == 0 {
			t.Fatalf("%s:%d: a row of the package table names no package in backticks: %q", architectureDoc, n, line)
		}
		slices.Sort(r.imports)
		rows = append(rows, r)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(rows) == 0 {
		t.Fatalf("%s: no package table in its section %q", architectureDoc, archSection)
	}
	return rows
}

// backtickedNames returns the backticked names in a cell.
func backtickedNames(cell string) []string {
	out := []string{}
	for _, m := range backticked.FindAllStringSubmatch(cell, -1) {
		out = append(out, m[1])
	}
	return out
}

// setDiff returns the names of a (sorted) that b does not hold.
func setDiff(a, b []string) []string {
	out := []string{}
	for _, x := range a {
		if !slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	return out
}

// importsCell writes names as the imports column does: backticked and
// comma-separated, or "none".
func importsCell(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return "`" + strings.Join(names, "`, `") + "`"
}
