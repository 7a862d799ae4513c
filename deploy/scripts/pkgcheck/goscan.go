package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// This file finds the commands Go code runs: the string given to
// exec.Command, exec.CommandContext and exec.LookPath, followed through local
// variables, ranges over literal lists, append, slicing, fmt.Sprintf formats
// and the repository's own wrappers. A wrapper is any function, method or
// named closure that passes one of its parameters on as (part of) a command;
// its callers' literal arguments are then read in its place, to any depth.
// Without type information, methods are matched by name alone.

type valKind int

const (
	vLit   valKind = iota // a known string
	vDyn                  // a string known only at run time (s: its shape, "$_" for the unknown parts)
	vParam                // string parameter p of fn
	vList                 // list parameter p of fn (variadic: the arguments from p on), from its element k on, spliced
	vElem                 // element k of list parameter p of fn
)

type val struct {
	kind valKind
	s    string
	p, k int
	fn   *fnCtx
	file string
	line int
	src  string // the Go expression of a run-time value, for -v
}

func (v val) isParam() bool { return v.kind == vParam || v.kind == vList || v.kind == vElem }

func (v val) String() string {
	switch v.kind {
	case vLit:
		return strconv.Quote(v.s)
	case vDyn:
		return "dyn(" + v.s + ")"
	}
	return fmt.Sprintf("p%d/%d/%d@%p", v.kind, v.p, v.k, v.fn)
}

// fnCtx is a function body being read: a declaration, a method or a closure.
type fnCtx struct {
	key   string // wrapper key: "f:DIR.NAME", "m:NAME", "c:FILE.NAME"; "" for an anonymous closure
	typ   *ast.FuncType
	body  *ast.BlockStmt
	outer *fnCtx
}

// variadic reports whether parameter p of fn is variadic.
func (f *fnCtx) variadic(p int) bool {
	i := 0
	for _, fl := range f.typ.Params.List {
		n := max(len(fl.Names), 1)
		if p < i+n {
			_, ok := fl.Type.(*ast.Ellipsis)
			return ok
		}
		i += n
	}
	return false
}

// tmpl is a use of a command inside a wrapper, in terms of its parameters.
type tmpl struct {
	lookup bool
	vals   []val
}

func (t tmpl) id() string {
	var b strings.Builder
	fmt.Fprint(&b, t.lookup)
	for _, v := range t.vals {
		b.WriteString("|" + v.String())
	}
	return b.String()
}

type goCall struct {
	call *ast.CallExpr
	ctx  *fnCtx
	file *goFile
	keys []string
}

type goFile struct {
	rel     string // path relative to the root
	dir     string // directory relative to the root
	fset    *token.FileSet
	f       *ast.File
	imports map[string]string // local name -> directory in the module ("" if not ours)
	execNm  string            // local name of os/exec, "" if not imported
	fmtNm   string
	src     []byte
}

// text is the source of node n.
func (gf *goFile) text(n ast.Node) string {
	a, b := gf.fset.Position(n.Pos()).Offset, gf.fset.Position(n.End()).Offset
	if a < 0 || b > len(gf.src) || a > b {
		return "?"
	}
	return string(gf.src[a:b])
}

type goScan struct {
	s        *scanner
	module   string
	files    []*goFile
	pkgVals  map[string]map[string]ast.Expr // dir -> package-level name -> value
	tmpls    map[string][]tmpl
	tmplIDs  map[string]bool
	calls    []goCall
	applied  map[string]bool
	maxAlts  int
	maxDepth int
}

var fixedPath = regexp.MustCompile(`^/(usr/)?(s?bin|lib|libexec|share)/[^\s"'$*]+$`)

func newGoScan(s *scanner, module string) *goScan {
	return &goScan{s: s, module: module, pkgVals: map[string]map[string]ast.Expr{}, tmpls: map[string][]tmpl{},
		tmplIDs: map[string]bool{}, applied: map[string]bool{}, maxAlts: 256, maxDepth: 10}
}

