package main

import (
	"fmt"
	"path"
	"strings"
)

// use is one place that runs or looks up a command, or names a fixed path.
type use struct {
	name string // command name, or an absolute path
	file string
	line int
}

func (u use) at() string { return fmt.Sprintf("%s:%d", u.file, u.line) }

// scanner collects what the repository calls.
type scanner struct {
	cmds    []use                      // commands (base names; an absolute command path is also in paths)
	paths   []use                      // fixed absolute paths of programs and files
	dynamic []use                      // calls whose command is built at run time (name holds the text)
	shFuncs map[string]map[string]bool // shell functions defined per file
	dynSeen map[string]bool
	// absent holds FILE:LINE of lines marked `deps-check:absent`: a name a
	// test uses because no package provides it (a missing-tool test).
	absent map[string]bool
}

func (s *scanner) addDyn(u use) {
	if s.dynSeen == nil {
		s.dynSeen = map[string]bool{}
	}
	if k := u.at() + " " + u.name; !s.dynSeen[k] {
		s.dynSeen[k] = true
		s.dynamic = append(s.dynamic, u)
	}
}

func (s *scanner) addCmd(file string, line int, name string) {
	if s.absent[fmt.Sprintf("%s:%d", file, line)] {
		return
	}
	if strings.HasPrefix(name, "/") {
		s.paths = append(s.paths, use{name, file, line})
		name = path.Base(name)
	} else if strings.Contains(name, "/") {
		return // a path inside the repository (bin/kiln, deploy/env/build.sh): ours
	}
	if name == "" {
		return
	}
	s.cmds = append(s.cmds, use{name, file, line})
}

// argv interprets one command line: w[0] is the command. shell says w is a
// shell simple command (builtins and the file's functions need no package);
// commands that run another command (ip netns exec, timeout, xargs, find
// -exec, sh -c, ...) have that command read too.
func (s *scanner) argv(file string, w []shWord, shell bool, funcs map[string]bool) {
	var args []shWord
	for _, x := range w { // redirections are operators and already gone; drop any left
		if !x.op {
			args = append(args, x)
		}
	}
	w = args
	if len(w) == 0 {
		return
	}
	if w[0].file != "" {
		file = w[0].file
	}
	if w[0].dyn {
		s.addDyn(use{w[0].show(), file, w[0].line})
		return
	}
	name, line := w[0].text, w[0].line
	rest := w[1:]
	lit := func(i int) string {
		if i < len(rest) && !rest[i].dyn {
			return rest[i].text
		}
		return ""
	}
	if shell && (shellBuiltins[name] || funcs[name]) {
		switch name {
		case "exec":
			s.argv(file, rest, false, funcs)
		case "command":
			if v := lit(0); v == "-v" || v == "-V" {
				for _, x := range rest[1:] {
					s.lookup(file, x)
				}
			} else {
				s.argv(file, rest, true, funcs)
			}
		case "trap":
			if len(rest) >= 2 && lit(0) != "-" && !strings.HasPrefix(lit(0), "-") {
				s.scanShell(file, rest[0].text, rest[0].line)
			}
		}
		return
	}
	s.addCmd(file, line, name)
	for _, x := range rest {
		if !x.dyn && fixedPath.MatchString(x.text) {
			s.paths = append(s.paths, use{x.text, file, x.line})
		}
	}
	base := path.Base(name)
	// skipOpts returns the index of the first argument that is no option;
	// withVal lists options that take a separate value.
	skipOpts := func(from int, withVal ...string) int {
		i := from
		for i < len(rest) && strings.HasPrefix(rest[i].text, "-") && rest[i].text != "-" {
			if rest[i].text == "--" {
				return i + 1
			}
			takes := false
			for _, o := range withVal {
				if rest[i].text == o {
					takes = true
				}
			}
			i++
			if takes {
				i++
			}
		}
		return i
	}
	from := func(i int) []shWord {
		if i < len(rest) {
			return rest[i:]
		}
		return nil
	}
	switch base {
	case "ip":
		if lit(0) == "netns" && lit(1) == "exec" && len(rest) > 3 {
			s.argv(file, rest[3:], false, funcs)
		}
	case "timeout":
		i := skipOpts(0, "-s", "-k", "--signal", "--kill-after")
		s.argv(file, from(i+1), false, funcs)
	case "setsid", "nohup", "stdbuf", "unshare":
		s.argv(file, from(skipOpts(0, "-o", "-e", "-i")), false, funcs)
	case "nice", "ionice":
		s.argv(file, from(skipOpts(0, "-n", "-c")), false, funcs)
	case "chroot":
		s.argv(file, from(skipOpts(0)+1), false, funcs)
	case "env":
		i := skipOpts(0, "-u", "-C", "-S")
		for i < len(rest) && isAssignment(rest[i].text) {
			i++
		}
		s.argv(file, from(i), false, funcs)
	case "xargs":
		s.argv(file, from(skipOpts(0, "-I", "-n", "-P", "-L", "-s", "-a", "-d", "-E")), false, funcs)
	case "flock":
		i := skipOpts(0, "-w", "-E", "--timeout", "--conflict-exit-code")
		if i+1 < len(rest) && (lit(i+1) == "-c" || lit(i+1) == "--command") && i+2 < len(rest) {
			s.scanShell(file, rest[i+2].text, rest[i+2].line)
		} else if !isDigits(lit(i)) {
			s.argv(file, from(i+1), false, funcs)
		}
	case "find":
		for i := 0; i < len(rest); i++ {
			switch rest[i].text {
			case "-exec", "-execdir", "-ok", "-okdir":
				j := i + 1
				for j < len(rest) && rest[j].text != ";" && rest[j].text != "+" {
					j++
				}
				s.argv(file, rest[i+1:j], false, funcs)
				i = j
			}
		}
	case "sh", "bash", "dash":
		for i := 0; i < len(rest); i++ {
			if rest[i].text == "-c" && i+1 < len(rest) {
				s.scanShell(file, rest[i+1].text, rest[i+1].line)
				break
			}
		}
	case "which":
		for _, x := range rest {
			if !strings.HasPrefix(x.text, "-") {
				s.lookup(file, x)
			}
		}
	}
}

// script reads a whole shell script starting at line: its #! interpreter
// and its commands.
func (s *scanner) script(file, src string, line int) {
	if strings.HasPrefix(src, "#!") {
		first, _, _ := strings.Cut(src[2:], "\n")
		f := strings.Fields(first)
		if len(f) > 0 {
			w := []shWord{{text: f[0], line: line}}
			for _, a := range f[1:] {
				w = append(w, shWord{text: a, line: line})
			}
			s.argv(file, w, false, nil) // #!/usr/bin/env bash: env, then bash
		}
	}
	s.scanShell(file, src, line)
}

// lookup records a command that is only looked up in PATH (exec.LookPath,
// command -v, which).
func (s *scanner) lookup(file string, w shWord) {
	if w.file != "" {
		file = w.file
	}
	if w.dyn {
		s.addDyn(use{w.show(), file, w.line})
		return
	}
	s.addCmd(file, w.line, w.text)
}
