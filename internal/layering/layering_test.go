// Package layering holds the test that keeps the module's layers: the
// order of its packages, and of the files of some of them, that
// docs/design.md gives in its one code block tagged "layers". A package
// may import only module packages listed below it; in a package whose
// files are listed, a file may refer only to what files on its own floor
// or below declare. Every production package and, in a package whose files
// are listed, every production file must be in the order, so nothing new
// slips past. Test files are never checked.
//
// The package data come from one `go list -json -export -deps ./...`; a
// package whose files are checked is type-checked (for this platform) from
// its production files, its imports read from the export data go list
// left in the build cache. Standard library only.
//
//	go test -count=1 ./internal/layering
package layering

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// allowed holds the back-references the code has today, one entry a
// violation, each the failure's text without its "which is above it":
// "P imports Q" for packages, "F uses X (G)" for files. An entry that no
// longer matches a violation fails the test, so this list can only shrink;
// removing an entry makes the check stricter. Nothing is added here: a new
// back-reference is fixed, or the order in docs/design.md changes.
var allowed = map[string]string{}

// TestLayers checks the module against the order in docs/design.md.
func TestLayers(t *testing.T) {
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	doc := filepath.Join(root, "docs", "design.md")
	src, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	order, err := parseLayers(string(src))
	if err != nil {
		t.Fatalf("docs/design.md: %v", err)
	}
	m, err := listModule(root)
	if err != nil {
		t.Fatal(err)
	}
	found, problems := check(m, order)
	for _, p := range problems {
		t.Error(p)
	}
	matched := map[string]bool{}
	for _, v := range found {
		if _, ok := allowed[v.key]; ok {
			matched[v.key] = true
			continue
		}
		t.Errorf("%s, which is above %s", v.key, v.above)
	}
	for v, why := range allowed {
		// What does not type-check, or is missing from the order, may hide
		// a violation: the allow-list is checked for entries no longer
		// needed only when nothing else is wrong.
		if !matched[v] && len(problems) == 0 {
			t.Errorf("allowed %q is no longer a violation: remove it from the allow-list", v)
		}
		if strings.TrimSpace(why) == "" {
			t.Errorf("allowed %q says not why", v)
		}
	}
}

// TestParseLayers checks the reading of the layers block: comments, lines
// that go on, floors, and the mistakes it refuses.
func TestParseLayers(t *testing.T) {
	doc := "# Design\n\n```\nnot this block > x.go\n```\n\n```layers\n" +
		"# mains\n" +
		"cmd/caddy\n" +
		"\n" +
		".       front.go   # comment\n" +
		"      > back_*.go more.go\n" +
		"        last.go\n" +
		"pool    a.go > b.go c.go>d.go\n" +
		"```\n"
	got, err := parseLayers(doc)
	if err != nil {
		t.Fatal(err)
	}
	want := []layer{
		{dir: "cmd/caddy", line: 9},
		{dir: ".", line: 11, floors: [][]string{{"front.go"}, {"back_*.go", "more.go", "last.go"}}},
		{dir: "pool", line: 14, floors: [][]string{{"a.go"}, {"b.go", "c.go"}, {"d.go"}}},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("parsed\n%v\nwant\n%v", got, want)
	}
	for _, bad := range []struct{ doc, err string }{
		{"```go\nx\n```\n", "no code block tagged layers"},
		{"```layers\na\n```\n```layers\nb\n```\n", "2 code blocks tagged layers; want one"},
		{"```layers\n  > a.go\n```\n", "line 2: goes on from no package"},
		{"```layers\ngateway a.go > > b.go\n```\n", "line 2: gateway has an empty floor"},
		{"```layers\ngateway a.go >\n```\n", "line 2: gateway has an empty floor"},
		{"```layers\ngateway\npool\n./gateway\n```\n", "line 4: gateway is listed already, on line 2"},
		{"```layers\ngateway sub/a.go\n```\n", `line 2: "sub/a.go" is no file name or pattern`},
		{"```layers\ngateway a[.go\n```\n", `line 2: "a[.go" is no file name or pattern`},
		{"```layers\n../other\n```\n", `line 2: "../other" is no package directory of the module`},
		{"```layers\n# nothing\n```\n", "the layers block lists no package"},
	} {
		if _, err := parseLayers(bad.doc); err == nil || err.Error() != bad.err {
			t.Errorf("parseLayers(%q) = %v, want %s", bad.doc, err, bad.err)
		}
	}
}

// A layer is one package of the order: its directory relative to the
// module's root ("." for the root package) and, when its files are
// listed, their floors, top first, each a list of file names or
// path.Match patterns.
type layer struct {
	dir    string
	floors [][]string
	line   int // in the document, for messages
}

