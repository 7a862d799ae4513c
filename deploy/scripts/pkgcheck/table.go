package main

import (
	"bufio"
	"fmt"
	"os"
	"strings"
)

// row is one line of the package table: a command or an absolute path, and
// the Debian package that provides it ("-" for a path the scripts create).
type row struct {
	name, pkg, note string
	line            int
}

// readTable reads the table: NAME<TAB>PACKAGE[<TAB>NOTE] lines; '#' starts a
// comment line; blank lines are skipped. A name listed twice is an error.
func readTable(path string) (map[string]row, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	rows := map[string]row{}
	sc := bufio.NewScanner(f)
	n := 0
	for sc.Scan() {
		n++
		l := sc.Text()
		if strings.TrimSpace(l) == "" || strings.HasPrefix(l, "#") {
			continue
		}
		fs := strings.Split(l, "\t")
		if len(fs) < 2 || fs[0] == "" || fs[1] == "" {
			return nil, fmt.Errorf("%s:%d: want NAME<TAB>PACKAGE[<TAB>NOTE], got %q", path, n, l)
		}
		r := row{name: fs[0], pkg: fs[1], line: n}
		if len(fs) > 2 {
			r.note = fs[2]
		}
		if old, dup := rows[r.name]; dup {
			return nil, fmt.Errorf("%s:%d: %s listed again (first on line %d)", path, n, r.name, old.line)
		}
		rows[r.name] = r
	}
	return rows, sc.Err()
}

// readFresh reads the fresh-machine list: one package a line (a version may
// follow after a tab; an architecture suffix such as ":amd64" is dropped);
// '#' starts a comment line.
func readFresh(path string) (map[string]bool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	m := map[string]bool{}
	for _, l := range strings.Split(string(b), "\n") {
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		name, _, _ := strings.Cut(l, "\t")
		name, _, _ = strings.Cut(name, ":")
		m[strings.TrimSpace(name)] = true
	}
	return m, nil
}
