package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

// crossCheck compares the table with this machine: for each command the
// repository calls and each fixed path it uses, where the file is here and
// dpkg knows it, the owning package must be the table's. Where the table's
// package is installed here, the command must be in PATH and the path must
// exist. A file dpkg does not know (an alternatives link, a file made by
// hand) is not judged. It returns the findings and a note for the summary.
func crossCheck(table map[string]row, cmds, paths []use, tableName string) ([]string, string) {
	if _, err := exec.LookPath("dpkg-query"); err != nil {
		return nil, "no dpkg here: table not cross-checked"
	}
	var findings []string
	bad := func(f string, a ...any) { findings = append(findings, fmt.Sprintf("deps-check: "+f, a...)) }

	type item struct {
		what, name, file string // file: where it is on this machine
		r                row
		at               string
	}
	var items []item
	for _, u := range cmds {
		if r, ok := table[u.name]; ok && r.pkg != "-" {
			items = append(items, item{what: "command", name: u.name, r: r, at: u.at()})
		}
	}
	seen := map[string]bool{}
	for _, u := range paths {
		seen[u.name] = true
		r, ok := table[u.name]
		if !ok && isBinPath(u.name) {
			r, ok = table[filepath.Base(u.name)]
		}
		if ok && r.pkg != "-" {
			items = append(items, item{what: "path", name: u.name, file: u.name, r: r, at: u.at()})
		}
	}
	for _, r := range table {
		if strings.HasPrefix(r.name, "/") && !seen[r.name] && r.pkg != "-" {
			items = append(items, item{what: "path", name: r.name, file: r.name, r: r, at: fmt.Sprintf("%s:%d", tableName, r.line)})
		}
	}
	sort.Slice(items, func(i, j int) bool { return items[i].name < items[j].name })

	installed := installedPkgs(table)
	pathEnv := os.Getenv("PATH") + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	var ask []string
	cands := make([][]string, len(items))
	for i := range items {
		it := &items[i]
		if it.what == "command" {
			it.file = lookPath(it.name, pathEnv)
			if it.file == "" {
				if installed[it.r.pkg] {
					bad("command %s (called in %s) is not in PATH, though its package %s is installed: wrong package in %s?", it.name, it.at, it.r.pkg, tableName)
				}
				continue
			}
		} else if _, err := os.Stat(it.file); err != nil {
			if installed[it.r.pkg] {
				bad("path %s (used in %s) does not exist, though its package %s is installed", it.name, it.at, it.r.pkg)
			}
			continue
		}
		cands[i] = candidates(it.file)
		ask = append(ask, cands[i]...)
	}
	owners := dpkgOwners(ask)
	agree, known := 0, 0
	for i, it := range items {
		for _, c := range cands[i] {
			o, ok := owners[c]
			if !ok {
				continue
			}
			known++
			if o[it.r.pkg] {
				agree++
			} else {
				var names []string
				for p := range o {
					names = append(names, p)
				}
				sort.Strings(names)
				bad("%s %s is %s from package %s (dpkg -S), but %s says %s", it.what, it.name, c, strings.Join(names, ", "), tableName, it.r.pkg)
			}
			break
		}
	}
	return findings, fmt.Sprintf("dpkg -S agrees on %d of %d here (%d not here or unknown to dpkg)", agree, known, len(items)-known)
}

// candidates are the names dpkg may know a file by: as given, with /usr
// added or taken off (merged /usr), and the file a symbolic link leads to.
func candidates(p string) []string {
	out := []string{p}
	toggle := func(p string) string {
		if strings.HasPrefix(p, "/usr/") {
			return strings.TrimPrefix(p, "/usr")
		}
		return "/usr" + p
	}
	out = append(out, toggle(p))
	if r, err := filepath.EvalSymlinks(p); err == nil && r != p {
		out = append(out, r, toggle(r))
	}
	return out
}

func lookPath(name, pathEnv string) string {
	for _, d := range filepath.SplitList(pathEnv) {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	return ""
}

// installedPkgs asks dpkg-query which of the table's packages are installed.
func installedPkgs(table map[string]row) map[string]bool {
	set := map[string]bool{}
	var names []string
	for _, r := range table {
		if r.pkg != "-" && !set[r.pkg] {
			set[r.pkg] = true
			names = append(names, r.pkg)
		}
	}
	out, _ := exec.Command("dpkg-query", append([]string{"-W", "-f", "${Package}\t${db:Status-Abbrev}\n"}, names...)...).Output()
	m := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Split(sc.Text(), "\t")
		if len(f) == 2 && strings.HasPrefix(f[1], "ii") {
			m[f[0]] = true
		}
	}
	return m
}

// dpkgOwners runs one dpkg -S for all paths and returns path -> packages.
// dpkg -S exits 1 when some path is unknown; the known ones are still printed.
func dpkgOwners(paths []string) map[string]map[string]bool {
	m := map[string]map[string]bool{}
	if len(paths) == 0 {
		return m
	}
	out, _ := exec.Command("dpkg", append([]string{"-S"}, paths...)...).Output()
	want := map[string]bool{}
	for _, p := range paths {
		want[p] = true
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "diversion by") {
			continue
		}
		pk, p, ok := strings.Cut(l, ": ")
		if !ok || !want[p] {
			continue
		}
		if m[p] == nil {
			m[p] = map[string]bool{}
		}
		for _, x := range strings.Split(pk, ", ") {
			x, _, _ = strings.Cut(x, ":") // pkg:amd64
			m[p][x] = true
		}
	}
	return m
}
