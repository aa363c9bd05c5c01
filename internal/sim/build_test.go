package sim

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bootc-fleet/bootc-fleet/internal/controlplane"
)

// Every `go build` of the product in the release scripts and the Makefile
// uses CoordinatorBuildFlags and CoordinatorBuildEnv, so the process fleets
// and the benchmarks run what ships.
func TestBuildFlagsAreTheRelease(t *testing.T) {
	var want []string
	for _, f := range CoordinatorBuildFlags {
		if v, ok := strings.CutPrefix(f, "-ldflags="); ok {
			f = `-ldflags "` + v // the scripts add -X main.version=... in the same argument
		}
		want = append(want, f)
	}
	want = append(want, CoordinatorBuildEnv...)
	for _, file := range []string{"packaging/release.sh", "packaging/build-images.sh", "Makefile"} {
		raw, err := os.ReadFile(filepath.Join(controlplane.RepoRoot(), file))
		if err != nil {
			t.Fatal(err)
		}
		builds := 0
		for i, line := range strings.Split(string(raw), "\n") {
			if !strings.Contains(line, "go build") && !strings.Contains(line, "$(GO) build") {
				continue
			}
			builds++
			for _, w := range want {
				if !strings.Contains(line, w) {
					t.Errorf("%s:%d builds without %s: %s", file, i+1, w, strings.TrimSpace(line))
				}
			}
		}
		if builds == 0 {
			t.Errorf("%s: no go build found", file)
		}
	}
}
