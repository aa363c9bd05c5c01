// Package testbootc is the strict stand-in for bootc (internal/sim/testbootc)
// as tests use it: its types and constructors, the test binary doubling as
// test-bootc, and Build for tests that need the separate executable.
package testbootc

import (
	"context"
	"testing"

	"github.com/bootc-fleet/bootc-fleet/internal/sim/testbootc"
)

// Machine is one simulated bootc host.
type Machine = testbootc.Machine

// State is everything a Machine holds.
type State = testbootc.State

// Deployment is one ostree deployment of a container image.
type Deployment = testbootc.Deployment

// Knobs are the behaviours a test sets.
type Knobs = testbootc.Knobs

// Failure makes a command fail like bootc does.
type Failure = testbootc.Failure

// Duration is a time.Duration written as "1.5s" in JSON.
type Duration = testbootc.Duration

// RebootOptions shape a simulated reboot.
type RebootOptions = testbootc.RebootOptions

// Generation is a bootc release line whose command line Exec follows.
type Generation = testbootc.Generation

// Dir is a state directory the executable works over.
type Dir = testbootc.Dir

// Mem is a Store in memory.
type Mem = testbootc.Mem

// The bootc release lines tests pick.
const (
	Gen1_11               = testbootc.Gen1_11
	Gen1_16               = testbootc.Gen1_16
	GenSwitchDownloadOnly = testbootc.GenSwitchDownloadOnly
)

// EnvState names the state directory the executable uses; HangPIDsFile
// holds the pids of a hanging switch and its child; StateFile is the
// machine state every call reads and writes atomically.
const (
	EnvState     = testbootc.EnvState
	HangPIDsFile = testbootc.HangPIDsFile
	StateFile    = testbootc.StateFile
)

// NewBooted returns a machine booted on ref (repo@sha256:...).
func NewBooted(ref string) (*Machine, error) { return testbootc.NewBooted(ref) }

// NewMem returns a store over m.
func NewMem(m *Machine) *Mem { return testbootc.NewMem(m) }

// Init creates dir and writes s as its state.
func Init(dir string, s State) (Dir, error) { return testbootc.Init(dir, s) }

// NewBootID returns a random boot ID in the kernel's format.
func NewBootID() string { return testbootc.NewBootID() }

// RunIfRequested makes a test binary double as test-bootc: call it first in
// TestMain.
func RunIfRequested() { testbootc.RunIfRequested() }

// SelfExec returns the path and extra environment that run the current test
// binary as test-bootc over d (the binary's TestMain must call RunIfRequested).
func SelfExec(d Dir) (path string, env []string) { return testbootc.SelfExec(d) }

// Build compiles cmd/test-bootc into a temporary directory and returns its
// path, for harnesses that need a separate executable.
func Build(tb testing.TB) string {
	tb.Helper()
	out, err := testbootc.BuildExecutable(context.Background(), tb.TempDir())
	if err != nil {
		tb.Fatal(err)
	}
	return out
}
