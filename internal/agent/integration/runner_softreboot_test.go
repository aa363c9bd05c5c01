package integration_test

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/agent/bootc"
	"github.com/bootc-fleet/bootc-fleet/tests/testbootc"
	"github.com/bootc-fleet/bootc-fleet/tests/testcoord"
)

// A soft reboot under policy AllowSoftReboot: the unlock prepares it
// (--soft-reboot=auto), the agent asks for a soft reboot (not a full one),
// and after it, in the same boot ID with a higher soft-reboot count, the
// grant it spent and any grant written before it are void.
func TestRunSoftRebootsUnderAllowSoftReboot(t *testing.T) {
	h := start(t, "mem-soft", time.Minute)
	ctx := context.Background()
	boot := h.m.BootID()
	h.m.Configure(func(k *testbootc.Knobs) { k.SoftRebootCapable = true })
	if err := h.k.EnsureBootcNode(ctx, h.node, imgV2, fleetv1.RebootPolicyAllowSoftReboot); err != nil {
		t.Fatal(err)
	}
	if _, err := h.k.Grant(ctx, lease.KindStage, 0, h.node, imgV2, boot, ""); err != nil {
		t.Fatal(err)
	}
	h.wait("Staged", testcoord.PhaseIs(fleetv1.PhaseStaged, fleetv1.ReasonWaitingForRebootGrant))
	if err := h.k.Revoke(ctx, lease.KindStage, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := h.k.Grant(ctx, lease.KindReboot, 0, h.node, imgV2, boot, lease.PhaseReboot); err != nil {
		t.Fatal(err)
	}
	h.until("one soft reboot request", func() bool { _, soft := h.host.count(); return soft == 1 })
	h.bootc.mu.Lock()
	applies := append([]bootc.SoftReboot(nil), h.bootc.applies...)
	h.bootc.mu.Unlock()
	if !reflect.DeepEqual(applies, []bootc.SoftReboot{bootc.SoftRebootAuto}) {
		t.Fatalf("unlocks %q, want one with --soft-reboot=auto", applies)
	}
	if st := h.m.State(); st.NextRoot != st.Staged.Digest {
		t.Fatalf("soft reboot not prepared: nextRoot %q, staged %+v", st.NextRoot, st.Staged)
	}

	h.m.SoftReboot(testbootc.RebootOptions{})
	st := h.wait("Idle after the soft reboot", func(s fleetv1.BootcNodeStatus) bool {
		return s.SoftRebootCount == 1 && s.Phase == fleetv1.PhaseIdle
	})
	if st.BootID != boot || st.Booted == nil || st.Booted.Image != imgV2 || len(st.Grants) != 0 {
		t.Fatalf("after the soft reboot: boot %s (want %s), booted %+v, grants %+v (want none listed)", st.BootID, boot, st.Booted, st.Grants)
	}

	// The pool moves on; a grant written with the pre-soft-reboot count (an
	// absent annotation is 0) is void in boot <boot>/1.
	if err := h.k.EnsureBootcNode(ctx, h.node, imgV3, fleetv1.RebootPolicyAllowSoftReboot); err != nil {
		t.Fatal(err)
	}
	stale, err := h.k.Grant(ctx, lease.KindStage, 0, h.node, imgV3, boot, "")
	if err != nil {
		t.Fatal(err)
	}
	// Void in this boot: not used, and not listed (the coordinator hands its
	// slot on, amendment 31); the agent waits for a grant of this boot.
	st = h.wait("waiting for a stage grant of this boot", func(s fleetv1.BootcNodeStatus) bool {
		return testcoord.PhaseIs(fleetv1.PhaseWaiting, fleetv1.ReasonWaitingForStageGrant)(s) && s.Message != "" && strings.Contains(s.Message, "sha256:3333")
	})
	if _, listed := lease.FindClaim(st.Grants, stale); listed {
		t.Fatalf("the pre-soft-reboot grant is listed: %+v", st.Grants)
	}
	if n, _ := h.bootc.counts(); n != 1 {
		t.Fatalf("%d switches, want 1: staged under a grant of the boot before the soft reboot", n)
	}
	if r, soft := h.host.count(); r != 0 || soft != 1 {
		t.Fatalf("%d reboots and %d soft reboots, want 0 and 1", r, soft)
	}
}
