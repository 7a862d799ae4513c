package main

import (
	"strings"
)

// This file finds the commands a shell text runs. It is a scanner, not a full
// POSIX shell parser: it splits the text into simple commands (at ; & && || |
// newlines, parentheses, reserved words, command substitutions) and reads
// each command's first word after assignments and redirections. Quoting,
// $(...), `...`, ${...}, here-documents (skipped), comments, case patterns,
// for-lists, [[ ]] and (( )) are understood. A word with an expansion in it is
// dynamic: its command cannot be named, and it is counted as unresolved.

// shWord is one shell word: its text with quotes removed; dyn if part of it
// comes from an expansion (then text holds the expansion as written).
type shWord struct {
	text string
	dyn  bool
	line int
	op   bool   // an operator token: ; & && || | ( ) ;; newline, or a redirection
	file string // where the word is written, when not the file being read (Go wrappers)
	src  string // for a run-time word from Go: its expression
	// arith is a (( ... )) arithmetic command
	arith bool
}

// show is the word as -v prints it.
func (w shWord) show() string {
	if w.src != "" {
		return w.src
	}
	return w.text
}

// shLexer turns shell text into words and operators.
type shLexer struct {
	src   string
	i     int
	line  int
	toks  []shWord
	subs  []shSub // command substitutions and trap/-c strings to scan as shell
	heres []string
}

// shSub is shell text nested in a word: $(...) or `...`.
type shSub struct {
	text string
	line int
}

func lexShell(src string, line int) ([]shWord, []shSub) {
	lx := &shLexer{src: src, line: line}
	lx.run()
	return lx.toks, lx.subs
}

func (lx *shLexer) peek(k int) byte {
	if lx.i+k < len(lx.src) {
		return lx.src[lx.i+k]
	}
	return 0
}

func (lx *shLexer) emitOp(s string) {
	lx.toks = append(lx.toks, shWord{text: s, op: true, line: lx.line})
}

func (lx *shLexer) run() {
	for lx.i < len(lx.src) {
		c := lx.src[lx.i]
		switch {
		case c == '\\' && lx.peek(1) == '\n':
			lx.i += 2
			lx.line++
		case c == ' ' || c == '\t' || c == '\r':
			lx.i++
		case c == '\n':
			lx.emitOp("\n")
			lx.i++
			lx.line++
			lx.readHeredocs()
		case c == '#':
			for lx.i < len(lx.src) && lx.src[lx.i] != '\n' {
				lx.i++
			}
		case c == '(' && lx.peek(1) == '(': // (( arithmetic )): no command
			lx.toks = append(lx.toks, shWord{text: lx.balanced('(', ')'), line: lx.line, arith: true})
		case c == ';' || c == '&' || c == '|' || c == '(' || c == ')':
			two := lx.src[lx.i:min(lx.i+2, len(lx.src))]
			switch two {
			case ";;", "&&", "||", "|&", ";&":
				lx.emitOp(two)
				lx.i += 2
			default:
				if c == '&' && lx.peek(1) == '>' { // &> file
					lx.i += 2
					if lx.peek(0) == '>' {
						lx.i++
					}
					lx.emitOp(">")
					continue
				}
				lx.emitOp(string(c))
				lx.i++
			}
		case c == '<' || c == '>':
			lx.redirect()
		default:
			w := lx.word()
			// fd-numbered redirection: 2>file, 9>"$f"
			if !w.dyn && isDigits(w.text) && (lx.peek(0) == '<' || lx.peek(0) == '>') {
				lx.redirect()
				continue
			}
			lx.toks = append(lx.toks, w)
		}
	}
}