func (g *goScan) addFile(rel string, src []byte) error {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, rel, src, parser.ParseComments)
	if err != nil {
		return err
	}
	gf := &goFile{rel: rel, dir: filepath.Dir(rel), fset: fset, f: f, imports: map[string]string{}, src: src}
	for _, cg := range f.Comments {
		for _, c := range cg.List {
			if strings.Contains(c.Text, "deps-check:absent") {
				if g.s.absent == nil {
					g.s.absent = map[string]bool{}
				}
				g.s.absent[fmt.Sprintf("%s:%d", rel, fset.Position(c.Pos()).Line)] = true
			}
		}
	}
	for _, im := range f.Imports {
		p, _ := strconv.Unquote(im.Path.Value)
		name := filepath.Base(p)
		if im.Name != nil {
			name = im.Name.Name
		}
		switch {
		case p == "os/exec":
			gf.execNm = name
		case p == "fmt":
			gf.fmtNm = name
		case p == g.module:
			gf.imports[name] = "."
		case strings.HasPrefix(p, g.module+"/"):
			gf.imports[name] = strings.TrimPrefix(p, g.module+"/")
		default:
			gf.imports[name] = ""
		}
	}
	pv := g.pkgVals[gf.dir]
	if pv == nil {
		pv = map[string]ast.Expr{}
		g.pkgVals[gf.dir] = pv
	}
	for _, d := range f.Decls {
		if gd, ok := d.(*ast.GenDecl); ok {
			for _, sp := range gd.Specs {
				if vs, ok := sp.(*ast.ValueSpec); ok {
					for i, n := range vs.Names {
						if i < len(vs.Values) {
							pv[n.Name] = vs.Values[i]
						}
					}
				}
			}
		}
	}
	g.files = append(g.files, gf)
	return nil
}

func (g *goScan) line(gf *goFile, n ast.Node) int { return gf.fset.Position(n.Pos()).Line }

// run reads every file, then applies wrapper templates to their callers until
// nothing new is found.
func (g *goScan) run() {
	for _, gf := range g.files {
		g.walkFile(gf)
	}
	for changed := true; changed; {
		changed = false
		for ci, c := range g.calls {
			for _, k := range c.keys {
				for ti, t := range g.tmpls[k] {
					id := fmt.Sprintf("%d/%s/%d", ci, k, ti)
					if g.applied[id] {
						continue
					}
					g.applied[id] = true
					changed = true
					g.apply(t, c)
				}
			}
		}
	}
}

func (g *goScan) walkFile(gf *goFile) {
	// string literals that are fixed paths of programs or package files, and
	// shell scripts the code writes out (a literal starting with #!/bin/sh);
	// in a fmt.Sprintf format, the verbs stand for run-time words.
	formats := map[*ast.BasicLit]bool{}
	ast.Inspect(gf.f, func(n ast.Node) bool {
		if c, ok := n.(*ast.CallExpr); ok && len(c.Args) > 0 {
			if sel, ok := c.Fun.(*ast.SelectorExpr); ok && strings.HasSuffix(sel.Sel.Name, "printf") {
				if bl, ok := c.Args[0].(*ast.BasicLit); ok {
					formats[bl] = true
				}
			}
		}
		return true
	})
	ast.Inspect(gf.f, func(n ast.Node) bool {
		bl, ok := n.(*ast.BasicLit)
		if !ok || bl.Kind != token.STRING {
			return true
		}
		s, err := strconv.Unquote(bl.Value)
		if err != nil {
			return true
		}
		if fixedPath.MatchString(s) {
			g.s.paths = append(g.s.paths, use{s, gf.rel, g.line(gf, bl)})
		}
		if strings.HasPrefix(s, "#!") && isShell("", []byte(s)) {
			if formats[bl] {
				s = fmtVerb.ReplaceAllStringFunc(s, func(m string) string {
					if m == "%%" {
						return "%"
					}
					return "$_"
				})
			}
			g.s.script(gf.rel, s, g.line(gf, bl))
		}
		return true
	})
	for _, d := range gf.f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || fd.Body == nil {
			continue
		}
		key := "f:" + gf.dir + "." + fd.Name.Name
		if fd.Recv != nil {
			key = "m:" + fd.Name.Name
		}
		g.walkBody(gf, &fnCtx{key: key, typ: fd.Type, body: fd.Body}, fd.Body)
	}
}

