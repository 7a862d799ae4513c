// Command pkgcheck (make deps-check) proves that a fresh machine can run the
// project's scripts, build and tests once deploy/scripts/install-deps.sh has
// run. It finds every external command the repository calls:
//
//   - Go: the command given to exec.Command, exec.CommandContext and
//     exec.LookPath, through local variables, literal lists, append and the
//     repository's own wrappers (run(t, "ip", ...), l.Command(ctx, ns, "curl")),
//     and what `ip netns exec NS CMD`, `timeout N CMD`, `sh -c SCRIPT` run;
//   - shell scripts (*.sh and files with a #!...sh line), Makefiles (*.mk,
//     Makefile recipes and $(shell ...)): every simple command;
//   - fixed absolute paths of programs and package files (/sbin/modinfo,
//     /bin/busybox, /usr/share/OVMF/...), in Go string literals and shell words.
//
// Each must have a row in the package table (deploy/scripts/packages.tsv), and
// its package must be on a fresh machine (deploy/scripts/fresh-packages.txt)
// or be installed by install-deps (what `install-deps.sh --list` prints). On
// a machine where a command or path is present, the table is checked against
// dpkg -S. Shell builtins, the script's own functions and Go's own tools (go,
// gofmt) need no package. Code that runs inside the in-RAM environment (its
// /init, udhcpc script and kiln-agent's non-test code, busybox only) is not a
// host dependency and is not read.
//
// It cannot see a command whose name is only known at run time (a variable
// not traced to a literal, a path built with filepath.Join, a qemu command
// line read from a file); those are counted and listed with -v.
//
// Exit status: 0 clean, 1 findings (each a "deps-check: ..." line), 2 usage
// or I/O errors.
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// guest lists what runs inside the in-RAM environment, not on the host:
// files (relative to the root), or directories whose non-test Go code is guest code.
var guestFiles = set("deploy/env/init", "deploy/env/udhcpc.script",
	"deploy/lab/labos/files/initramfs-init", "deploy/lab/labos/files/root-init", "deploy/lab/labos/files/udhcpc.script")
var guestGoDirs = []string{"cmd/kiln-agent", "cmd/kiln-firstboot"}

// goTools come with the Go toolchain, not a Debian package.
var goTools = set("go", "gofmt")

// skipDirs are never read: VCS data, test fixtures, build output.
var skipDirs = set(".git", "testdata", "build", "bin", "node_modules", "vendor")

type options struct {
	root, table, fresh, installDeps string
	verbose, noDpkg                 bool
}

func main() {
	var o options
	flag.StringVar(&o.root, "root", ".", "repository to scan")
	flag.StringVar(&o.table, "table", "deploy/scripts/packages.tsv", "package table (relative to -root unless absolute)")
	flag.StringVar(&o.fresh, "fresh", "deploy/scripts/fresh-packages.txt", "packages a fresh machine has (relative to -root unless absolute)")
	flag.StringVar(&o.installDeps, "install-deps", "deploy/scripts/install-deps.sh", "install script; run with --list for what it installs")
	flag.BoolVar(&o.verbose, "v", false, "list every command, its package and first use, and the calls not resolved")
	flag.BoolVar(&o.noDpkg, "no-dpkg", false, "skip the cross-check against this machine's dpkg database")
	flag.Parse()
	os.Exit(run(o, os.Stdout, os.Stderr))
}

func rel(root, p string) string {
	if filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(root, p)
}

