package sim

import "os"

// CoordinatorBuildFlags and CoordinatorBuildEnv build the programs as
// packaging/release.sh and packaging/build-images.sh do (less the version's
// -X): static, without file paths or the symbol and DWARF tables. Every
// build that runs or measures bootc-fleet-coordinator uses them (the process
// fleets, BenchmarkRolloutBound, the demo; `make build` spells them out), so
// what is measured is what ships. A cgo build of the coordinator is nearly
// three times the size: k8s.io/kubectl/pkg/drain reaches Go's plugin package
// (through kustomize), and a cgo binary that links it keeps every exported
// method (docs/testing.md, "The coordinator's weight"). TestBuildFlagsAreTheRelease
// checks the scripts and the Makefile against these.
var (
	CoordinatorBuildFlags = []string{"-trimpath", "-ldflags=-s -w"}
	CoordinatorBuildEnv   = []string{"CGO_ENABLED=0"}
)

// buildEnv is this process's environment with CoordinatorBuildEnv over it.
func buildEnv() []string {
	return append(os.Environ(), CoordinatorBuildEnv...)
}
