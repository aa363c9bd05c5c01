package testbootc

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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

// Executable is the import path of the test-bootc command.
const Executable = "github.com/bootc-fleet/bootc-fleet/internal/sim/testbootc/cmd/test-bootc"

// BuildExecutable compiles cmd/test-bootc into dir and returns its path, for
// harnesses that need a separate executable.
func BuildExecutable(ctx context.Context, dir string) (string, error) {
	out := filepath.Join(dir, "test-bootc")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, Executable)
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build test-bootc: %w\n%s", err, b)
	}
	return out, nil
}
