package appliance

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestEveryMetricIsDocumented keeps README.md's metrics table in step with the
// code: every metric name registered anywhere in the project (a "kiln_…"
// string literal in non-test Go source) must appear in the README.
func TestEveryMetricIsDocumented(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	name := regexp.MustCompile(`"(kiln_[a-z0-9_]+)"`)
	found := map[string]string{}
	err = filepath.WalkDir("..", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "build" || d.Name() == "deploy") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range name.FindAllStringSubmatch(string(b), -1) {
			if !strings.HasSuffix(m[1], "_") { // a prefix, not a name
				found[m[1]] = p
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(found) < 20 {
		t.Fatalf("found only %d metric names; the scan is broken", len(found))
	}
	for n, file := range found {
		if !strings.Contains(string(readme), "`"+n) {
			t.Errorf("metric %s (registered in %s) is not in README.md's metrics table", n, file)
		}
	}
}
