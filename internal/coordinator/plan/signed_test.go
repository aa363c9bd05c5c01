package plan

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// signedWorld: n nodes with imgV1 staged download-only, in a pool that
// requires signed images; sig is each staged deployment's signature.
func signedWorld(n int, sig fleetv1.ImageSignature) *world {
	w := stagedWorld(n, n)
	w.pool.Spec.RequireSignedImages = true
	for _, name := range sortedKeys(w.nodes) {
		w.bns[name].Status.Staged.Signature = sig
	}
	return w
}

// Under requireSignedImages only a deployment bootc fetched enforcing the
// signature policy is staged for the rollout (amendment 14).
func TestRequireSignedImagesGatesRebootGrants(t *testing.T) {
	for _, c := range []struct {
		sig     fleetv1.ImageSignature
		require bool
		want    bool
	}{
		{fleetv1.SignatureContainerPolicy, true, true},
		{fleetv1.SignatureInsecure, true, false},
		{fleetv1.SignatureUnknown, true, false},
		{fleetv1.SignatureOstreeRemote, true, false},
		{fleetv1.SignatureInsecure, false, true},
		{fleetv1.SignatureUnknown, false, true},
	} {
		t.Run(string(c.sig)+map[bool]string{true: "/required", false: "/not-required"}[c.require], func(t *testing.T) {
			w := signedWorld(1, c.sig)
			w.pool.Spec.RequireSignedImages = c.require
			out := w.plan()
			if got := len(changes(out, OpGrant, lease.KindReboot)) == 1; got != c.want {
				t.Fatalf("reboot grant %v, want %v (changes %+v)", got, c.want, out.Changes)
			}
			// A node not staged for the rollout is offered a stage slot, to
			// fetch the image again with the policy enforced.
			if got := len(changes(out, OpGrant, lease.KindStage)) == 1; got == c.want {
				t.Fatalf("stage grant %v, want %v", got, !c.want)
			}
		})
	}
}

func TestRequireSignedImagesIsCopiedToBootcNodes(t *testing.T) {
	w := settled(2, 1, 1)
	w.pool.Spec.RequireSignedImages = true
	out := w.plan()
	if len(out.UpdateBootcNodes) != 2 {
		t.Fatalf("updates %+v, want both BootcNodes", out.UpdateBootcNodes)
	}
	for _, c := range out.UpdateBootcNodes {
		if !c.Spec.RequireSignedImages || c.Spec.DesiredImage != imgV1.String() {
			t.Fatalf("spec %+v", c.Spec)
		}
	}
}

// A stage slot is finished (amendment 31) when the image is staged as the
// pool asks, not when an unverified deployment of the same digest is.
func TestStageSlotReleasedOnlyWhenStagedVerified(t *testing.T) {
	w := settled(1, 1, 1)
	w.pool.Spec.RequireSignedImages = true
	w.step() // the BootcNode asks for signed images
	w.step()
	s, ok := w.grantOf("node-00", lease.KindStage)
	if !ok {
		t.Fatal("no stage grant")
	}
	w.agentReports("node-00", imgV0, imgV1, fleetv1.PhaseStaging)
	w.bns["node-00"].Status.Staged.Signature = fleetv1.SignatureInsecure
	if out := w.step(); len(changes(out, OpRelease, lease.KindStage)) != 0 {
		t.Fatalf("released stage slot %s for an unverified deployment: %+v", s.Name, out.Changes)
	}
	if s, _ := w.slot(w.leases[s.Name]); s.Phase != PhaseStaging {
		t.Fatalf("stage slot of an unverified deployment is %s, want %s", s.Phase, PhaseStaging)
	}
	w.agentReports("node-00", imgV0, imgV1, fleetv1.PhaseStaged)
	w.bns["node-00"].Status.Staged.Signature = fleetv1.SignatureContainerPolicy
	if s, _ := w.slot(w.leases[s.Name]); s.Phase != PhaseFinished {
		t.Fatalf("stage slot of a verified deployment is %s, want %s", s.Phase, PhaseFinished)
	}
}

// Turned on after the stage, requireSignedImages revokes a Draining grant for
// an unverified deployment: the node is staged again before it reboots.
func TestRequireSignedImagesRevokesDrainingGrantOfUnverifiedStage(t *testing.T) {
	w := signedWorld(1, fleetv1.SignatureInsecure)
	w.pool.Spec.RequireSignedImages = false
	w.step()
	if _, ok := w.grantOf("node-00", lease.KindReboot); !ok {
		t.Fatal("no reboot grant")
	}
	w.pool.Spec.RequireSignedImages = true
	w.agentReports("node-00", imgV0, imgV1, fleetv1.PhaseStaged)
	out := w.step()
	rv := changes(out, OpRevoke, lease.KindReboot)
	if len(rv) != 1 || rv[0].Why != WhyStagedUnverified || !hasEvent(out, fleetv1.EventGrantRevoked, "without enforcing the signature policy") {
		t.Fatalf("changes %+v events %+v, want the reboot grant revoked as StagedUnverified", out.Changes, out.Events)
	}
}

// A node whose signature policy rejected its target is a failure: it halts
// the pool at haltAfterFailures, is named in Halted, and stops counting when
// the target changes.
func TestSignatureRejectionCountsAsFailure(t *testing.T) {
	w := stagedWorld(3, 1)
	w.pool.Spec.RequireSignedImages = true
	for _, name := range sortedKeys(w.nodes) {
		w.bns[name].Status.Staged.Signature = fleetv1.SignatureContainerPolicy
	}
	w.agentReports("node-00", imgV0, imgV0, fleetv1.PhaseDegraded)
	w.bns["node-00"].Status.Staged = nil
	w.bns["node-00"].Status.Reason = fleetv1.ReasonSignatureRejected
	out := w.step()
	if out.Status.Failures != 1 {
		t.Fatalf("failures %d, want 1", out.Status.Failures)
	}
	if c := cond(out, fleetv1.PoolHalted); c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, "node-00 (SignatureRejected)") {
		t.Fatalf("Halted %+v", c)
	}
	if g := changes(out, OpGrant, lease.KindReboot); len(g) != 0 {
		t.Fatalf("reboot grants while halted: %+v", g)
	}
	// Another Degraded reason is no failure.
	w.bns["node-00"].Status.Reason = fleetv1.ReasonStatusUnavailable
	if out := w.step(); out.Status.Failures != 0 || len(changes(out, OpGrant, lease.KindReboot)) != 1 {
		t.Fatalf("failures %d grants %+v, want 0 and a reboot grant", out.Status.Failures, out.Changes)
	}
	// A rejection of an image that is no longer the target is no failure.
	w = stagedWorld(2, 1)
	w.agentReports("node-00", imgV0, imgV0, fleetv1.PhaseDegraded)
	w.bns["node-00"].Status.Staged = nil
	w.bns["node-00"].Status.Reason = fleetv1.ReasonSignatureRejected
	w.bns["node-00"].Spec.DesiredImage = imgV2.String()
	if out := w.plan(); out.Status.Failures != 0 {
		t.Fatalf("failures %d for a rejection of an old target", out.Status.Failures)
	}
}
