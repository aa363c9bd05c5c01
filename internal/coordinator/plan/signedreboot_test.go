package plan

import (
	"testing"
	"time"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// requireSignedImages turned on while node-00 holds a reboot grant in phase
// Reboot over an unverified stage. Its agent, once it acts on a spec that
// requires signed images, neither unlocks nor reboots into that stage and
// waits for a stage grant; the coordinator gives none to a slot holder. So
// the coordinator revokes the reboot grant, saying why, once the agent's
// report proves it cannot use it (amendment 21); never before.
func TestRebootGrantOverUnverifiedStageIsRevokedOnceProvablyUnused(t *testing.T) {
	// agentUnderSigned plays the agent's report after it read the spec
	// that requires signed images: still in the grant's boot, the
	// unverified stage still locked, Waiting for a stage grant.
	agentUnderSigned := func(w *world) {
		bn := w.bns["node-00"]
		bn.Generation++
		w.agentReports("node-00", imgV0, imgV1, fleetv1.PhaseWaiting)
		bn.Status.ObservedGeneration = bn.Generation
		bn.Status.Reason = "WaitingForStageGrant"
		bn.Status.Staged.Signature = fleetv1.SignatureInsecure
	}
	for _, c := range []struct {
		name   string
		mutate func(w *world)
		revoke bool
	}{
		{"agent acts on the signed spec, waits with the stage locked", func(*world) {}, true},
		{"agent has not acted on the signed spec yet", func(w *world) { w.bns["node-00"].Status.ObservedGeneration-- }, false},
		{"agent reports Rebooting", func(w *world) { w.bns["node-00"].Status.Phase = fleetv1.PhaseRebooting }, false},
		{"staged deployment unlocked", func(w *world) { w.bns["node-00"].Status.Staged.DownloadOnly = false }, false},
		{"stage verified after all", func(w *world) { w.bns["node-00"].Status.Staged.Signature = fleetv1.SignatureContainerPolicy }, false},
		{"report from another boot", func(w *world) { w.reboot("node-00"); w.agentReports("node-00", imgV0, imgV1, fleetv1.PhaseWaiting) }, false},
		{"BootcNode does not ask for signed images", func(w *world) { w.bns["node-00"].Spec.RequireSignedImages = false }, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := rebootingWorld(t, false)
			w.pool.Spec.RequireSignedImages = true
			w.now = w.now.Add(time.Second)
			w.step() // the BootcNodes ask for signed images
			if !w.bns["node-00"].Spec.RequireSignedImages {
				t.Fatal("setup: BootcNode spec not updated")
			}
			agentUnderSigned(w)
			c.mutate(w)
			out := w.step()
			rv := changes(out, OpRevoke, lease.KindReboot)
			if got := len(rv) == 1; got != c.revoke {
				t.Fatalf("revoked %v, want %v (changes %+v)", got, c.revoke, out.Changes)
			}
			if !c.revoke {
				return
			}
			if rv[0].Why != WhyStagedUnverified || !rv[0].Uncordon || rv[0].Node != "node-00" {
				t.Fatalf("revoke %+v, want Why %s, uncordoning our cordon", rv[0], WhyStagedUnverified)
			}
			if !hasEvent(out, fleetv1.EventStagedNotVerified, "not verified") {
				t.Fatalf("no %s Event saying why: %+v", fleetv1.EventStagedNotVerified, out.Events)
			}
			// Then it is staged again, verified, and granted again; no
			// RebootTimeout ever, no failure.
			w.now = w.now.Add(20 * time.Minute)
			out = w.step()
			if len(changes(out, OpMarkFailed, lease.KindReboot)) != 0 || out.Status.Failures != 0 {
				t.Fatalf("marked failed after the revoke: %+v, failures %d", out.Changes, out.Status.Failures)
			}
			if _, ok := w.grantOf("node-00", lease.KindStage); !ok {
				t.Fatalf("node-00 got no stage grant to stage again with enforcement: %+v", out.Changes)
			}
		})
	}
}

// While the revoke is not provably safe, the reboot timeout still judges
// the grant, and says it never rebooted because its stage is unverified
// (not that it "did not come back").
func TestRebootTimeoutOverUnverifiedStageSaysWhy(t *testing.T) {
	w := rebootingWorld(t, false)
	w.pool.Spec.RequireSignedImages = true
	w.step()
	w.agentReports("node-00", imgV0, imgV1, fleetv1.PhaseStaged) // not acting on the signed spec yet
	w.bns["node-00"].Status.Staged.Signature = fleetv1.SignatureInsecure
	w.now = w.now.Add(16 * time.Minute)
	out := w.step()
	if len(changes(out, OpMarkFailed, lease.KindReboot)) != 1 || !hasEvent(out, fleetv1.EventRebootTimeout, "not verified by the container signature policy") {
		t.Fatalf("changes %+v events %+v", out.Changes, out.Events)
	}
}