// walkBody visits the calls of one function body; closures get their own context.
func (g *goScan) walkBody(gf *goFile, ctx *fnCtx, body ast.Node) {
	ast.Inspect(body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncLit:
			if n.Body != body {
				g.walkBody(gf, &fnCtx{typ: n.Type, body: n.Body, outer: ctx}, n.Body)
				return false
			}
		case *ast.AssignStmt: // name := func(...) {...}: a closure callers reach by name
			if len(n.Lhs) == 1 && len(n.Rhs) == 1 {
				if fl, ok := n.Rhs[0].(*ast.FuncLit); ok {
					if id, ok := n.Lhs[0].(*ast.Ident); ok {
						g.walkBody(gf, &fnCtx{key: "c:" + gf.rel + "." + id.Name, typ: fl.Type, body: fl.Body, outer: ctx}, fl.Body)
						return false
					}
				}
			}
		case *ast.CallExpr:
			g.visitCall(gf, ctx, n)
		}
		return true
	})
}

func (g *goScan) visitCall(gf *goFile, ctx *fnCtx, c *ast.CallExpr) {
	switch fun := c.Fun.(type) {
	case *ast.SelectorExpr:
		x, ok := fun.X.(*ast.Ident)
		if ok && x.Obj == nil && gf.execNm != "" && x.Name == gf.execNm {
			g.execCall(gf, ctx, c, fun.Sel.Name)
			return
		}
		if ok && x.Obj == nil {
			if dir, imported := gf.imports[x.Name]; imported {
				if dir != "" {
					g.calls = append(g.calls, goCall{c, ctx, gf, []string{"f:" + dir + "." + fun.Sel.Name}})
				}
				return
			}
		}
		g.calls = append(g.calls, goCall{c, ctx, gf, []string{"m:" + fun.Sel.Name}})
	case *ast.Ident:
		g.calls = append(g.calls, goCall{c, ctx, gf, []string{"c:" + gf.rel + "." + fun.Name, "f:" + gf.dir + "." + fun.Name}})
	}
}

// execCall reads a call of os/exec's Command, CommandContext or LookPath.
func (g *goScan) execCall(gf *goFile, ctx *fnCtx, c *ast.CallExpr, name string) {
	first := 0
	switch name {
	case "Command":
	case "CommandContext":
		first = 1
	case "LookPath":
		if len(c.Args) == 1 {
			for _, v := range g.evalStr(gf, ctx, c.Args[0], 0) {
				g.emit(tmpl{lookup: true, vals: []val{v}})
			}
		}
		return
	default:
		return
	}
	if len(c.Args) <= first {
		return
	}
	for _, vals := range g.argList(gf, ctx, c.Args[first:], c.Ellipsis.IsValid(), 0) {
		g.emit(tmpl{vals: vals})
	}
}

// argList evaluates call arguments to alternatives of one flat list.
func (g *goScan) argList(gf *goFile, ctx *fnCtx, args []ast.Expr, spread bool, depth int) [][]val {
	alts := [][]val{nil}
	for i, a := range args {
		var part [][]val
		if spread && i == len(args)-1 {
			part = g.evalList(gf, ctx, a, depth)
		} else {
			for _, v := range g.evalStr(gf, ctx, a, depth) {
				part = append(part, []val{v})
			}
		}
		alts = g.product(alts, part)
	}
	return alts
}

// product joins every alternative of a with every one of b (equal results
// once), at most maxAlts of them.
func (g *goScan) product(a, b [][]val) [][]val {
	var out [][]val
	seen := map[string]bool{}
	for _, x := range a {
		for _, y := range b {
			if len(out) >= g.maxAlts {
				return out
			}
			z := append(append([]val{}, x...), y...)
			if id := (tmpl{vals: z}).id(); !seen[id] {
				seen[id] = true
				out = append(out, z)
			}
		}
	}
	return out
}

// emit records a use: a template of its wrapper when it refers to parameters,
// else the commands it names.
func (g *goScan) emit(t tmpl) {
	var owner *fnCtx
	for i, v := range t.vals {
		if !v.isParam() {
			continue
		}
		if owner == nil {
			owner = v.fn
		}
		if v.fn != owner || owner.key == "" { // parameters of two functions, or of an anonymous closure
			t.vals[i] = val{kind: vDyn, s: "$_", file: v.file, line: v.line}
		}
	}
	if owner != nil && owner.key != "" {
		for _, v := range t.vals {
			if v.isParam() {
				id := owner.key + "#" + t.id()
				if !g.tmplIDs[id] {
					g.tmplIDs[id] = true
					g.tmpls[owner.key] = append(g.tmpls[owner.key], t)
				}
				return
			}
		}
	}
	if len(t.vals) == 0 {
		return
	}
	words := make([]shWord, len(t.vals))
	for i, v := range t.vals {
		words[i] = shWord{text: v.s, dyn: v.kind != vLit, line: v.line, file: v.file, src: v.src}
	}
	file := t.vals[0].file
	if t.lookup {
		for _, w := range words {
			g.s.lookup(file, w)
		}
		return
	}
	g.s.argv(file, words, false, nil)
}

