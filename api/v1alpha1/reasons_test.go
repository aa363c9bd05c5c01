package v1alpha1

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// reasonPrefixes name the constants that are reasons: of conditions and
// status (Reason) and of Events (Event).
var reasonPrefixes = []string{"Reason", "Event"}

// reasonConsts returns the string constants of file whose names start with
// one of reasonPrefixes, name to value.
func reasonConsts(t *testing.T, file string) map[string]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			vs := s.(*ast.ValueSpec)
			for i, n := range vs.Names {
				if i >= len(vs.Values) || !isReasonName(n.Name) {
					continue
				}
				lit, ok := vs.Values[i].(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					continue
				}
				v, err := strconv.Unquote(lit.Value)
				if err != nil {
					t.Fatal(err)
				}
				out[n.Name] = v
			}
		}
	}
	return out
}

func isReasonName(n string) bool {
	for _, p := range reasonPrefixes {
		if rest, ok := strings.CutPrefix(n, p); ok && rest != "" && rest[0] >= 'A' && rest[0] <= 'Z' {
			return true
		}
	}
	return false
}

// Every reason's identifier is its prefix and its value, so a reader of
// the code and a reader of a condition or an Event use one word.
func TestReasonIdentifiersAreTheirValues(t *testing.T) {
	n := 0
	for _, file := range []string{"reasons.go", "reasons_agent.go"} {
		for name, v := range reasonConsts(t, file) {
			n++
			if name != "Reason"+v && name != "Event"+v {
				t.Errorf("%s: %s = %q: the identifier must be Reason%s or Event%s", file, name, v, v, v)
			}
		}
	}
	if n < 50 {
		t.Fatalf("found only %d reasons in reasons.go and reasons_agent.go", n)
	}
}

// Reasons live in this package only: no other product package declares
// one (a Reason or Event string constant).
func TestReasonsLiveInTheAPI(t *testing.T) {
	root := filepath.Join("..", "..")
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "testdata", "tests", "tools", "v1alpha1":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		for name, v := range reasonConsts(t, path) {
			t.Errorf("%s declares %s = %q: reasons belong in api/v1alpha1/reasons*.go", path, name, v)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
