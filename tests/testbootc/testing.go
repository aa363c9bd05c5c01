package testbootc

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// envSelfExec marks a test binary re-executed to act as test-bootc.
const envSelfExec = "TESTBOOTC_SELF_EXEC"

// RunIfRequested makes a test binary double as test-bootc: call it first in
// TestMain. When the binary was started through SelfExec it runs Main and
// exits; otherwise it returns at once.
func RunIfRequested() {
	if os.Getenv(envSelfExec) == "1" {
		os.Exit(Main(os.Args[1:], os.Stdout, os.Stderr))
	}
}

// SelfExec returns the path and extra environment that run the current test
// binary as test-bootc over d (the binary's TestMain must call RunIfRequested).
func SelfExec(d Dir) (path string, env []string) {
	exe, err := os.Executable()
	if err != nil {
		exe = os.Args[0]
	}
	return exe, []string{envSelfExec + "=1", EnvState + "=" + string(d)}
}

// Build compiles cmd/test-bootc into a temporary directory and returns its
// path, for harnesses that need a separate executable.
func Build(tb testing.TB) string {
	tb.Helper()
	out := filepath.Join(tb.TempDir(), "test-bootc")
	cmd := exec.Command("go", "build", "-o", out, "github.com/bootc-fleet/bootc-fleet/tests/testbootc/cmd/test-bootc")
	if b, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("go build test-bootc: %v\n%s", err, b)
	}
	return out
}