// apply puts the arguments of call c in place of the template's parameters.
func (g *goScan) apply(t tmpl, c goCall) {
	alts := [][]val{nil}
	var fn *fnCtx
	for _, v := range t.vals {
		if v.isParam() {
			fn = v.fn
		}
	}
	if fn == nil {
		return
	}
	// list returns the alternatives of list parameter p at this call.
	list := func(p int) [][]val {
		if p >= len(c.call.Args) {
			return [][]val{nil}
		}
		if fn.variadic(p) {
			return g.argList(c.file, c.ctx, c.call.Args[p:], c.call.Ellipsis.IsValid(), 0)
		}
		return g.evalList(c.file, c.ctx, c.call.Args[p], 0)
	}
	for _, v := range t.vals {
		var part [][]val
		switch v.kind {
		case vParam:
			if v.p < len(c.call.Args) {
				for _, x := range g.evalStr(c.file, c.ctx, c.call.Args[v.p], 0) {
					part = append(part, []val{x})
				}
			}
		case vList:
			for _, l := range list(v.p) {
				part = append(part, drop(l, v.k))
			}
		case vElem:
			for _, l := range list(v.p) {
				if e, ok := elem(l, v.k); ok {
					part = append(part, []val{e})
				}
			}
		default:
			part = [][]val{{v}}
		}
		if len(part) == 0 {
			part = [][]val{{{kind: vDyn, s: "$_", file: c.file.rel, line: g.line(c.file, c.call)}}}
		}
		alts = g.product(alts, part)
	}
	for _, a := range alts {
		g.emit(tmpl{lookup: t.lookup, vals: a})
	}
}

// drop removes the first k elements of list l.
func drop(l []val, k int) []val {
	for i, v := range l {
		if k == 0 {
			return l[i:]
		}
		if v.kind == vList {
			w := v
			w.k += k
			return append([]val{w}, l[i+1:]...)
		}
		k--
	}
	return nil
}

// elem returns element k of list l.
func elem(l []val, k int) (val, bool) {
	for _, v := range l {
		if v.kind == vList {
			w := v
			w.kind, w.k = vElem, v.k+k
			return w, true
		}
		if k == 0 {
			return v, true
		}
		k--
	}
	return val{}, false
}

var fmtVerb = regexp.MustCompile(`%[-+# 0-9.*\[\]]*[a-zA-Z%]`)

// evalStr evaluates a string expression to its alternatives.
func (g *goScan) evalStr(gf *goFile, ctx *fnCtx, e ast.Expr, depth int) []val {
	ln := g.line(gf, e)
	dyn := []val{{kind: vDyn, s: "$_", file: gf.rel, line: ln, src: gf.text(e)}}
	if depth > g.maxDepth {
		return dyn
	}
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind == token.STRING {
			s, _ := strconv.Unquote(e.Value)
			return []val{{kind: vLit, s: s, file: gf.rel, line: ln}}
		}
		return []val{{kind: vDyn, s: e.Value, file: gf.rel, line: ln}}
	case *ast.ParenExpr:
		return g.evalStr(gf, ctx, e.X, depth+1)
	case *ast.BinaryExpr:
		if e.Op != token.ADD {
			return dyn
		}
		l, r := g.evalStr(gf, ctx, e.X, depth+1)[0], g.evalStr(gf, ctx, e.Y, depth+1)[0]
		if l.kind == vLit && r.kind == vLit {
			return []val{{kind: vLit, s: l.s + r.s, file: gf.rel, line: ln}}
		}
		return []val{{kind: vDyn, s: shape(l) + shape(r), file: gf.rel, line: ln}}
	case *ast.CallExpr:
		if sel, ok := e.Fun.(*ast.SelectorExpr); ok && len(e.Args) > 0 {
			if x, ok := sel.X.(*ast.Ident); ok && x.Obj == nil && x.Name == gf.fmtNm && sel.Sel.Name == "Sprintf" {
				f := g.evalStr(gf, ctx, e.Args[0], depth+1)[0]
				if f.kind == vLit {
					verbs := false
					s := fmtVerb.ReplaceAllStringFunc(f.s, func(m string) string {
						if m == "%%" {
							return "%"
						}
						verbs = true
						return "$_"
					})
					k := vLit
					if verbs {
						k = vDyn
					}
					return []val{{kind: k, s: s, file: gf.rel, line: ln}}
				}
			}
		}
		return dyn
	case *ast.IndexExpr:
		k, ok := intLit(e.Index)
		if !ok {
			return dyn
		}
		var out []val
		for _, l := range g.evalList(gf, ctx, e.X, depth+1) {
			if v, ok := elem(l, k); ok {
				if v.kind == vDyn {
					v.src = gf.text(e)
				}
				out = append(out, v)
			}
		}
		if len(out) == 0 {
			return dyn
		}
		return out
	case *ast.Ident:
		return g.evalIdent(gf, ctx, e, depth, false)
	}
	return dyn
}

