// Package tree checks the shape of the source tree: the product links no
// test code, and every package sits where the README's layout table says.
package tree

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/bootc-fleet/bootc-fleet"

// roots are the top-level directories a Go package may sit in: the API,
// the programs' mains, everything else they are built from, the packaging
// (crdpatch), the tests, and units/, whose package is only the tests of the
// systemd units beside it.
var roots = []string{"api", "cmd", "internal", "packaging", "tests", "units"}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("no go.mod at %s: %v", root, err)
	}
	return root
}

// goList runs `go list args...` at the repository's root and returns its
// lines.
func goList(t *testing.T, args ...string) []string {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	cmd.Dir = repoRoot(t)
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("go list %s: %v\n%s", strings.Join(args, " "), err, stderr)
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

// rel is a package's path inside the module ("" for packages outside it).
func rel(importPath string) (string, bool) {
	return strings.CutPrefix(importPath, module+"/")
}

// The programs (and the demo) link neither package testing nor anything
// under tests/: what ships is only the product.
func TestProductLinksNoTestCode(t *testing.T) {
	deps := goList(t, "-deps", "./cmd/...")
	if len(deps) < 10 {
		t.Fatalf("go list -deps ./cmd/... listed only %q", deps)
	}
	for _, p := range deps {
		if p == "testing" || strings.HasPrefix(p, "testing/") {
			t.Errorf("./cmd/... links %s", p)
		}
		if r, ok := rel(p); ok && strings.HasPrefix(r, "tests/") {
			t.Errorf("./cmd/... links %s", p)
		}
	}
}

// Every package sits under one of the README layout table's top-level
// directories, and outside tests/ no non-test file imports testing or a
// package under tests/.
func TestPackagesSitWhereTheLayoutSays(t *testing.T) {
	documented := layoutRoots(t)
	for _, r := range roots {
		if !documented[r] {
			t.Errorf("README.md's layout table has no row under %s/", r)
		}
	}
	lines := goList(t, "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "./...")
	for _, line := range lines {
		fields := strings.Fields(line)
		r, ok := rel(fields[0])
		if !ok {
			t.Errorf("package %s is outside module %s", fields[0], module)
			continue
		}
		top, _, _ := strings.Cut(r, "/")
		if !slices.Contains(roots, top) {
			t.Errorf("package %s sits under %s/, not under one of %v", r, top, roots)
		}
		if top == "tests" {
			continue
		}
		for _, imp := range fields[1:] {
			if imp == "testing" {
				t.Errorf("%s (not under tests/) imports testing in a non-test file", r)
			}
			if ir, ok := rel(imp); ok && strings.HasPrefix(ir, "tests/") {
				t.Errorf("%s (not under tests/) imports %s in a non-test file", r, ir)
			}
		}
	}
}

// layoutRoots reads the top-level directories named in the first column of
// README.md's layout table.
func layoutRoots(t *testing.T) map[string]bool {
	t.Helper()
	f, err := os.Open(filepath.Join(repoRoot(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	row := regexp.MustCompile("^\\| `([^`]+)` \\|")
	in := false
	got := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := sc.Text()
		switch {
		case strings.HasPrefix(l, "## "):
			in = l == "## Layout"
		case in:
			if m := row.FindStringSubmatch(l); m != nil {
				top, _, _ := strings.Cut(strings.TrimSuffix(m[1], "/"), "/")
				got[top] = true
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(got) == 0 {
		t.Fatal("README.md has no layout table under '## Layout'")
	}
	return got
}
