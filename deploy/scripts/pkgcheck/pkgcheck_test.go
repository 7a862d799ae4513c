package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// names returns the distinct names of us, sorted.
func names(us []use) []string {
	var out []string
	for _, u := range firstUses(us) {
		out = append(out, u.name)
	}
	sort.Strings(out)
	return out
}

func scanFixture(t *testing.T, dir string) *scanner {
	t.Helper()
	s, err := scanRepo(filepath.Join("testdata", dir))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func sameSet(t *testing.T, what string, got, want []string) {
	t.Helper()
	sort.Strings(want)
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("%s:\n got  %v\n want %v", what, got, want)
	}
}

// The finding of issue 20: a script calls modinfo, the table maps it to
// kmod, and kmod is neither on the fresh machine nor installed by install-deps.
func TestModinfoWithoutKmodIsReported(t *testing.T) {
	var out, errb bytes.Buffer
	code := run(options{root: "testdata/modinfo", table: "packages.tsv", fresh: "fresh.txt",
		installDeps: "install-deps.sh", noDpkg: true}, &out, &errb)
	if code != 1 {
		t.Fatalf("exit %d, want 1; stdout %q stderr %q", code, out.String(), errb.String())
	}
	for _, want := range []string{
		"deps-check: command modinfo needs package kmod, which a fresh machine lacks and install-deps does not install\n",
		"deps-check: path /sbin/modinfo needs package kmod, which a fresh machine lacks and install-deps does not install\n",
	} {
		if !strings.Contains(errb.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, errb.String())
		}
	}
}

// A command with no row in the table is named with the place that calls it.
func TestCommandWithoutRowIsReported(t *testing.T) {
	var out, errb bytes.Buffer
	code := run(options{root: "testdata/modinfo", table: "packages-nomodinfo.tsv", fresh: "fresh.txt",
		installDeps: "install-deps.sh", noDpkg: true}, &out, &errb)
	want := "deps-check: command modinfo (called in build.sh:3) has no package in packages-nomodinfo.tsv\n"
	if code != 1 || !strings.Contains(errb.String(), want) {
		t.Fatalf("exit %d, stderr:\n%s\nwant the line %q", code, errb.String(), want)
	}
}

// With kmod installed by install-deps the same fixture is clean and prints one summary line.
func TestCleanWhenInstallDepsInstallsKmod(t *testing.T) {
	var out, errb bytes.Buffer
	code := run(options{root: "testdata/modinfo", table: "packages.tsv", fresh: "fresh.txt",
		installDeps: "install-deps-kmod.sh", noDpkg: true}, &out, &errb)
	if code != 0 || errb.Len() != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, errb.String())
	}
	if !strings.HasPrefix(out.String(), "deps-check: 3 commands, 2 fixed paths, 3 packages: all on a fresh machine or installed by install-deps") ||
		strings.Count(out.String(), "\n") != 1 {
		t.Fatalf("summary %q", out.String())
	}
}

// A table row nothing calls is reported (the table is the install list: a
// stale row installs a package for nothing).
func TestUnusedRowIsReported(t *testing.T) {
	var out, errb bytes.Buffer
	table := filepath.Join(t.TempDir(), "t.tsv")
	writeFile(t, table, "modinfo\tkmod\nsh\tdash\ntr\tcoreutils\nqemu-img\tqemu-utils\n")
	code := run(options{root: "testdata/modinfo", table: table, fresh: "fresh.txt",
		installDeps: "install-deps-kmod.sh", noDpkg: true}, &out, &errb)
	want := ":4: command qemu-img (qemu-utils) is called by nothing deps-check reads"
	if code != 1 || !strings.Contains(errb.String(), want) {
		t.Fatalf("exit %d, stderr:\n%s\nwant %q", code, errb.String(), want)
	}
}

// Go: commands reached through the repository's own wrappers, a named
// closure, ip netns exec, timeout, sh -c, LookPath over lists and appends.
// A name on a line marked deps-check:absent (no-such-tool in the fixture) is
// not a command the repository needs.
func TestGoWrappers(t *testing.T) {
	s := scanFixture(t, "gowrap")
	sameSet(t, "commands", names(s.cmds), []string{"arping", "cpio", "dnsmasq", "find", "ip", "ipmi_sim",
		"losetup", "mkfs.ext4", "modinfo", "ping", "qemu-system-x86_64", "sfdisk", "sh", "tcpdump", "timeout"})
	sameSet(t, "paths", names(s.paths), []string{"/sbin/modinfo"})
	if len(s.dynamic) != 1 || s.dynamic[0].name != "os.Args[0]" {
		t.Errorf("run-time commands %v, want os.Args[0] alone", s.dynamic)
	}
	for _, u := range s.cmds {
		if u.name == "tcpdump" && u.at() != "main.go:27" {
			t.Errorf("tcpdump found at %s, want the caller's literal at main.go:27", u.at())
		}
	}
}

// Shell: builtins, functions, here-documents, comments, case patterns and
// for-lists are no commands; $(...), backquotes, trap strings, xargs, find
// -exec and command -v are read.
func TestShellScan(t *testing.T) {
	s := scanFixture(t, "shell")
	sameSet(t, "commands", names(s.cmds), []string{"bash", "cat", "find", "gzip", "hostname", "kill", "ls",
		"mktemp", "rm", "sort", "touch", "uname", "xargs", "zstd"})
	if len(s.dynamic) != 1 || s.dynamic[0].name != "$DYN" {
		t.Errorf("run-time commands %v, want $DYN alone", s.dynamic)
	}
}

// Makefiles: recipes after make's own syntax, $(VAR) expansion, $(shell ...), SHELL.
func TestMakefileScan(t *testing.T) {
	s := scanFixture(t, "make")
	sameSet(t, "commands", names(s.cmds), []string{"bash", "cmp", "git", "go", "ls", "rm", "tar", "wc"})
}

// On a machine where dpkg knows /bin/sh, a table that maps sh to the wrong
// package is reported with what dpkg -S says.
func TestDpkgCrossCheck(t *testing.T) {
	if out, err := exec.Command("dpkg", "-S", "/bin/sh").Output(); err != nil || !strings.Contains(string(out), "dash") {
		t.Skip("needs dpkg knowing /bin/sh as dash's")
	}
	table := filepath.Join(t.TempDir(), "t.tsv")
	writeFile(t, table, "modinfo\tkmod\nsh\tcoreutils\ntr\tcoreutils\n")
	var out, errb bytes.Buffer
	code := run(options{root: "testdata/modinfo", table: table, fresh: "fresh.txt",
		installDeps: "install-deps-kmod.sh"}, &out, &errb)
	if code != 1 || !strings.Contains(errb.String(), "from package dash (dpkg -S), but "+table+" says coreutils") {
		t.Fatalf("exit %d, stderr:\n%s", code, errb.String())
	}
}

// The repository itself: every command it calls is covered (what make deps-check runs).
func TestRepositoryIsCovered(t *testing.T) {
	var out, errb bytes.Buffer
	code := run(options{root: "../../..", table: "deploy/scripts/packages.tsv", fresh: "deploy/scripts/fresh-packages.txt",
		installDeps: "deploy/scripts/install-deps.sh", noDpkg: true}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, errb.String())
	}
	t.Log(strings.TrimSpace(out.String()))
}

func writeFile(t *testing.T, p, s string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}
