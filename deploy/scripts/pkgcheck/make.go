package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// Makefiles: each recipe line (a line starting with a tab) is shell text once
// make's own syntax is taken off: the leading @ - +, $$ (a shell $), and
// $(VAR) references, expanded from the files' simple assignments
// (NAME = | := | ?= VALUE) where known and left as run-time words where not.
// $(shell ...) anywhere is shell text too.

var makeAssign = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_]*)\s*(\?=|:=|::=|=)\s*(.*)$`)

func scanMakefiles(s *scanner, root string, files []string) error {
	type line struct {
		text string
		n    int
	}
	vars := map[string]string{}
	texts := map[string][]line{}
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			return err
		}
		var ls []line
		raw := strings.Split(string(b), "\n")
		for i := 0; i < len(raw); i++ {
			l, n := raw[i], i+1
			for strings.HasSuffix(l, "\\") && i+1 < len(raw) {
				i++
				l = strings.TrimSuffix(l, "\\") + " " + strings.TrimLeft(raw[i], "\t")
			}
			ls = append(ls, line{l, n})
			if m := makeAssign.FindStringSubmatch(l); m != nil && !strings.HasPrefix(l, "\t") {
				if _, set := vars[m[1]]; !set || m[2] != "?=" {
					vars[m[1]] = m[3]
				}
			}
		}
		texts[f] = ls
	}
	for _, f := range files {
		for _, l := range texts[f] {
			if m := makeAssign.FindStringSubmatch(l.text); m != nil && m[1] == "SHELL" {
				s.addCmd(f, l.n, strings.TrimSpace(m[3])) // make runs every recipe with it
			}
			if strings.HasPrefix(l.text, "\t") {
				r := strings.TrimLeft(strings.TrimPrefix(l.text, "\t"), "@-+ ")
				s.scanShell(f, expandMake(s, f, l.n, r, vars, 0), l.n)
				continue
			}
			expandMake(s, f, l.n, l.text, vars, 0) // for its $(shell ...)
		}
	}
	return nil
}

// expandMake expands make references in t; $(shell X) scans X as shell and
// becomes a run-time word; unknown variables become run-time words.
func expandMake(s *scanner, file string, n int, t string, vars map[string]string, depth int) string {
	var b strings.Builder
	for i := 0; i < len(t); i++ {
		if t[i] != '$' || i+1 >= len(t) {
			b.WriteByte(t[i])
			continue
		}
		c := t[i+1]
		if c == '$' {
			b.WriteByte('$')
			i++
			continue
		}
		if c != '(' && c != '{' {
			b.WriteString("${_make}") // $@, $<, $X
			i++
			continue
		}
		close := byte(')')
		if c == '{' {
			close = '}'
		}
		depthP, j := 0, i+1
		for ; j < len(t); j++ {
			if t[j] == c {
				depthP++
			} else if t[j] == close {
				depthP--
				if depthP == 0 {
					break
				}
			}
		}
		inner := t[i+2 : min(j, len(t))]
		i = j
		if strings.HasPrefix(inner, "shell ") {
			s.scanShell(file, expandMake(s, file, n, inner[len("shell "):], vars, depth+1), n)
			b.WriteString("${_make}")
			continue
		}
		if v, ok := vars[inner]; ok && depth < 8 {
			b.WriteString(expandMake(s, file, n, v, vars, depth+1))
			continue
		}
		// a function such as $(abspath x): scan its arguments for $(shell) only
		expandMake(s, file, n, inner, vars, depth+1)
		b.WriteString("${_make}")
	}
	return b.String()
}