// shape is the text of v inside a longer string: unknown parts become "$_".
func shape(v val) string {
	if v.kind == vLit || v.kind == vDyn {
		return v.s
	}
	return "$_"
}

func intLit(e ast.Expr) (int, bool) {
	bl, ok := e.(*ast.BasicLit)
	if !ok || bl.Kind != token.INT {
		return 0, false
	}
	n, err := strconv.Atoi(bl.Value)
	return n, err == nil
}

// evalIdent follows an identifier to its parameter, range or definition.
// asList says the identifier is used as a []string (returns one val per
// element in a list, the caller regroups).
func (g *goScan) evalIdent(gf *goFile, ctx *fnCtx, id *ast.Ident, depth int, asList bool) []val {
	ln := g.line(gf, id)
	dyn := []val{{kind: vDyn, s: "$_", file: gf.rel, line: ln, src: id.Name}}
	if id.Obj == nil {
		if v, ok := g.pkgVals[gf.dir][id.Name]; ok {
			return g.evalStr(gf, nil, v, depth+1)
		}
		return dyn
	}
	switch d := id.Obj.Decl.(type) {
	case *ast.Field:
		for f := ctx; f != nil; f = f.outer {
			i := 0
			for _, fl := range f.typ.Params.List {
				for j := range max(len(fl.Names), 1) {
					if fl == d && j < len(fl.Names) && fl.Names[j].Obj == id.Obj {
						if f.variadic(i) || asList {
							return []val{{kind: vList, p: i, fn: f, file: gf.rel, line: ln}}
						}
						return []val{{kind: vParam, p: i, fn: f, file: gf.rel, line: ln}}
					}
					i++
				}
			}
		}
	case *ast.AssignStmt:
		idx := -1
		for i, l := range d.Lhs {
			if l2, ok := l.(*ast.Ident); ok && l2.Obj == id.Obj {
				idx = i
			}
		}
		if idx < 0 {
			return dyn
		}
		if len(d.Rhs) == 1 {
			if u, ok := d.Rhs[0].(*ast.UnaryExpr); ok && u.Op == token.RANGE {
				if idx != 1 {
					return dyn // the index
				}
				var out []val
				for _, l := range g.evalList(gf, ctx, u.X, depth+1) {
					out = append(out, l...)
				}
				if len(out) == 0 {
					return dyn
				}
				return out
			}
		}
		if len(d.Lhs) == len(d.Rhs) {
			return g.evalStr(gf, ctx, d.Rhs[idx], depth+1)
		}
		if idx == 0 && len(d.Rhs) == 1 { // p, err := exec.LookPath("x"): p runs x
			if c, ok := d.Rhs[0].(*ast.CallExpr); ok && len(c.Args) == 1 {
				if sel, ok := c.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "LookPath" {
					if x, ok := sel.X.(*ast.Ident); ok && x.Obj == nil && x.Name == gf.execNm {
						return g.evalStr(gf, ctx, c.Args[0], depth+1)
					}
				}
			}
		}
	case *ast.ValueSpec:
		for i, n := range d.Names {
			if n.Obj == id.Obj && i < len(d.Values) {
				return g.evalStr(gf, ctx, d.Values[i], depth+1)
			}
		}
	}
	return dyn
}

