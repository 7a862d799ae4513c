package main

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The provider talks to Kiln only through its API: outside test files, the
// only Kiln packages it imports are kiln/api (the view types) and
// kiln/api/client (the Go client), besides its own. (The appliance
// module's make depcheck does not see this module; this is its rule.)
func TestImportsOnlyKilnAPI(t *testing.T) {
	allowed := map[string]bool{"kiln/api": true, "kiln/api/client": true}
	n := 0
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return err
		}
		f, err := parser.ParseFile(token.NewFileSet(), p, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, im := range f.Imports {
			path, _ := strconv.Unquote(im.Path.Value)
			n++
			if (path == "kiln" || strings.HasPrefix(path, "kiln/")) && !allowed[path] && !strings.HasPrefix(path, "kiln/cmd/kiln-capi/") {
				t.Errorf("%s imports %s: the provider may import only kiln/api and kiln/api/client of Kiln's", p, path)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Fatal("no imports read")
	}
}
