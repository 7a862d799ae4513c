package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// rule is one row of the rules table (rules.go).
type rule struct {
	folder string   // module-relative folder: the row covers it and every package under it
	may    []string // patterns the row's non-test files may import
	tests  []string // patterns its test files may import besides may
}

// pkg is what `go list -json` reports of one package.
type pkg struct {
	Dir            string
	ImportPath     string
	Imports        []string
	TestImports    []string
	XTestImports   []string
	IgnoredGoFiles []string
	Error          *struct{ Err string }
}

// finding is one import (or package) against the rules.
type finding struct {
	pkg string // import path of the offending package
	msg string
}

func (f finding) String() string { return f.pkg + ": " + f.msg }

// check lists the Go packages of the module rooted at dir (`go list -e
// -json ./...`) and returns every import against rules, sorted by package, and the
// number of packages checked. Imports of files the build ignores (another
// GOOS, a build tag) are checked too, read from the files themselves. It
// returns an error when go list fails or reports a package it cannot read.
func check(dir string, rules []rule) ([]finding, int, error) {
	module, err := goOutput(dir, "list", "-m")
	if err != nil {
		return nil, 0, err
	}
	module = strings.TrimSpace(module)
	out, err := goOutput(dir, "list", "-e", "-json", "./...")
	if err != nil {
		return nil, 0, err
	}
	var pkgs []*pkg
	dec := json.NewDecoder(strings.NewReader(out))
	for dec.More() {
		p := new(pkg)
		if err := dec.Decode(p); err != nil {
			return nil, 0, fmt.Errorf("go list output: %w", err)
		}
		if p.Error != nil {
			return nil, 0, fmt.Errorf("%s: %s", p.ImportPath, p.Error.Err)
		}
		pkgs = append(pkgs, p)
	}
	byPath := map[string]*pkg{}
	for _, p := range pkgs {
		byPath[p.ImportPath] = p
	}
	rel := func(imp string) (string, bool) {
		if imp == module {
			return "", true
		}
		r, ok := strings.CutPrefix(imp, module+"/")
		return r, ok
	}
	var folders []string
	for _, r := range rules {
		if !strings.Contains(r.folder, "/") {
			folders = append(folders, r.folder)
		}
	}
	sort.Strings(folders)

	var found []finding
	for _, p := range pkgs {
		r, _ := rel(p.ImportPath)
		if r == "" {
			found = append(found, finding{p.ImportPath, "a package at the module root; Kiln's code lives in the folders of the rules table (" + strings.Join(folders, " ") + ")"})
			continue
		}
		row := rowFor(r, rules)
		if row == nil {
			top, _, _ := strings.Cut(r, "/")
			found = append(found, finding{p.ImportPath, fmt.Sprintf("top-level folder %q is not in the rules table of deploy/scripts/depcheck (%s): add a row saying what it may import, or move the package", top, strings.Join(folders, " "))})
			continue
		}
		prod, test, err := imports(p)
		if err != nil {
			return nil, 0, err
		}
		for _, imp := range prod {
			ir, ours := rel(imp)
			if ours && !permitted(ir, row.may) {
				found = append(found, finding{p.ImportPath, fmt.Sprintf("imports %s; %s may import %s", imp, row.folder, strings.Join(row.may, ", "))})
			}
		}
		// A test import the row's may allows is the production layering's
		// business: what it reaches is checked by its own row. One that only
		// the test patterns allow (a helper) must reach nothing outside
		// may+tests, so it cannot carry the test elsewhere.
		allowed := append(append([]string{}, row.may...), row.tests...)
		for _, imp := range test {
			if _, ours := rel(imp); !ours || imp == p.ImportPath {
				continue // the package under test is checked by its own imports
			}
			for _, bad := range outside(imp, byPath, rel, row) {
				how := "imports " + strings.Join(bad, ", which imports ")
				found = append(found, finding{p.ImportPath + " (test)", fmt.Sprintf("%s; tests of %s may import %s", how, row.folder, strings.Join(allowed, ", "))})
			}
		}
	}
	sort.Slice(found, func(i, j int) bool {
		if found[i].pkg != found[j].pkg {
			return found[i].pkg < found[j].pkg
		}
		return found[i].msg < found[j].msg
	})
	return found, len(pkgs), nil
}

// outside walks the module's packages that a test import imp reaches by
// non-test imports and returns, for each that row's may and tests do not
// allow, the chain of imports from imp to it. It does not descend into a
// package that row.may allows (its own row checks what that reaches).
func outside(imp string, byPath map[string]*pkg, rel func(string) (string, bool), row *rule) [][]string {
	var bad [][]string
	seen := map[string]bool{}
	var walk func(chain []string)
	walk = func(chain []string) {
		at := chain[len(chain)-1]
		if seen[at] {
			return
		}
		seen[at] = true
		r, ours := rel(at)
		switch {
		case !ours, permitted(r, row.may):
			return
		case !permitted(r, row.tests):
			bad = append(bad, append([]string{}, chain...))
			return
		}
		if p := byPath[at]; p != nil {
			for _, d := range p.Imports {
				walk(append(chain[:len(chain):len(chain)], d))
			}
		}
	}
	walk([]string{imp})
	return bad
}

// imports returns p's imports by its non-test and its test files, those the
// build ignores included.
func imports(p *pkg) (prod, test []string, err error) {
	prod = append(prod, p.Imports...)
	test = append(append(test, p.TestImports...), p.XTestImports...)
	fset := token.NewFileSet()
	for _, name := range p.IgnoredGoFiles {
		f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, parser.ImportsOnly)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", p.ImportPath, err)
		}
		for _, is := range f.Imports {
			path, err := strconv.Unquote(is.Path.Value)
			if err != nil {
				return nil, nil, fmt.Errorf("%s: %s: %w", p.ImportPath, name, err)
			}
			if strings.HasSuffix(name, "_test.go") {
				test = append(test, path)
			} else {
				prod = append(prod, path)
			}
		}
	}
	return prod, test, nil
}

// rowFor returns the row with the longest folder covering the
// module-relative package path r, or nil.
func rowFor(r string, rules []rule) *rule {
	var best *rule
	for i := range rules {
		f := rules[i].folder
		if (r == f || strings.HasPrefix(r, f+"/")) && (best == nil || len(f) > len(best.folder)) {
			best = &rules[i]
		}
	}
	return best
}

// permitted reports whether the module-relative import path r matches one
// of patterns ("x" is x alone, "x/..." is x and everything under it).
func permitted(r string, patterns []string) bool {
	for _, p := range patterns {
		if base, ok := strings.CutSuffix(p, "/..."); ok {
			if r == base || strings.HasPrefix(r, base+"/") {
				return true
			}
		} else if r == p {
			return true
		}
	}
	return false
}

// goOutput runs the go command in dir and returns its standard output.
func goOutput(dir string, args ...string) (string, error) {
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return "", fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, stderr.Bytes())
		}
		return "", fmt.Errorf("go %s: %w", strings.Join(args, " "), err)
	}
	return string(out), nil
}
