package e2e

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/tests/testbootc"
)

// An AllowSoftReboot rollout over two nodes running Debian 13's systemd 257
// as PID 1. On the node whose staged image is soft-reboot capable the agent
// unlocks it with --soft-reboot=auto and asks the node's real logind for
// RebootWithFlags(SD_LOGIND_SOFT_REBOOT); systemd soft-reboots (the
// container and its boot ID stay, SoftRebootsCount becomes 1), the agent
// unit comes back, reads the new count over D-Bus and reports it, and the
// coordinator verifies the soft reboot by it and frees the slot and the
// cordon. The other node's image is not capable: it reboots fully.
func TestSoftRebootUnderSystemd(t *testing.T) {
	SkipIfUnavailable(t)
	const pool = "e2e-soft"
	f := NewFleet(t, Options{Nodes: 2, Prefix: "e2e-soft", Booted: imgOld, Pool: pool, Suite: SuiteTrixie})
	soft, full := f.Nodes[0], f.Nodes[1]
	if err := soft.Bootc.Configure(func(k *testbootc.Knobs) { k.SoftRebootCapable = true }); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	f.Boot()
	boot1 := map[string]BootLog{}
	for _, n := range f.Nodes {
		boot1[n.Name] = awaitAgentActive(ctx, t, n, 1)
	}
	if out, err := soft.Current().Exec(ctx, "systemctl", "show", "-P", "SoftRebootsCount"); err != nil || strings.TrimSpace(out) != "0" {
		t.Fatalf("SoftRebootsCount before the rollout = %q, %v; want 0 (systemd 257)", out, err)
	}

	runRollout(ctx, t, f, "e2e-soft", pool, 2, fleetv1.RebootPolicyAllowSoftReboot)

	st := awaitNodeStatus(ctx, t, f, soft, "booted on the target after a soft reboot", func(s fleetv1.BootcNodeStatus) bool {
		return s.BootID == boot1[soft.Name].BootID && s.SoftRebootCount == 1 && s.Booted != nil &&
			strings.HasSuffix(imgTarget, s.Booted.Digest) && s.Phase == fleetv1.PhaseIdle
	})
	t.Logf("%s reports boot %s, soft-reboot count %d, booted %s", soft.Name, st.BootID, st.SoftRebootCount, st.Booted.Digest)
	awaitNodeStatus(ctx, t, f, full, "booted on the target in a new boot", func(s fleetv1.BootcNodeStatus) bool {
		b := full.Current()
		return b != nil && s.BootID == b.BootID && s.BootID != boot1[full.Name].BootID && s.SoftRebootCount == 0 &&
			s.Booted != nil && strings.HasSuffix(imgTarget, s.Booted.Digest) && s.Phase == fleetv1.PhaseIdle
	})
	if err := soft.Await(ctx, "the pool up to date, slots free, nodes uncordoned", func() (bool, error) {
		var got fleetv1.BootcNodePool
		if err := f.Env.Client.Get(ctx, client.ObjectKey{Name: pool}, &got); err != nil || got.Status.Updated != 2 {
			return false, nil
		}
		return slotsFree(ctx, f, pool) && allSchedulable(ctx, f), nil
	}); err != nil {
		log, _ := os.ReadFile(filepath.Join(string(soft.Bootc), filepath.Base(simSoftRebootLog)))
		t.Fatalf("%v; %s's e2e-soft-reboot.service wrote: %q", err, soft.Name, log)
	}
	t.Logf("rollout of 2 nodes done %s after the test started", time.Since(start).Round(time.Millisecond))
	if log, err := os.ReadFile(filepath.Join(string(soft.Bootc), filepath.Base(simSoftRebootLog))); err != nil || !strings.Contains(string(log), "exit 0") {
		t.Errorf("%s: e2e-soft-reboot.service wrote %q (%v); want its sim-soft-reboot to exit 0", soft.Name, log, err)
	}

	// The soft-rebooted node: one container, one boot ID, two userspaces.
	boots := soft.Boots()
	m, err := soft.Bootc.Machine()
	if err != nil {
		t.Fatal(err)
	}
	ms := m.State()
	if len(boots) != 2 || !boots[1].Soft || boots[1].BootID != boots[0].BootID || boots[1].SoftRebootsCount != 1 || boots[0].Exit != 0 {
		t.Fatalf("%s boots %+v; want the first boot, then one soft reboot in the same container and boot ID", soft.Name, boots)
	}
	if ms.Reboots != 0 || ms.SoftReboots != 1 || ms.Booted == nil || ms.Booted.Image != imgTarget {
		t.Errorf("%s: test bootc played %d reboots and %d soft reboots, booted %+v; want 0, 1, %s", soft.Name, ms.Reboots, ms.SoftReboots, ms.Booted, imgTarget)
	}
	if !slices.ContainsFunc(boots[1].Transitions, func(x Transition) bool { return x.ActiveState == "active" && x.Sub == "running" }) {
		t.Errorf("%s: the agent unit did not come back after the soft reboot: %s", soft.Name, transitions(boots[1].Transitions))
	}
	t.Logf("%s: soft reboot: userspace down for %s, agent active %s after that; agent transitions %s", soft.Name,
		boots[1].Up.Sub(boots[1].Started).Round(time.Millisecond), boots[1].AgentFirstActive.Sub(boots[1].Up).Round(time.Millisecond),
		transitions(boots[1].Transitions))
	b := soft.Current()
	journal, err := b.Exec(ctx, "journalctl", "--no-pager", "-o", "cat", "_PID=1", "+", "_COMM=systemd-logind", "+", "_SYSTEMD_UNIT="+AgentUnit)
	if err != nil {
		t.Fatal(err)
	}
	// What the agent logs after RebootWithFlags returns may be cut off: logind
	// starts the soft reboot, which stops the agent, before it answers.
	for _, want := range []string{
		`msg="soft reboot into `,         // the agent decided on a soft reboot
		"step=soft-reboot",               //   and confirmed its grant right before asking logind
		"System userspace is rebooting.", // logind took the request (SD_LOGIND_SOFT_REBOOT)
		"Soft-reboot finished",           // PID 1 soft-rebooted
		"counter is now at 1",            //   and counted it
	} {
		if !strings.Contains(journal, want) {
			t.Errorf("%s: the journal lacks %q", soft.Name, want)
		}
	}
	if t.Failed() {
		t.Logf("%s journal:\n%s", soft.Name, journal)
	}
	checkUnlocks(t, soft, []string{"upgrade", "--from-downloaded", "--soft-reboot=auto"})

	// The node whose image is not soft-reboot capable rebooted fully.
	fb := full.Boots()
	fm, err := full.Bootc.Machine()
	if err != nil {
		t.Fatal(err)
	}
	if len(fb) != 2 || fb[0].Exit != exitReboot || fb[0].HarnessRebooted || fb[1].Soft || fm.State().Reboots != 1 || fm.State().SoftReboots != 0 {
		t.Errorf("%s boots %+v, machine %+v; want one full reboot by the agent", full.Name, fb, fm.State())
	}
	checkUnlocks(t, full, []string{"upgrade", "--from-downloaded"})

	if most, at := maxDisrupted(f.Events.snapshot()); most > 1 {
		t.Errorf("%d nodes were cordoned or down at once (maxUnavailable 1), at %s", most, at)
	}
}

// checkUnlocks: the agent unlocked exactly once, with exactly these arguments.
func checkUnlocks(t *testing.T, n *Node, want []string) {
	t.Helper()
	inv, err := n.Bootc.Invocations()
	if err != nil {
		t.Fatal(err)
	}
	// Unlocks only: --help is the agent's probe, --download-only the lock
	// step of a stage on bootc 1.16.
	var got [][]string
	for _, i := range inv {
		if len(i.Args) > 0 && i.Args[0] == "upgrade" && slices.Contains(i.Args, "--from-downloaded") {
			got = append(got, i.Args)
		}
	}
	if len(got) != 1 || !slices.Equal(got[0], want) {
		t.Errorf("%s: bootc upgrade --from-downloaded ran as %q, want once as %q", n.Name, got, want)
	}
}
