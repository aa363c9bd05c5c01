package integration

import (
	"context"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/agent/record"
	"github.com/bootc-fleet/bootc-fleet/tests/testbootc"
	"github.com/bootc-fleet/bootc-fleet/tests/testcoord"
)

// updatedToV2 runs the agent on a node, rolls it from v1 to v2 under grants
// and returns it Idle on v2 (v1 its rollback deployment) in its new boot.
func updatedToV2(t *testing.T, name string) (*node, string) {
	t.Helper()
	n := newNode(t, name)
	n.start()
	n.grant(lease.KindStage, imgV2, "")
	n.wait("Staged", testcoord.PhaseIs(fleetv1.PhaseStaged, fleetv1.ReasonWaitingForRebootGrant))
	if err := n.k.Revoke(context.Background(), lease.KindStage, 0); err != nil {
		t.Fatal(err)
	}
	n.grant(lease.KindReboot, imgV2, lease.PhaseReboot)
	n.until("the update's reboot", func() bool { return n.login.Reboots() == 1 })
	boot, err := n.dir.Reboot(testbootc.RebootOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st := n.wait("Idle on v2", testcoord.PhaseIs(fleetv1.PhaseIdle, fleetv1.ReasonUpToDate))
	if st.Booted == nil || st.Booted.Digest != digestOf(imgV2) || st.Rollback == nil || st.Rollback.Digest != digestOf(imgV1) {
		t.Fatalf("after the update: booted %+v rollback %+v", st.Booted, st.Rollback)
	}
	return n, boot
}

// rollbacks returns the `bootc rollback` command lines the agent ran.
func (n *node) rollbacks() [][]string {
	inv, err := n.dir.Invocations()
	if err != nil {
		n.t.Fatal(err)
	}
	var out [][]string
	for _, i := range inv {
		if len(i.Args) > 0 && i.Args[0] == "rollback" && !slices.Contains(i.Args, "--help") {
			out = append(out, i.Args)
		}
	}
	return out
}

// The real agent under a rollback grant for its rollback deployment (v1)
// runs `bootc rollback` once, with nothing but the command on its command
// line, reboots once through logind, and is back Idle on v1 after the
// reboot (docs/design.md, amendment 25).
func TestAgentRollsBackUnderARollbackGrant(t *testing.T) {
	n, boot := updatedToV2(t, "it-rb")
	ctx := context.Background()
	if err := n.k.EnsureBootcNode(ctx, n.name, imgV1, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := n.k.GrantRollback(ctx, 0, n.name, imgV1, boot); err != nil {
		t.Fatal(err)
	}
	n.until("the rollback's reboot", func() bool { return n.login.Reboots() == 2 })
	m, err := n.dir.Machine()
	if err != nil {
		t.Fatal(err)
	}
	if !m.State().RollbackQueued {
		t.Fatalf("rebooted without the rollback queued: %+v", m.State())
	}
	if rb := n.rollbacks(); len(rb) != 1 || len(rb[0]) != 1 {
		t.Fatalf("bootc rollback ran as %q, want once, plain", rb)
	}
	if _, err := n.dir.Reboot(testbootc.RebootOptions{}); err != nil {
		t.Fatal(err)
	}
	st := n.wait("Idle on v1", testcoord.PhaseIs(fleetv1.PhaseIdle, fleetv1.ReasonUpToDate))
	if st.Booted == nil || st.Booted.Digest != digestOf(imgV1) {
		t.Fatalf("booted %+v after the rollback, want v1", st.Booted)
	}
	if r := n.login.Reboots(); r != 2 || len(n.rollbacks()) != 1 {
		t.Fatalf("%d reboots, %d rollbacks; want 2 and 1", r, len(n.rollbacks()))
	}
}

// An agent that stopped between `bootc rollback` and the reboot finds its
// rollback record in the same boot and the rollback queued: it reboots
// under the same grant without running `bootc rollback` again, which would
// revert the queued rollback (bootc crates/lib/src/deploy.rs, rollback).
func TestAgentRollbackSurvivesACrashBeforeTheReboot(t *testing.T) {
	n, boot := updatedToV2(t, "it-rbcrash")
	ctx := context.Background()
	if code := n.stop(syscall.SIGKILL); code == 0 {
		t.Fatal("the killed agent exited 0")
	}
	if err := n.k.EnsureBootcNode(ctx, n.name, imgV1, ""); err != nil {
		t.Fatal(err)
	}
	id, err := n.k.GrantRollback(ctx, 0, n.name, imgV1, boot)
	if err != nil {
		t.Fatal(err)
	}
	// What the agent had done when it died: the record, then the rollback.
	if err := (record.Store{Dir: n.state}).Write(record.Record{Grant: id, Image: imgV1, BootID: boot, Rollback: true,
		Recorded: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := n.dir.Update(func(m *testbootc.Machine) error { _, err := m.Rollback(""); return err }); err != nil {
		t.Fatal(err)
	}
	n.start()
	n.until("the rollback's reboot", func() bool { return n.login.Reboots() == 2 })
	m, err := n.dir.Machine()
	if err != nil {
		t.Fatal(err)
	}
	if !m.State().RollbackQueued || len(n.rollbacks()) != 0 {
		t.Fatalf("rollback queued %v, %d bootc rollback runs; want queued, none", m.State().RollbackQueued, len(n.rollbacks()))
	}
	if _, err := n.dir.Reboot(testbootc.RebootOptions{}); err != nil {
		t.Fatal(err)
	}
	st := n.wait("Idle on v1", testcoord.PhaseIs(fleetv1.PhaseIdle, fleetv1.ReasonUpToDate))
	if st.Booted == nil || st.Booted.Digest != digestOf(imgV1) {
		t.Fatalf("booted %+v after the rollback, want v1", st.Booted)
	}
}