// parseLayers reads the one code block tagged "layers" of a Markdown
// document. Each line names a package directory, top of the house first,
// optionally followed by its production files as floors, top floor first:
// the files of one floor separated by spaces, floors by ">". A line that
// starts with a space or a tab goes on with the line before it; "#" starts
// a comment that runs to the end of the line.
func parseLayers(doc string) ([]layer, error) {
	var (
		body   []string
		start  int // the line of the block's first line
		blocks int
		fenced bool
		mine   bool
	)
	for i, line := range strings.Split(doc, "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case !fenced && strings.HasPrefix(trimmed, "```"):
			fenced = true
			mine = strings.TrimSpace(strings.TrimPrefix(trimmed, "```")) == "layers"
			if mine {
				blocks++
				start = i + 2
			}
		case fenced && trimmed == "```":
			fenced, mine = false, false
		case mine && blocks == 1:
			body = append(body, line)
		}
	}
	if blocks == 0 {
		return nil, errors.New("no code block tagged layers")
	}
	if blocks > 1 {
		return nil, fmt.Errorf("%d code blocks tagged layers; want one", blocks)
	}

	var (
		out  []layer
		text []string
		at   []int
	)
	for i, raw := range body {
		if c := strings.IndexByte(raw, '#'); c >= 0 {
			raw = raw[:c]
		}
		if strings.TrimSpace(raw) == "" {
			continue
		}
		if raw[0] == ' ' || raw[0] == '\t' {
			if len(text) == 0 {
				return nil, fmt.Errorf("line %d: goes on from no package", start+i)
			}
			text[len(text)-1] += " " + raw
			continue
		}
		text = append(text, raw)
		at = append(at, start+i)
	}
	seen := map[string]int{}
	for i, s := range text {
		l := layer{line: at[i]}
		fields := strings.Fields(strings.ReplaceAll(s, ">", " > "))
		l.dir = path.Clean(fields[0])
		if l.dir == ">" || strings.HasPrefix(l.dir, "/") || strings.HasPrefix(l.dir, "..") {
			return nil, fmt.Errorf("line %d: %q is no package directory of the module", l.line, fields[0])
		}
		if prev, ok := seen[l.dir]; ok {
			return nil, fmt.Errorf("line %d: %s is listed already, on line %d", l.line, l.dir, prev)
		}
		seen[l.dir] = l.line
		if len(fields) > 1 {
			var floor []string
			for _, f := range append(fields[1:], ">") {
				if f != ">" {
					if _, err := path.Match(f, ""); err != nil || strings.Contains(f, "/") {
						return nil, fmt.Errorf("line %d: %q is no file name or pattern", l.line, f)
					}
					floor = append(floor, f)
					continue
				}
				if len(floor) == 0 {
					return nil, fmt.Errorf("line %d: %s has an empty floor", l.line, l.dir)
				}
				l.floors = append(l.floors, floor)
				floor = nil
			}
		}
		out = append(out, l)
	}
	if len(out) == 0 {
		return nil, errors.New("the layers block lists no package")
	}
	return out, nil
}

// A listed package, as go list -json tells it.
type listed struct {
	ImportPath     string
	Dir            string
	Export         string
	DepOnly        bool
	GoFiles        []string
	CgoFiles       []string
	IgnoredGoFiles []string
	Module         *struct{ Path string }
}

// module is what the checks need of one go list run.
type module struct {
	root, path string
	pkgs       []*listed          // the module's own packages
	all        map[string]*listed // every package, dependencies included
}

// moduleRoot is the directory of the go.mod above the working directory.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		up := filepath.Dir(dir)
		if up == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = up
	}
}

// listModule runs go list once over the module, with export data for
// every package, dependencies included.
func listModule(root string) (*module, error) {
	cmd := exec.Command("go", "list", "-export", "-deps",
		"-json=ImportPath,Dir,Export,DepOnly,GoFiles,CgoFiles,IgnoredGoFiles,Module", "./...")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list: %v\n%s", err, stderr.Bytes())
	}
	m := &module{root: root, all: map[string]*listed{}}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		p := new(listed)
		if err := dec.Decode(p); err == io.EOF {
			break
		} else if err != nil {
			return nil, fmt.Errorf("go list's output: %v", err)
		}
		m.all[p.ImportPath] = p
		if !p.DepOnly {
			m.pkgs = append(m.pkgs, p)
			if p.Module != nil {
				m.path = p.Module.Path
			}
		}
	}
	if m.path == "" {
		return nil, errors.New("go list named no module")
	}
	return m, nil
}