// run checks and prints; it returns the exit status.
func run(o options, stdout, stderr io.Writer) int {
	table, err := readTable(rel(o.root, o.table))
	if err != nil {
		fmt.Fprintln(stderr, "deps-check:", err)
		return 2
	}
	fresh, err := readFresh(rel(o.root, o.fresh))
	if err != nil {
		fmt.Fprintln(stderr, "deps-check:", err)
		return 2
	}
	installs, err := installList(o.root, rel(o.root, o.installDeps))
	if err != nil {
		fmt.Fprintln(stderr, "deps-check:", err)
		return 2
	}
	s, err := scanRepo(o.root)
	if err != nil {
		fmt.Fprintln(stderr, "deps-check:", err)
		return 2
	}
	tableName := o.table
	var findings []string
	bad := func(f string, a ...any) { findings = append(findings, fmt.Sprintf("deps-check: "+f, a...)) }

	// first use of each command and path
	cmds, paths := firstUses(s.cmds), firstUses(s.paths)
	pkgs := map[string]bool{}
	used := map[string]bool{}
	checkPkg := func(what, name string, r row) {
		used[r.name] = true
		if r.pkg == "-" {
			return
		}
		pkgs[r.pkg] = true
		if !fresh[r.pkg] && !installs[r.pkg] {
			bad("%s %s needs package %s, which a fresh machine lacks and install-deps does not install", what, name, r.pkg)
		}
	}
	var cmdNames []string
	for _, u := range cmds {
		if goTools[u.name] {
			continue
		}
		cmdNames = append(cmdNames, u.name)
		r, ok := table[u.name]
		if !ok {
			bad("command %s (called in %s) has no package in %s", u.name, u.at(), tableName)
			continue
		}
		checkPkg("command", u.name, r)
	}
	for _, u := range paths {
		r, ok := table[u.name]
		if !ok && isBinPath(u.name) {
			r, ok = table[path.Base(u.name)]
		}
		if !ok {
			bad("path %s (used in %s) has no package in %s", u.name, u.at(), tableName)
			continue
		}
		checkPkg("path", u.name, r)
	}
	// path rows are files a program opens by itself (qemu's firmware): always needed
	for _, r := range table {
		if strings.HasPrefix(r.name, "/") && !used[r.name] {
			checkPkg("path", r.name, r)
		}
	}

	// a command row nothing calls is a rule with no reason: it would install a package for nothing
	for _, r := range table {
		if !strings.HasPrefix(r.name, "/") && !used[r.name] {
			bad("%s:%d: command %s (%s) is called by nothing deps-check reads: remove the row, or name a path the package provides", tableName, r.line, r.name, r.pkg)
		}
	}

	dpkgNote := "dpkg cross-check skipped"
	if !o.noDpkg {
		var fs []string
		fs, dpkgNote = crossCheck(table, cmds, paths, tableName)
		findings = append(findings, fs...)
	}

	if o.verbose {
		for _, u := range cmds {
			r := table[u.name]
			fmt.Fprintf(stdout, "command %-20s %-18s %-8s %s\n", u.name, r.pkg, where(r.pkg, fresh, installs, goTools[u.name]), u.at())
		}
		for _, u := range paths {
			fmt.Fprintf(stdout, "path    %-40s %s\n", u.name, u.at())
		}
		for _, u := range s.dynamic {
			fmt.Fprintf(stdout, "run-time command %q at %s: not checked\n", u.name, u.at())
		}
	}
	if len(findings) > 0 {
		sort.Strings(findings)
		for _, f := range findings {
			fmt.Fprintln(stderr, f)
		}
		fmt.Fprintf(stderr, "deps-check: %d findings\n", len(findings))
		return 1
	}
	fmt.Fprintf(stdout, "deps-check: %d commands, %d fixed paths, %d packages: all on a fresh machine or installed by install-deps; %s; %d calls name their command only at run time (not checked; -v lists them)\n",
		len(cmdNames), len(paths), len(pkgs), dpkgNote, len(s.dynamic))
	return 0
}

func where(pkg string, fresh, installs map[string]bool, goTool bool) string {
	switch {
	case goTool:
		return "go"
	case fresh[pkg]:
		return "fresh"
	case installs[pkg]:
		return "install"
	}
	return "MISSING"
}

func isBinPath(p string) bool {
	switch path.Dir(p) {
	case "/bin", "/sbin", "/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin":
		return true
	}
	return false
}

// firstUses keeps the first use of each name, in scan order.
func firstUses(us []use) []use {
	seen := map[string]bool{}
	var out []use
	for _, u := range us {
		if !seen[u.name] {
			seen[u.name] = true
			out = append(out, u)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// installList runs `script --list` and returns the packages it prints.
func installList(root, script string) (map[string]bool, error) {
	if abs, err := filepath.Abs(script); err == nil {
		script = abs
	}
	cmd := exec.Command(script, "--list")
	cmd.Dir = root
	var errb bytes.Buffer
	cmd.Stderr = &errb
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list: %v: %s", script, err, bytes.TrimSpace(errb.Bytes()))
	}
	m := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if f := strings.TrimSpace(sc.Text()); f != "" {
			m[f] = true
		}
	}
	return m, nil
}

// scanRepo reads every Go file, shell script and Makefile under root.
func scanRepo(root string) (*scanner, error) {
	s := &scanner{}
	g := newGoScan(s, modulePath(root))
	var makefiles []string
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		r, _ := filepath.Rel(root, p)
		r = filepath.ToSlash(r)
		if d.IsDir() {
			if r != "." && skipDirs[d.Name()] {
				return filepath.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() || guestFiles[r] {
			return nil
		}
		name := d.Name()
		switch {
		case strings.HasSuffix(name, ".go"):
			for _, gd := range guestGoDirs {
				if strings.HasPrefix(r, gd+"/") && !strings.HasSuffix(name, "_test.go") {
					return nil
				}
			}
			src, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return g.addFile(r, src)
		case name == "Makefile" || name == "GNUmakefile" || strings.HasSuffix(name, ".mk"):
			makefiles = append(makefiles, r)
		default:
			src, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if isShell(name, src) {
				s.script(r, string(src), 1)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	g.run()
	if err := scanMakefiles(s, root, makefiles); err != nil {
		return nil, err
	}
	return s, nil
}

// isShell reports a shell script: *.sh, or a first line #!.../sh, bash or dash.
func isShell(name string, src []byte) bool {
	if strings.HasSuffix(name, ".sh") || strings.HasSuffix(name, ".bash") {
		return true
	}
	if !bytes.HasPrefix(src, []byte("#!")) {
		return false
	}
	first, _, _ := bytes.Cut(src, []byte("\n"))
	f := strings.Fields(string(first[2:]))
	if len(f) == 0 {
		return false
	}
	interp := path.Base(f[0])
	if interp == "env" && len(f) > 1 {
		interp = f[1]
	}
	return interp == "sh" || interp == "bash" || interp == "dash"
}

// modulePath reads the module line of root/go.mod.
func modulePath(root string) string {
	b, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		return ""
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == "module" {
			return f[1]
		}
	}
	return ""
}