// redirect reads < > >> >& <& << <<- <<< and marks the next word as its target.
func (lx *shLexer) redirect() {
	start := lx.i
	for lx.i < len(lx.src) && strings.IndexByte("<>&|-", lx.src[lx.i]) >= 0 {
		// "<<-" and ">&" and ">|" belong to the operator; a lone "-" after >& (close fd) too
		lx.i++
		if lx.i-start >= 3 {
			break
		}
	}
	op := lx.src[start:lx.i]
	lx.emitOp(">")
	for lx.i < len(lx.src) && (lx.src[lx.i] == ' ' || lx.src[lx.i] == '\t') {
		lx.i++
	}
	if lx.i >= len(lx.src) || strings.IndexByte("\n;&|()", lx.src[lx.i]) >= 0 {
		return
	}
	w := lx.word()
	w.op = true // the target is no argument
	w.text = ">" + w.text
	lx.toks = append(lx.toks, w)
	if strings.HasPrefix(op, "<<") && !strings.HasPrefix(op, "<<<") {
		d := strings.Trim(w.text[1:], `'"\`)
		lx.heres = append(lx.heres, d)
	}
}

// readHeredocs skips the bodies of here-documents opened on the line just ended.
func (lx *shLexer) readHeredocs() {
	for _, d := range lx.heres {
		for lx.i < len(lx.src) {
			end := strings.IndexByte(lx.src[lx.i:], '\n')
			var l string
			if end < 0 {
				l, lx.i = lx.src[lx.i:], len(lx.src)
			} else {
				l, lx.i = lx.src[lx.i:lx.i+end], lx.i+end+1
			}
			lx.line++
			if strings.TrimLeft(l, "\t") == d {
				break
			}
		}
	}
	lx.heres = nil
}

// word reads one word, handling quotes, escapes and expansions.
func (lx *shLexer) word() shWord {
	w := shWord{line: lx.line}
	var b strings.Builder
	for lx.i < len(lx.src) {
		c := lx.src[lx.i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == ';' || c == '&' || c == '|' ||
			c == '<' || c == '>' || c == '(' || c == ')':
			if c == '(' && b.Len() > 0 && strings.HasSuffix(b.String(), "=") { // a=(x y): array
				b.WriteString(lx.balanced('(', ')'))
				w.dyn = true
				continue
			}
			w.text = b.String()
			return w
		case c == '\\':
			if lx.peek(1) == '\n' {
				lx.i += 2
				lx.line++
				continue
			}
			if lx.i+1 < len(lx.src) {
				b.WriteByte(lx.src[lx.i+1])
			}
			lx.i += 2
		case c == '\'':
			end := strings.IndexByte(lx.src[lx.i+1:], '\'')
			if end < 0 {
				end = len(lx.src) - lx.i - 1
			}
			s := lx.src[lx.i+1 : lx.i+1+end]
			lx.line += strings.Count(s, "\n")
			b.WriteString(s)
			lx.i += end + 2
		case c == '"':
			lx.i++
			for lx.i < len(lx.src) && lx.src[lx.i] != '"' {
				d := lx.src[lx.i]
				switch {
				case d == '\\' && lx.i+1 < len(lx.src):
					b.WriteByte(lx.src[lx.i+1])
					lx.i += 2
				case d == '$' || d == '`':
					b.WriteString(lx.expansion())
					w.dyn = true
				default:
					if d == '\n' {
						lx.line++
					}
					b.WriteByte(d)
					lx.i++
				}
			}
			lx.i++
		case c == '$' || c == '`':
			b.WriteString(lx.expansion())
			w.dyn = true
		default:
			b.WriteByte(c)
			lx.i++
		}
	}
	w.text = b.String()
	return w
}

// expansion reads $NAME, ${...}, $(...), $((...)) or `...` at lx.i and returns
// it as written; command substitutions are queued to be scanned as shell.
func (lx *shLexer) expansion() string {
	start, line := lx.i, lx.line
	if lx.src[lx.i] == '`' {
		end := strings.IndexByte(lx.src[lx.i+1:], '`')
		if end < 0 {
			end = len(lx.src) - lx.i - 1
		}
		body := lx.src[lx.i+1 : lx.i+1+end]
		lx.subs = append(lx.subs, shSub{text: body, line: line})
		lx.line += strings.Count(body, "\n")
		lx.i += end + 2
		return lx.src[start:min(lx.i, len(lx.src))]
	}
	lx.i++ // $
	switch lx.peek(0) {
	case '(':
		if lx.peek(1) == '(' { // arithmetic
			lx.balanced('(', ')')
			return lx.src[start:lx.i]
		}
		s := lx.balanced('(', ')')
		lx.subs = append(lx.subs, shSub{text: s[1 : len(s)-1], line: line})
		return lx.src[start:lx.i]
	case '{':
		s := lx.balanced('{', '}')
		// ${x:-$(cmd)} nests shell text too
		if k := strings.Index(s, "$("); k >= 0 {
			lx.subs = append(lx.subs, shSub{text: strings.TrimSuffix(s[k+2:], ")}"), line: line})
		}
		return lx.src[start:lx.i]
	}
	for lx.i < len(lx.src) {
		c := lx.src[lx.i]
		if c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' {
			lx.i++
			continue
		}
		if lx.i == start+1 && strings.IndexByte("@*#?$!-", c) >= 0 {
			lx.i++
		}
		break
	}
	return lx.src[start:lx.i]
}