// dir is a package's directory as the layers block names it.
func (m *module) dir(p *listed) string {
	rel, err := filepath.Rel(m.root, p.Dir)
	if err != nil {
		return p.Dir
	}
	return filepath.ToSlash(rel)
}

// production is a package's Go files but its tests, those of other
// platforms included.
func production(p *listed) []string {
	var files []string
	for _, f := range slices.Concat(p.GoFiles, p.CgoFiles, p.IgnoredGoFiles) {
		if !strings.HasSuffix(f, "_test.go") {
			files = append(files, f)
		}
	}
	sort.Strings(files)
	return files
}

// A violation is one reference against the order: what refers (key, the
// text the allow-list holds) and to what above it.
type violation struct{ key, above string }

// check returns the violations of the order (imports, file references),
// sorted by key, and what else is wrong: a package or file missing from
// the order, a name in it that matches nothing, a package that does not
// type-check.
func check(m *module, order []layer) (violations []violation, problems []string) {
	rank := map[string]int{}
	for i, l := range order {
		rank[l.dir] = i
	}
	byDir := map[string]*listed{}
	for _, p := range m.pkgs {
		d := m.dir(p)
		byDir[d] = p
		if _, ok := rank[d]; !ok && len(production(p)) > 0 {
			problems = append(problems, fmt.Sprintf("package %s is not in the layers block of docs/design.md", d))
		}
	}
	fset := token.NewFileSet()
	for _, l := range order {
		p, ok := byDir[l.dir]
		if !ok || len(production(p)) == 0 {
			problems = append(problems, fmt.Sprintf("docs/design.md:%d: %s is no package of the module with production files", l.line, l.dir))
			continue
		}
		// Imports are read from every production file, those of other
		// platforms too.
		for _, name := range production(p) {
			f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, parser.ImportsOnly)
			if err != nil {
				problems = append(problems, err.Error())
				continue
			}
			for _, spec := range f.Imports {
				imp, _ := strconv.Unquote(spec.Path.Value)
				dir, ok := m.within(imp)
				if !ok {
					continue
				}
				if r, ok := rank[dir]; ok && r <= rank[l.dir] {
					violations = append(violations, violation{
						key:   fmt.Sprintf("%s imports %s", path.Join(l.dir, name), dir),
						above: l.dir,
					})
				}
			}
		}
		if len(l.floors) == 0 {
			continue
		}
		floorOf, ps := floors(p, l)
		problems = append(problems, ps...)
		refs, err := references(m, p)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", l.dir, err))
			continue
		}
		for _, r := range refs {
			// A file on no floor is told of above; the others are checked.
			if floorOf[r.decl] >= 0 && floorOf[r.decl] < floorOf[r.file] {
				violations = append(violations, violation{
					key:   fmt.Sprintf("%s uses %s (%s)", path.Join(l.dir, r.file), r.name, path.Join(l.dir, r.decl)),
					above: "it",
				})
			}
		}
	}
	slices.SortFunc(violations, func(a, b violation) int { return strings.Compare(a.key, b.key) })
	violations = slices.Compact(violations)
	return violations, problems
}

// within tells whether an import path is the module's, and its directory.
func (m *module) within(importPath string) (string, bool) {
	if importPath == m.path {
		return ".", true
	}
	rest, ok := strings.CutPrefix(importPath, m.path+"/")
	return rest, ok
}

// floors places each production file of a package on its floor (0 is the
// top), and reports a file on no floor or on two, and a name or pattern
// that matches no file.
func floors(p *listed, l layer) (map[string]int, []string) {
	var problems []string
	floorOf := map[string]int{}
	used := map[string]bool{}
	for _, f := range production(p) {
		floorOf[f] = -1
		for i, floor := range l.floors {
			for _, pat := range floor {
				if ok, _ := path.Match(pat, f); !ok {
					continue
				}
				used[pat] = true
				if floorOf[f] >= 0 && floorOf[f] != i {
					problems = append(problems, fmt.Sprintf("docs/design.md:%d: %s/%s is on two floors", l.line, l.dir, f))
				}
				floorOf[f] = i
			}
		}
		if floorOf[f] < 0 {
			problems = append(problems, fmt.Sprintf("docs/design.md:%d: %s/%s is on no floor of the layers block", l.line, l.dir, f))
		}
	}
	for _, floor := range l.floors {
		for _, pat := range floor {
			if !used[pat] {
				problems = append(problems, fmt.Sprintf("docs/design.md:%d: %s/%s matches no production file", l.line, l.dir, pat))
			}
		}
	}
	return floorOf, problems
}