// evalList evaluates a []string expression to alternatives of its elements.
func (g *goScan) evalList(gf *goFile, ctx *fnCtx, e ast.Expr, depth int) [][]val {
	ln := g.line(gf, e)
	dyn := [][]val{{{kind: vDyn, s: "$_", file: gf.rel, line: ln, src: gf.text(e)}}}
	if depth > g.maxDepth {
		return dyn
	}
	switch e := e.(type) {
	case *ast.ParenExpr:
		return g.evalList(gf, ctx, e.X, depth+1)
	case *ast.CompositeLit:
		if len(e.Elts) > 0 {
			if _, nested := e.Elts[0].(*ast.CompositeLit); nested { // [][]string: one alternative per element
				var out [][]val
				for _, el := range e.Elts {
					out = append(out, g.evalList(gf, ctx, el, depth+1)...)
				}
				return out
			}
		}
		return g.argList(gf, ctx, e.Elts, false, depth+1)
	case *ast.CallExpr:
		if id, ok := e.Fun.(*ast.Ident); ok && id.Name == "append" && id.Obj == nil && len(e.Args) > 0 {
			base := g.evalList(gf, ctx, e.Args[0], depth+1)
			return g.product(base, g.argList(gf, ctx, e.Args[1:], e.Ellipsis.IsValid(), depth+1))
		}
		return dyn
	case *ast.SliceExpr:
		k := 0
		if e.Low != nil {
			var ok bool
			if k, ok = intLit(e.Low); !ok {
				return dyn
			}
		}
		if e.High != nil {
			return dyn
		}
		var out [][]val
		for _, l := range g.evalList(gf, ctx, e.X, depth+1) {
			out = append(out, drop(l, k))
		}
		return out
	case *ast.Ident:
		if e.Obj == nil {
			if v, ok := g.pkgVals[gf.dir][e.Name]; ok {
				return g.evalList(gf, nil, v, depth+1)
			}
			return dyn
		}
		switch d := e.Obj.Decl.(type) {
		case *ast.Field:
			return [][]val{g.evalIdent(gf, ctx, e, depth, true)}
		case *ast.AssignStmt:
			idx := -1
			for i, l := range d.Lhs {
				if l2, ok := l.(*ast.Ident); ok && l2.Obj == e.Obj {
					idx = i
				}
			}
			if idx < 0 {
				return dyn
			}
			if len(d.Rhs) == 1 {
				if u, ok := d.Rhs[0].(*ast.UnaryExpr); ok && u.Op == token.RANGE {
					if idx != 1 {
						return dyn
					}
					return g.evalList(gf, ctx, u.X, depth+1) // range over [][]string: each element a list
				}
			}
			if len(d.Lhs) != len(d.Rhs) {
				return dyn
			}
			return g.withAppends(gf, ctx, e.Obj, g.evalList(gf, ctx, d.Rhs[idx], depth+1), depth)
		case *ast.ValueSpec:
			for i, n := range d.Names {
				if n.Obj == e.Obj && i < len(d.Values) {
					return g.withAppends(gf, ctx, e.Obj, g.evalList(gf, ctx, d.Values[i], depth+1), depth)
				}
			}
		}
	}
	return dyn
}

// withAppends adds what later `x = append(x, ...)` statements in the
// enclosing functions add to list variable obj.
func (g *goScan) withAppends(gf *goFile, ctx *fnCtx, obj *ast.Object, alts [][]val, depth int) [][]val {
	for f := ctx; f != nil; f = f.outer {
		ast.Inspect(f.body, func(n ast.Node) bool {
			as, ok := n.(*ast.AssignStmt)
			if !ok || as.Tok != token.ASSIGN || len(as.Lhs) != 1 || len(as.Rhs) != 1 {
				return true
			}
			l, ok := as.Lhs[0].(*ast.Ident)
			if !ok || l.Obj != obj {
				return true
			}
			c, ok := as.Rhs[0].(*ast.CallExpr)
			if !ok || len(c.Args) == 0 {
				return true
			}
			if fn, ok := c.Fun.(*ast.Ident); !ok || fn.Name != "append" {
				return true
			}
			if a0, ok := c.Args[0].(*ast.Ident); !ok || a0.Obj != obj {
				return true
			}
			alts = g.product(alts, g.argList(gf, ctx, c.Args[1:], c.Ellipsis.IsValid(), depth+1))
			return true
		})
	}
	return alts
}
