package fleet

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/bootc-fleet/bootc-fleet/internal/sim"
)

// startCoordinatorProc runs the coordinator binary with its production
// defaults (intervals, lease duration, workers), metrics and probes off,
// talking to the API server directly as the coordinator's ServiceAccount.
func (f *Fleet) startCoordinatorProc() {
	kc, err := f.Env.KubeconfigFor(f.dir, sim.CoordinatorIdentity, "system:serviceaccounts", "system:serviceaccounts:bootc-fleet-system")
	if err != nil {
		f.tb.Fatal(err)
	}
	// FLEET_COORDINATOR_LOG keeps the log past the test's temp dir.
	path := filepath.Join(f.dir, "coordinator.log")
	if p := os.Getenv("FLEET_COORDINATOR_LOG"); p != "" {
		path = p
	}
	out, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		f.tb.Fatal(err)
	}
	// What this process writes starts here (the file may hold earlier runs).
	var from int64
	if st, err := out.Stat(); err == nil {
		from = st.Size()
	}
	defer out.Close()
	args := []string{"--kubeconfig", kc, "--metrics-bind-address", "0",
		"--health-probe-bind-address", "0", "--insecure-registry", f.Registry}
	// FLEET_COORDINATOR_ARGS adds flags, e.g. --log-level=debug to see each pass.
	args = append(args, strings.Fields(os.Getenv("FLEET_COORDINATOR_ARGS"))...)
	// FLEET_COORDINATOR_ENV adds environment, e.g. GOMEMLIMIT=230MiB to run
	// it as the chart's memory limit makes it run in a container.
	env := append(sim.MinimalEnv(), strings.Fields(os.Getenv("FLEET_COORDINATOR_ENV"))...)
	p, err := sim.StartProcess(f.coordBin, args, env, out)
	if err != nil {
		f.tb.Fatal(err)
	}
	f.mu.Lock()
	f.coordProc = p
	f.coordLog, f.coordLogFrom = path, from
	f.mu.Unlock()
}

// WaitCoordinatorWorking waits until the coordinator process's controller
// has started its workers (its caches synced), so what a test times from
// then on is the rollout, not the process starting on a busy machine.
func (f *Fleet) WaitCoordinatorWorking(timeout time.Duration) error {
	f.mu.Lock()
	path, from := f.coordLog, f.coordLogFrom
	f.mu.Unlock()
	if path == "" {
		return nil // in-process: Start returned once it ran
	}
	deadline := time.Now().Add(timeout)
	for {
		b, err := os.ReadFile(path)
		if err == nil && int64(len(b)) >= from && strings.Contains(string(b[from:]), `"msg":"Starting workers"`) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the coordinator did not start its workers within %s (log %s)", timeout, path)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// CoordinatorPID is the coordinator process's id (0 when in-process).
func (f *Fleet) CoordinatorPID() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.coordProc == nil {
		return 0
	}
	return f.coordProc.PID()
}

// ProcUsage is a process's CPU time so far (user+system) and its resident
// memory now and at its peak (VmRSS, VmHWM), from /proc. RSS splits into
// anonymous memory (RssAnon: the Go heap, stacks, runtime) and pages of
// mapped files (RssFile: mostly the binary's text), which a container's
// memory limit can reclaim.
type ProcUsage struct {
	CPU              time.Duration
	RSS, PeakRSS     int64 // bytes
	RSSAnon, RSSFile int64 // bytes, now
}

// ReadProcUsage reads pid's usage.
func ReadProcUsage(pid int) (ProcUsage, error) {
	var u ProcUsage
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return u, err
	}
	// Fields after the command name (which may contain spaces) start at ")".
	rest := strings.Fields(string(st[strings.LastIndexByte(string(st), ')')+2:]))
	if len(rest) < 13 {
		return u, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	utime, _ := strconv.ParseInt(rest[11], 10, 64)
	stime, _ := strconv.ParseInt(rest[12], 10, 64)
	const ticksPerSecond = 100 // USER_HZ on Linux
	u.CPU = time.Duration(utime+stime) * time.Second / ticksPerSecond
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return u, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			u.RSS = v << 10
		case "VmHWM:":
			u.PeakRSS = v << 10
		case "RssAnon:":
			u.RSSAnon = v << 10
		case "RssFile:":
			u.RSSFile = v << 10
		}
	}
	return u, nil
}
