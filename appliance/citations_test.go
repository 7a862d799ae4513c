package appliance

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDesignCitationsResolve keeps the design documents and the code that
// cites them in step: every mention of a DESIGN.md in the repository's Go and
// Markdown files must name a file that exists and, where quoted section names
// follow it, headings that exist in that file. "top-level DESIGN.md" is the
// one beside README.md; a path from the repository root names that file; a
// bare "DESIGN.md" (or "this directory's DESIGN.md") is the one in the citing
// file's own directory.
func TestDesignCitationsResolve(t *testing.T) {
	root := ".."
	cite := regexp.MustCompile(`(top-level |this directory's |([A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)*)/)?DESIGN\.md((?:,?\s+(?:and\s+)?"[^"\n]{1,80}")*)`)
	quoted := regexp.MustCompile(`"([^"]+)"`)
	headings := map[string]map[string]bool{} // file → heading texts; nil map: no such file
	heads := func(rel string) map[string]bool {
		if h, ok := headings[rel]; ok {
			return h
		}
		b, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			headings[rel] = nil
			return nil
		}
		h := map[string]bool{}
		for _, l := range strings.Split(string(b), "\n") {
			if t := strings.TrimLeft(l, "#"); len(t) < len(l) && strings.HasPrefix(t, " ") {
				h[strings.TrimSpace(strings.ReplaceAll(t, "`", ""))] = true
			}
		}
		headings[rel] = h
		return h
	}
	n := 0
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "build", "bin", "testdata":
				return filepath.SkipDir
			}
			return nil
		}
		ext := filepath.Ext(p)
		if ext != ".go" && ext != ".md" {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		text := strings.ReplaceAll(strings.ReplaceAll(string(b), "`", ""), "\n", " ")
		if ext == ".go" {
			// Comments only, each group as one line: a citation may wrap.
			f, err := parser.ParseFile(token.NewFileSet(), p, b, parser.ParseComments)
			if err != nil {
				return err
			}
			var cs []string
			for _, g := range f.Comments {
				cs = append(cs, strings.ReplaceAll(g.Text(), "\n", " "))
			}
			text = strings.Join(cs, " ")
		}
		for _, m := range cite.FindAllStringSubmatch(text, -1) {
			n++
			target := filepath.Join(filepath.Dir(rel), "DESIGN.md")
			switch {
			case m[1] == "top-level ":
				target = "DESIGN.md"
			case m[2] != "":
				target = filepath.Join(m[2], "DESIGN.md")
			}
			h := heads(target)
			if h == nil {
				t.Errorf("%s cites %s, which does not exist (%q)", rel, target, strings.TrimSpace(m[0]))
				continue
			}
			for _, q := range quoted.FindAllStringSubmatch(m[3], -1) {
				if !h[q[1]] {
					t.Errorf("%s cites %s section %q, which has no such heading", rel, target, q[1])
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 20 {
		t.Fatalf("found only %d citations; the scan is broken", n)
	}
}
