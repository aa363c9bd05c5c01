package integration_test

import (
	"context"
	"github.com/bootc-fleet/bootc-fleet/tests/testcoord"
	"strings"
	"testing"
	"time"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// A staged deployment that bootc did not verify is not staged once the
// pool requires signed images: a reboot grant does not reboot into it; a
// stage grant stages it again with --enforce-container-sigpolicy, and only
// then does the agent reboot (docs/design.md, amendment 14).
func TestRunRequireSignedImagesRestagesUnverified(t *testing.T) {
	h := start(t, "mem-signed", time.Minute)
	ctx := context.Background()
	boot := h.m.BootID()
	if _, err := h.k.Grant(ctx, lease.KindStage, 0, h.node, imgV2, boot, ""); err != nil {
		t.Fatal(err)
	}
	st := h.wait("Staged unverified", testcoord.PhaseIs(fleetv1.PhaseStaged, fleetv1.ReasonWaitingForRebootGrant))
	if st.Staged == nil || st.Staged.Signature != fleetv1.SignatureInsecure {
		t.Fatalf("staged %+v, want signature Insecure", st.Staged)
	}
	if err := h.k.Revoke(ctx, lease.KindStage, 0); err != nil {
		t.Fatal(err)
	}

	if err := h.k.SetRequireSignedImages(ctx, h.node, true); err != nil {
		t.Fatal(err)
	}
	if _, err := h.k.Grant(ctx, lease.KindReboot, 0, h.node, imgV2, boot, lease.PhaseReboot); err != nil {
		t.Fatal(err)
	}
	st = h.wait("waiting for a stage slot", testcoord.PhaseIs(fleetv1.PhaseWaiting, fleetv1.ReasonWaitingForStageGrant))
	if !strings.Contains(st.Message, "not verified") {
		t.Fatalf("message %q does not say the staged deployment is not verified", st.Message)
	}
	time.Sleep(2 * time.Second) // several rounds under the reboot grant
	if r, s := h.host.count(); r+s != 0 {
		t.Fatalf("rebooted into an unverified staged deployment (%d reboots, %d soft)", r, s)
	}
	if s := h.m.State().Staged; s == nil || !s.DownloadOnly {
		t.Fatalf("the unverified staged deployment was unlocked: %+v", s)
	}

	if _, err := h.k.Grant(ctx, lease.KindStage, 0, h.node, imgV2, boot, ""); err != nil {
		t.Fatal(err)
	}
	h.until("a reboot after the enforced stage", func() bool { r, _ := h.host.count(); return r == 1 })
	if s := h.m.State().Staged; s == nil || s.Signature != "containerPolicy" || s.DownloadOnly {
		t.Fatalf("staged %+v, want the enforced origin, unlocked for the reboot", s)
	}
	var enforced int
	for _, inv := range h.bootc.mem.Invocations() {
		a := strings.Join(inv.Args, " ")
		if strings.HasPrefix(a, "switch ") && !strings.HasSuffix(a, "--help") {
			if strings.Contains(a, "--enforce-container-sigpolicy") {
				enforced++
			} else if enforced > 0 {
				t.Fatalf("switch without enforcement after requireSignedImages: %q", a)
			}
		}
	}
	if enforced != 1 {
		t.Fatalf("%d enforced switches, want 1", enforced)
	}
}
