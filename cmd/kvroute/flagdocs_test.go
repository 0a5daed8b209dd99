package main

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// flagDocs says where each subcommand's flags are documented: the tables of
// a file, or of one "## " section of it.
var flagDocs = map[string][]docPlace{
	"serve":   {{"README.md", "## `kvroute serve`"}, {"docs/operations.md", ""}},
	"bench":   {{"README.md", "## `kvroute bench`"}},
	"sim":     {{"README.md", "## `kvroute sim`"}},
	"emulate": {{"README.md", "## `kvroute emulate`"}},
	"demo":    {{"README.md", "## Quick start"}},
	"epp":     {{"docs/epp.md", ""}},
	"data":    {{"docs/data.md", ""}},
}

// docPlace is a file of the repository, or a section of it.
type docPlace struct {
	file, section string
}

func (p docPlace) String() string {
	if p.section == "" {
		return p.file
	}
	return p.file + " (" + p.section + ")"
}

// docRow is one row of a flag table: its flags and its default cell.
type docRow struct {
	place      docPlace
	flags      []string
	def        string
	hasDefault bool // the table has a default column
}

// TestFlagTablesMatchHelp keeps the flag tables true: every flag that a
// subcommand's --help lists is in one of its tables, every flag of a table
// is in --help, and a table's default is the one --help shows.
func TestFlagTablesMatchHelp(t *testing.T) {
	for _, c := range commands {
		t.Run(c.name, func(t *testing.T) {
			help := helpFlags(t, c.name)
			places, ok := flagDocs[c.name]
			if !ok {
				if len(help) > 0 {
					t.Fatalf("kvroute %s has flags but flagDocs names no table for them", c.name)
				}
				return
			}
			documented := map[string]bool{}
			for _, row := range flagRows(t, places) {
				for i, f := range row.flags {
					documented[f] = true
					want, ok := help[f]
					if !ok {
						t.Errorf("%s lists --%s, which `kvroute %s --help` does not have", row.place, f, c.name)
						continue
					}
					if !row.hasDefault {
						continue
					}
					doc := defaultPart(row.def, i, len(row.flags))
					if m := asOther.FindStringSubmatch(doc); m != nil {
						doc = helpFlags(t, m[1])[f] // "as `kvroute bench`": that command's default
					}
					if !sameDefault(doc, want) {
						t.Errorf("%s gives --%s the default %q, `kvroute %s --help` %q", row.place, f, row.def, c.name, want)
					}
				}
			}
			for _, f := range slices.Sorted(maps.Keys(help)) {
				if !documented[f] {
					t.Errorf("`kvroute %s --help` has --%s, which no flag table of %v lists", c.name, f, places)
				}
			}
		})
	}
}

var (
	helpFlagLine = regexp.MustCompile(`^  -([a-z0-9-]+)`)
	helpDefault  = regexp.MustCompile(`\(default ([^:].*)\)$`)
)

// helpFlags runs `kvroute name --help` and returns its flags with the
// default each shows ("" when it shows none: the zero value).
func helpFlags(t *testing.T, name string) map[string]string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if code := run([]string{name, "--help"}, &stdout, &stderr); code != 0 {
		t.Fatalf("kvroute %s --help: exit %d: %s", name, code, stderr.String())
	}
	flags := map[string]string{}
	last := ""
	for _, line := range strings.Split(stderr.String()+stdout.String(), "\n") {
		if m := helpFlagLine.FindStringSubmatch(line); m != nil {
			last = m[1]
			flags[last] = ""
		}
		if m := helpDefault.FindStringSubmatch(line); m != nil && last != "" {
			flags[last] = strings.Trim(m[1], `"`)
		}
	}
	return flags
}

var (
	docFlag = regexp.MustCompile("`--([a-z0-9-]+)")
	asOther = regexp.MustCompile(`^as (?:kvroute )?([a-z]+)$`)
)

// flagRows returns the rows of the flag tables in places: the rows whose
// first cell names flags.
func flagRows(t *testing.T, places []docPlace) []docRow {
	t.Helper()
	var rows []docRow
	for _, p := range places {
		data, err := os.ReadFile(filepath.Join("..", "..", p.file))
		if err != nil {
			t.Fatal(err)
		}
		text := string(data)
		if p.section != "" {
			_, after, ok := strings.Cut(text, "\n"+p.section+"\n")
			if !ok {
				t.Fatalf("%s has no section %q", p.file, p.section)
			}
			text, _, _ = strings.Cut(after, "\n## ")
		}
		defaultCol := -1
		for _, line := range strings.Split(text, "\n") {
			if !strings.HasPrefix(line, "|") {
				defaultCol = -1
				continue
			}
			cells := tableCells(line)
			if defaultCol == -1 { // a table's header
				defaultCol = len(cells)
				for i, c := range cells {
					if strings.EqualFold(c, "default") {
						defaultCol = i
					}
				}
				continue
			}
			var flags []string
			for _, m := range docFlag.FindAllStringSubmatch(cells[0], -1) {
				flags = append(flags, m[1])
			}
			if len(flags) == 0 {
				continue
			}
			row := docRow{place: p, flags: flags, hasDefault: defaultCol < len(cells)}
			if row.hasDefault {
				row.def = cells[defaultCol]
			}
			rows = append(rows, row)
		}
	}
	return rows
}

// tableCells splits a Markdown table row into its trimmed cells.
func tableCells(line string) []string {
	cells := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), "|")
	for i := range cells {
		cells[i] = strings.TrimSpace(cells[i])
	}
	return cells
}

// defaultPart is the default of the i-th of n flags in a default cell: one
// value for all, or one per flag, comma-separated.
func defaultPart(cell string, i, n int) string {
	parts := strings.Split(cell, ", ")
	if len(parts) == n {
		cell = parts[i]
	}
	cell = strings.TrimSpace(strings.ReplaceAll(cell, "`", ""))
	if j := strings.Index(cell, " ("); j > 0 {
		cell = cell[:j] // "0 (random)"
	}
	return cell
}

// sameDefault reports whether a table's default doc agrees with the one
// --help shows, help ("" when --help shows none, the zero value: then the
// table may say it in words, "none" or "the profile's", but not give
// another value).
func sameDefault(doc, help string) bool {
	d, h := normalize(doc), normalize(help)
	if h == "" {
		return d == "" || d == "0" || d == "false" || !startsWithDigit(d) && d != "true"
	}
	return d == h
}

// normalize writes a default one way: durations as Go prints them, numbers
// without trailing zeros or thousands separators, on and off as true and
// false, and in lower case (slog prints its levels in capitals).
func normalize(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	if startsWithDigit(s) {
		s = strings.ReplaceAll(s, ",", "") // 10,000
	}
	switch s {
	case "on":
		return "true"
	case "off", "false":
		return "false"
	}
	unit := strings.NewReplacer(" min", "m", " s", "s", " ms", "ms", " h", "h")
	if d, err := time.ParseDuration(unit.Replace(s)); err == nil && !startsWithDigit(strings.TrimLeft(s, "0123456789.")) {
		if d == 0 {
			return "0"
		}
		return d.String()
	}
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		return fmt.Sprint(f)
	}
	return s
}

func startsWithDigit(s string) bool { return s != "" && s[0] >= '0' && s[0] <= '9' }
