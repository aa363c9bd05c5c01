package fleet

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/sim"
	"github.com/bootc-fleet/bootc-fleet/tests/envtest"
	"github.com/bootc-fleet/bootc-fleet/tests/fakedbus"
)

// startProcFleet builds the binaries and starts a process fleet for t,
// skipping when the API server or dbus-daemon is missing (unless required).
func startProcFleet(t *testing.T, opts sim.ProcOptions) *sim.ProcFleet {
	t.Helper()
	env := envtest.Start(t)
	if _, err := os.Stat(fakedbus.DaemonPath); err != nil && os.Getenv("BOOTC_FLEET_REQUIRE_DBUS") != "1" {
		t.Skipf("skipping: %v", fakedbus.ErrNoDaemon)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bin, err := sim.BuildProcBinaries(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	opts.Env, opts.Bin, opts.Dir = env, bin, t.TempDir()
	f, err := sim.StartProcFleet(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		f.Close()
		if t.Failed() {
			logTail(t, "coordinator", f.CoordinatorLog)
			for _, n := range f.Nodes {
				logTail(t, n.Name+" agent", n.AgentLog)
			}
		}
	})
	return f
}

func logTail(t *testing.T, what, path string) {
	b, err := os.ReadFile(path)
	if err != nil {
		return
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 40 {
		lines = lines[len(lines)-40:]
	}
	t.Logf("%s (last %d lines of %s):\n%s", what, len(lines), path, strings.Join(lines, "\n"))
}

// waitConverged polls until the fleet converged on target or the bound passes.
func waitConverged(t *testing.T, f *sim.ProcFleet, target string, bound time.Duration) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(bound)
	for {
		ok, pending := f.Converged(ctx, target)
		if ok {
			return
		}
		if time.Now().After(deadline) {
			st, _ := f.PoolStatus(ctx)
			t.Fatalf("not converged on %s within %s: %s\npool status: %+v", target, bound, pending, st)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func TestProcFleetHappyPath(t *testing.T) {
	f := startProcFleet(t, sim.ProcOptions{Nodes: 6, StageTime: 300 * time.Millisecond})
	ctx := context.Background()
	v2, err := f.Push("v2")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.CreatePool(ctx, "v2", 2, 2); err != nil {
		t.Fatal(err)
	}
	created := time.Now()
	waitConverged(t, f, v2, 3*time.Minute)
	t.Logf("6 nodes converged on v2 %s after the pool was created", time.Since(created).Round(100*time.Millisecond))

	checkOneRebootEach(t, f, v2)
	for _, n := range f.Nodes {
		for _, r := range n.RebootTimings() {
			t.Logf("%s: reboot %s -> %s: agent stopped after %s, up after %s, agent ready after %s", n.Name,
				short8(r.From), short8(r.To), r.AgentStopped.Sub(r.Requested).Round(time.Millisecond),
				r.Booted.Sub(r.Requested).Round(time.Millisecond), r.AgentReady.Sub(r.Requested).Round(time.Millisecond))
		}
	}
	if t.Failed() {
		for _, e := range f.Log.Events() {
			t.Logf("%s", e)
		}
	}
}

// The real agent binary soft-reboots through the fake logind on its private
// bus (RebootWithFlags with SD_LOGIND_SOFT_REBOOT); the real coordinator
// verifies it by the soft-reboot count and frees every slot and cordon.
func TestProcFleetSoftReboot(t *testing.T) {
	f := startProcFleet(t, sim.ProcOptions{Nodes: 3, StageTime: 200 * time.Millisecond,
		RebootPolicy: fleetv1.RebootPolicyAllowSoftReboot, SoftRebootCapable: true})
	ctx := context.Background()
	v2, err := f.Push("v2")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.CreatePool(ctx, "v2", 1, 3); err != nil {
		t.Fatal(err)
	}
	waitConverged(t, f, v2, 3*time.Minute)
	for _, v := range f.Check(ctx, v2) {
		t.Errorf("%s", v)
	}
	if err := f.CheckInvocations(); err != nil {
		t.Errorf("events and test bootc disagree: %v", err)
	}
	reboots, soft := f.Reboots(), f.SoftReboots()
	for _, n := range f.Nodes {
		m, err := n.Bootc.Machine()
		if err != nil {
			t.Fatal(err)
		}
		st := m.State()
		calls := n.Login.RebootCalls()
		if reboots[n.Name] != 1 || soft[n.Name] != 1 || st.Reboots != 0 || st.SoftReboots != 1 || len(calls) != 1 ||
			calls[0].Flags != fakedbus.FlagSoftReboot || calls[0].Interactive || len(n.Systemd.Started()) != 0 {
			t.Errorf("%s: %d logged reboots (%d soft), machine %d full / %d soft, logind calls %+v, units started %v; want one non-interactive RebootWithFlags(SD_LOGIND_SOFT_REBOOT) and nothing else",
				n.Name, reboots[n.Name], soft[n.Name], st.Reboots, st.SoftReboots, calls, n.Systemd.Started())
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		held, cordoned := len(f.BusySlots(ctx)), 0 // finished stage slots stay held (amendment 31)
		nodes, err := f.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range nodes.Items {
			if n.Spec.Unschedulable {
				cordoned++
			}
		}
		if held+cordoned == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d slots held and %d nodes cordoned 30s after convergence", held, cordoned)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if t.Failed() {
		for _, e := range f.Log.Events() {
			t.Logf("%s", e)
		}
	}
}

func short8(s string) string {
	if len(s) > 8 {
		return s[:8]
	}
	return s
}

// checkOneRebootEach checks I1-I5 on target, that the event log and the
// test bootc agree, and that every node is booted on target after exactly
// one reboot, counted three ways: the event log, the machine, and logind.
func checkOneRebootEach(t *testing.T, f *sim.ProcFleet, target string) {
	t.Helper()
	for _, v := range f.Check(context.Background(), target) {
		t.Errorf("%s", v)
	}
	if err := f.CheckInvocations(); err != nil {
		t.Errorf("events and test bootc disagree: %v", err)
	}
	reboots := f.Reboots()
	for _, n := range f.Nodes {
		m, err := n.Bootc.Machine()
		if err != nil {
			t.Fatal(err)
		}
		st := m.State()
		if st.Booted == nil || st.Booted.Image != target {
			t.Errorf("%s booted %+v, want %s", n.Name, st.Booted, target)
		}
		if reboots[n.Name] != 1 || st.Reboots != 1 || len(n.Login.RebootArgs()) != 1 {
			t.Errorf("%s: %d logged reboots, %d machine reboots, %d logind calls; want exactly 1",
				n.Name, reboots[n.Name], st.Reboots, len(n.Login.RebootArgs()))
		}
	}
}