// A reference from one file of a package to what another file of it
// declares.
type reference struct {
	file, decl string // file names in the package's directory
	name       string // the identifier, Type.member for fields and methods
}

// references type-checks a package's production files for this platform
// and returns every reference from one of them to a declaration in
// another: every identifier used (functions, types, methods, fields,
// constants, variables), and the embedded fields a promoted selector goes
// through.
func references(m *module, p *listed) ([]reference, error) {
	fset := token.NewFileSet()
	var files []*ast.File
	for _, name := range slices.Concat(p.GoFiles, p.CgoFiles) {
		f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	lookup := func(importPath string) (io.ReadCloser, error) {
		q, ok := m.all[importPath]
		if !ok || q.Export == "" {
			return nil, fmt.Errorf("no export data for %s", importPath)
		}
		return os.Open(q.Export)
	}
	conf := types.Config{
		Importer: importer.ForCompiler(fset, "gc", lookup),
		Sizes:    types.SizesFor("gc", runtime.GOARCH),
	}
	info := &types.Info{
		Uses:       map[*ast.Ident]types.Object{},
		Selections: map[*ast.SelectorExpr]*types.Selection{},
	}
	pkg, err := conf.Check(p.ImportPath, fset, files, info)
	if err != nil {
		return nil, err
	}
	names := memberNames(pkg)
	fileOf := func(pos token.Pos) string {
		return filepath.Base(fset.Position(pos).Filename)
	}
	seen := map[reference]bool{}
	var refs []reference
	add := func(at token.Pos, obj types.Object) {
		if obj == nil || obj.Pkg() != pkg || !obj.Pos().IsValid() {
			return
		}
		r := reference{file: fileOf(at), decl: fileOf(obj.Pos()), name: nameOf(obj, names)}
		if r.file != r.decl && !seen[r] {
			seen[r] = true
			refs = append(refs, r)
		}
	}
	for id, obj := range info.Uses {
		add(id.Pos(), obj)
	}
	for sel, s := range info.Selections {
		// The embedded fields a promoted field or method is reached
		// through are used as much as the field or method itself.
		t := s.Recv()
		for _, i := range s.Index()[:len(s.Index())-1] {
			if ptr, ok := t.Underlying().(*types.Pointer); ok {
				t = ptr.Elem()
			}
			st, ok := t.Underlying().(*types.Struct)
			if !ok {
				break
			}
			field := st.Field(i)
			add(sel.Sel.Pos(), field.Origin())
			t = field.Type()
		}
	}
	sort.Slice(refs, func(i, j int) bool {
		a, b := refs[i], refs[j]
		return a.file+"\x00"+a.name+"\x00"+a.decl < b.file+"\x00"+b.name+"\x00"+b.decl
	})
	return refs, nil
}

// memberNames names the fields and interface methods of a package's named
// types "Type.member" (and fields of a field's struct literal type
// "Type.field.member").
func memberNames(pkg *types.Package) map[types.Object]string {
	names := map[types.Object]string{}
	var walk func(prefix string, t types.Type)
	walk = func(prefix string, t types.Type) {
		switch u := t.(type) {
		case *types.Struct:
			for i := range u.NumFields() {
				f := u.Field(i)
				if _, ok := names[f]; ok {
					continue
				}
				names[f] = prefix + "." + f.Name()
				if st, ok := f.Type().(*types.Struct); ok {
					walk(prefix+"."+f.Name(), st)
				}
			}
		case *types.Interface:
			for i := range u.NumExplicitMethods() {
				names[u.ExplicitMethod(i)] = prefix + "." + u.ExplicitMethod(i).Name()
			}
		}
	}
	scope := pkg.Scope()
	for _, n := range scope.Names() {
		if tn, ok := scope.Lookup(n).(*types.TypeName); ok {
			walk(n, tn.Type().Underlying())
		}
	}
	return names
}

// nameOf is how a message names what a file uses: Type.method for a
// method, Type.field for a field, the name otherwise.
func nameOf(obj types.Object, members map[types.Object]string) string {
	switch o := obj.(type) {
	case *types.Func:
		o = o.Origin()
		if recv := o.Signature().Recv(); recv != nil {
			if n, ok := members[o]; ok {
				return n
			}
			t := recv.Type()
			if ptr, ok := t.(*types.Pointer); ok {
				t = ptr.Elem()
			}
			if named, ok := t.(*types.Named); ok {
				return named.Obj().Name() + "." + o.Name()
			}
		}
		return o.Name()
	case *types.Var:
		if n, ok := members[o.Origin()]; ok {
			return n
		}
	}
	return obj.Name()
}
