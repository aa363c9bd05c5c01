// Package release knows the project's release version: the first release
// heading of CHANGELOG.md, which the kustomization, the chart and the docs pin.
package release

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"

	"github.com/bootc-fleet/bootc-fleet/tests/envtest"
)

// heading is a release heading of CHANGELOG.md: "## vX.Y.Z (YYYY-MM-DD)".
var heading = regexp.MustCompile(`(?m)^## (v\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?)\b`)

// Version returns the newest release of CHANGELOG.md.
func Version() (string, error) {
	b, err := os.ReadFile(filepath.Join(envtest.RepoRoot(), "CHANGELOG.md"))
	if err != nil {
		return "", err
	}
	m := heading.FindSubmatch(b)
	if m == nil {
		return "", fmt.Errorf("CHANGELOG.md has no release heading (## vX.Y.Z)")
	}
	return string(m[1]), nil
}
