package main

import (
	"bytes"
	"strings"
	"testing"
)

// The fixture trees under testdata are modules named kiln, checked against
// the real rules table.

func TestCleanTreePasses(t *testing.T) {
	found, n, err := check("testdata/clean", rules)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range found {
		t.Errorf("clean tree: %s", f)
	}
	if n != 22 {
		t.Errorf("checked %d packages, want the fixture's 22", n)
	}
}

func TestUnknownFolderFails(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"-C", "testdata/unknown"}, &out, &errOut); code != 1 {
		t.Fatalf("exit status %d, want 1\nstdout:\n%s\nstderr:\n%s", code, &out, &errOut)
	}
	want := `depcheck: kiln/internal/testkit: top-level folder "internal" is not in the rules table`
	if !strings.Contains(out.String(), want) {
		t.Fatalf("output does not name the folder; want %q in:\n%s", want, &out)
	}
	if n := strings.Count(out.String(), "\n"); n != 2 { // the finding and the summary
		t.Fatalf("want one finding, got:\n%s", &out)
	}
}

func TestForbiddenImportsFail(t *testing.T) {
	found, _, err := check("testdata/forbidden", rules)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct{ pkg, msg string }{
		{"kiln", "a package at the module root"},
		{"kiln/api", "imports kiln/appliance; api may import api/..., store, appliance/lifecycle/..."},
		{"kiln/appliance", "imports kiln/deploy/lab/testkit;"},
		{"kiln/bmc (test)", "imports kiln/deploy/lab/e2e, which imports kiln/appliance;"},
		{"kiln/bmc (test)", "imports kiln/deploy/lab/e2e, which imports kiln/store;"},
		{"kiln/cmd/kiln", "imports kiln/dhcp;"},
		{"kiln/cmd/kiln-agent", "imports kiln/store; cmd/kiln-agent may import cmd/kiln-agent/..., api/agentapi"},
		{"kiln/deploy/lab/e2e", "imports kiln/appliance;"},
		{"kiln/deploy/lab/e2e", "imports kiln/store; deploy/lab/e2e may import deploy/lab/..., api/..., cmd/kiln-agent/agent"},
		{"kiln/dhcp", "imports kiln/store; dhcp may import dhcp/..."},
		{"kiln/httpboot", "imports kiln/store;"}, // from httpboot_windows.go, which this build ignores
		{"kiln/tftp (test)", "imports kiln/store; tests of tftp may import tftp/..., deploy/lab/..."},
	}
	var got []string
	for _, f := range found {
		got = append(got, f.String())
	}
	if len(found) != len(want) {
		t.Fatalf("%d findings, want %d:\n%s", len(found), len(want), strings.Join(got, "\n"))
	}
	for i, w := range want {
		if found[i].pkg != w.pkg || !strings.Contains(found[i].msg, w.msg) {
			t.Errorf("finding %d: %s\nwant %s: …%s…", i, found[i], w.pkg, w.msg)
		}
	}
}

func TestListErrorIsExit2(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"-C", "testdata/no-such-tree"}, &out, &errOut); code != 2 {
		t.Fatalf("exit status %d, want 2\n%s%s", code, &out, &errOut)
	}
}

func TestPermitted(t *testing.T) {
	for _, c := range []struct {
		imp  string
		pats []string
		ok   bool
	}{
		{"store", []string{"store"}, true},
		{"store/storetest", []string{"store"}, false},
		{"store/storetest", []string{"store/..."}, true},
		{"store", []string{"store/..."}, true},
		{"storex", []string{"store/..."}, false},
		{"appliance/lifecycle/rules", []string{"appliance/lifecycle/..."}, true},
		{"appliance/intake", []string{"appliance/lifecycle/..."}, false},
	} {
		if got := permitted(c.imp, c.pats); got != c.ok {
			t.Errorf("permitted(%q, %q) = %v, want %v", c.imp, c.pats, got, c.ok)
		}
	}
}

// TestRowsAreTheFixedFolders: the table's top-level rows are exactly the
// fixed top-level folders of top-level DESIGN.md "Parts and folders", and every other
// row refines one of them.
func TestRowsAreTheFixedFolders(t *testing.T) {
	fixed := map[string]bool{}
	for _, f := range []string{"cmd", "dhcp", "tftp", "httpboot", "bmc", "store", "api", "appliance", "deploy"} {
		fixed[f] = true
	}
	tops := map[string]bool{}
	for _, r := range rules {
		top, _, nested := strings.Cut(r.folder, "/")
		if !fixed[top] {
			t.Errorf("row %s: %s is not one of the fixed top-level folders", r.folder, top)
		}
		if !nested {
			tops[top] = true
		}
	}
	for f := range fixed {
		if !tops[f] {
			t.Errorf("no row for top-level folder %s", f)
		}
	}
}