// balanced reads from an open bracket at lx.i to its matching close, skipping quotes.
func (lx *shLexer) balanced(open, close byte) string {
	start, depth := lx.i, 0
	for lx.i < len(lx.src) {
		c := lx.src[lx.i]
		switch {
		case c == '\\':
			lx.i++
		case c == '\'':
			if end := strings.IndexByte(lx.src[lx.i+1:], '\''); end >= 0 {
				lx.line += strings.Count(lx.src[lx.i+1:lx.i+1+end], "\n")
				lx.i += end + 1
			}
		case c == '\n':
			lx.line++
		case c == open:
			depth++
		case c == close:
			depth--
			if depth == 0 {
				lx.i++
				return lx.src[start:lx.i]
			}
		}
		lx.i++
	}
	return lx.src[start:]
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// shellBuiltins run inside the shell and need no package (bash and dash).
var shellBuiltins = set(":", ".", "[", "alias", "bg", "bind", "break", "builtin", "caller", "cd", "command",
	"compgen", "complete", "continue", "declare", "dirs", "disown", "echo", "enable", "eval", "exec", "exit",
	"export", "false", "fc", "fg", "getopts", "hash", "help", "history", "jobs", "kill", "let", "local",
	"logout", "mapfile", "popd", "printf", "pushd", "pwd", "read", "readarray", "readonly", "return", "set",
	"shift", "shopt", "source", "suspend", "test", "times", "trap", "true", "type", "typeset", "ulimit",
	"umask", "unalias", "unset", "wait")

// reserved words that may stand before a command.
var shReservedLead = set("if", "then", "else", "elif", "do", "while", "until", "!", "{", "time")

// reserved words that end a compound command.
var shReservedEnd = set("fi", "done", "esac", "}")

func set(xs ...string) map[string]bool {
	m := make(map[string]bool, len(xs))
	for _, x := range xs {
		m[x] = true
	}
	return m
}

// scanShell reports every command the shell text src runs; line is the line
// number of src's first line in file.
func (s *scanner) scanShell(file, src string, line int) {
	toks, subs := lexShell(src, line)
	funcs := map[string]bool{}
	// function definitions: NAME ( ) or function NAME
	for i, t := range toks {
		if !t.op && !t.dyn && i+2 < len(toks) && toks[i+1].op && toks[i+1].text == "(" && toks[i+2].op && toks[i+2].text == ")" {
			funcs[t.text] = true
		}
		if !t.op && t.text == "function" && i+1 < len(toks) {
			funcs[toks[i+1].text] = true
		}
	}
	// a file's functions are known in its command substitutions and trap strings too
	if s.shFuncs == nil {
		s.shFuncs = map[string]map[string]bool{}
	}
	if s.shFuncs[file] == nil {
		s.shFuncs[file] = map[string]bool{}
	}
	for f := range funcs {
		s.shFuncs[file][f] = true
	}
	funcs = s.shFuncs[file]

	type ctx int
	const (
		cmdPos ctx = iota // next word is a command
		inCmd             // inside a simple command
		skipTo            // skip words to the next separator (for-lists, [[ ]])
	)
	state := cmdPos
	var cur []shWord
	var caseDepth []bool // per open case: true while reading patterns
	flush := func() {
		if len(cur) > 0 {
			s.argv(file, cur, true, funcs)
		}
		cur = nil
	}
	for i := 0; i < len(toks); i++ {
		t := toks[i]
		if t.op {
			if strings.HasPrefix(t.text, ">") { // redirection and its target
				continue
			}
			switch t.text {
			case ";;", ";&":
				flush()
				if n := len(caseDepth); n > 0 {
					caseDepth[n-1] = true
				}
				state = cmdPos
			case ")":
				flush()
				if n := len(caseDepth); n > 0 && caseDepth[n-1] {
					caseDepth[n-1] = false // end of a pattern
				}
				state = cmdPos
			default: // ; & && || | ( newline
				flush()
				if state == skipTo && t.text != "\n" && t.text != ";" {
					continue
				}
				state = cmdPos
			}
			continue
		}
		if n := len(caseDepth); n > 0 && caseDepth[n-1] && state == cmdPos {
			if t.text == "esac" {
				caseDepth = caseDepth[:n-1]
			}
			continue // a case pattern
		}
		switch state {
		case skipTo:
			if t.text == "]]" || t.text == "))" {
				state = inCmd
			}
			continue
		case cmdPos:
			if !t.dyn && shReservedLead[t.text] {
				continue
			}
			if t.arith {
				state = inCmd
				continue
			}
			if !t.dyn && shReservedEnd[t.text] {
				if t.text == "esac" && len(caseDepth) > 0 {
					caseDepth = caseDepth[:len(caseDepth)-1]
				}
				state = inCmd
				continue
			}
			if !t.dyn && (t.text == "for" || t.text == "select") {
				state = skipTo
				continue
			}
			if !t.dyn && t.text == "[[" {
				state = skipTo
				continue
			}
			if !t.dyn && t.text == "case" {
				// case WORD in
				for i+1 < len(toks) && !(toks[i+1].text == "in" && !toks[i+1].op) {
					i++
				}
				i++
				caseDepth = append(caseDepth, true)
				continue
			}
			if !t.dyn && t.text == "function" {
				i++
				continue
			}
			if isAssignment(t.text) {
				continue
			}
			if i+2 < len(toks) && toks[i+1].op && toks[i+1].text == "(" && toks[i+2].op && toks[i+2].text == ")" {
				i += 2 // NAME() {
				continue
			}
			cur = append(cur, t)
			state = inCmd
		case inCmd:
			cur = append(cur, t)
		}
	}
	flush()
	for _, sub := range subs {
		s.scanShell(file, sub.text, sub.line)
	}
}

// isAssignment reports whether w is NAME=value.
func isAssignment(w string) bool {
	k := strings.IndexByte(w, '=')
	if k <= 0 {
		return false
	}
	for j, c := range w[:k] {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || j > 0 && c >= '0' && c <= '9') {
			if c == '+' && j == k-1 { // a+=x
				continue
			}
			return false
		}
	}
	return true
}
