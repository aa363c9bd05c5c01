package plan

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

func rolloutOf(w *world, name string) (string, string) {
	bn := w.bns[name]
	return bn.Annotations[fleetv1.AnnotationRolloutState], bn.Annotations[fleetv1.AnnotationRolloutReason]
}

// Every node says why it is where it is, in the BootcNode's rollout
// annotations, after the pass that put it there.
func TestEveryNodeSaysWhy(t *testing.T) {
	for _, c := range []struct {
		name      string
		world     func() *world
		node      string
		state     string
		reasonHas string
	}{
		{"waiting for a stage slot", func() *world { w := settled(3, 1, 1); w.step(); return w }, "node-02", fleetv1.RolloutWaitingForStageSlot, "waiting for a stage slot: maxStaging 1"},
		{"staging", func() *world { w := settled(3, 1, 1); w.step(); return w }, "node-00", fleetv1.RolloutStaging, "downloading and staging quay.io/example/os@sha256:111111111111… under stage slot workers-stage-0"},
		{"staged, waiting for a reboot slot", func() *world { w := stagedWorld(3, 1); w.step(); return w }, "node-02", fleetv1.RolloutWaitingForRebootSlot, "waiting for a reboot slot: maxUnavailable 1"},
		{"draining", func() *world { w := stagedWorld(3, 1); w.step(); return w }, "node-00", fleetv1.RolloutDraining, "cordoned and draining for reboot slot workers-reboot-0"},
		{"drain blocked", func() *world {
			w := stagedWorld(1, 1)
			w.step()
			s, _ := w.grantOf("node-00", lease.KindReboot)
			w.drains["node-00"] = Drain{Grant: s.Grant.ID, State: DrainFailed, Message: "PodDisruptionBudget shop/web allows 0 disruptions"}
			w.step()
			return w
		}, "node-00", fleetv1.RolloutDraining, "drain blocked, retrying: PodDisruptionBudget shop/web allows 0 disruptions"},
		{"rebooting", func() *world {
			w := stagedWorld(1, 1)
			w.step()
			s, _ := w.grantOf("node-00", lease.KindReboot)
			w.drains["node-00"] = Drain{Grant: s.Grant.ID, State: DrainDone}
			w.step()
			w.step()
			return w
		}, "node-00", fleetv1.RolloutRebooting, "rebooting into"},
		{"updated", func() *world {
			w := settled(1, 1, 1)
			w.agentReports("node-00", imgV1, imageref.Pinned{}, fleetv1.PhaseIdle)
			w.step()
			return w
		}, "node-00", fleetv1.RolloutUpdated, "runs quay.io/example/os@sha256:111111111111…"},
		{"held", func() *world {
			w := stagedWorld(1, 1)
			w.nodes["node-00"].Held, w.nodes["node-00"].HoldReason = true, "RMA 4711"
			w.step()
			return w
		}, "node-00", fleetv1.RolloutHeld, "held out of the rollout by the Node annotation fleet.bootc.dev/hold (RMA 4711)"},
		{"paused", func() *world { w := stagedWorld(1, 1); w.pool.Spec.Rollout.Paused = true; w.step(); return w }, "node-00", fleetv1.RolloutBlocked, "the rollout is paused"},
		{"outside the window", func() *world {
			w := stagedWorld(1, 1)
			windowed(w, win("02:00", time.Hour, ""))
			w.step()
			return w
		}, "node-00", fleetv1.RolloutBlocked, "outside the maintenance windows; the next opens at"},
		{"halted", func() *world {
			w := stagedWorld(2, 2)
			w.pool.Spec.RequireSignedImages = true
			w.bns["node-01"].Status.Staged.Signature = fleetv1.SignatureContainerPolicy
			w.agentReports("node-00", imgV0, imgV0, fleetv1.PhaseDegraded)
			w.bns["node-00"].Status.Staged = nil
			w.bns["node-00"].Status.Reason = fleetv1.ReasonSignatureRejected
			w.bns["node-00"].Status.Message = "Source image rejected: A signature was required, but no signature exists"
			w.bns["node-01"].Status.Staged.Signature = fleetv1.SignatureContainerPolicy
			w.step()
			return w
		}, "node-01", fleetv1.RolloutBlocked, "the rollout is halted: 1 failure(s) reached haltAfterFailures 1"},
		{"signature rejected", func() *world {
			w := stagedWorld(1, 1)
			w.agentReports("node-00", imgV0, imgV0, fleetv1.PhaseDegraded)
			w.bns["node-00"].Status.Staged = nil
			w.bns["node-00"].Status.Reason = fleetv1.ReasonSignatureRejected
			w.bns["node-00"].Status.Message = "Source image rejected: A signature was required, but no signature exists"
			w.step()
			return w
		}, "node-00", fleetv1.RolloutFailed, "the host's signature policy rejected the image: Source image rejected"},
		{"no report in this boot", func() *world {
			w := settled(1, 1, 1)
			w.nodes["node-00"].BootID = bootID("node-00", 7)
			w.step()
			return w
		}, "node-00", fleetv1.RolloutUnknown, "no report from its agent"},
		{"pause between batches", func() *world {
			w := stagedWorld(2, 1)
			w.pool.Spec.Rollout.PauseBetweenBatches = &metav1.Duration{Duration: time.Hour}
			w.step()
			rebootAndReturn(t, w, "node-00")
			w.step()
			return w
		}, "node-01", fleetv1.RolloutWaitingForRebootSlot, "staged; pausing between batches until"},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := c.world()
			state, reason := rolloutOf(w, c.node)
			if state != c.state || !strings.Contains(reason, c.reasonHas) {
				t.Fatalf("%s: %s %q, want %s with %q", c.node, state, reason, c.state, c.reasonHas)
			}
			if len(reason) > fleetv1.MaxRolloutReason {
				t.Fatalf("reason of %d bytes", len(reason))
			}
			// Unchanged world, unchanged words: no write on the next pass.
			for _, u := range w.plan().UpdateBootcNodes {
				if u.Name == c.node {
					t.Fatalf("rewrote %s with nothing changed: %+v", c.node, u)
				}
			}
		})
	}
}

// A new target is written to each BootcNode in the same patch as the state
// it leads to, not with "its desired image is being set" and a second
// patch once the cache shows it (amendment 29).
func TestSpecChangeCarriesTheStateItLeadsTo(t *testing.T) {
	w := settled(3, 1, 1)
	w.step() // node-00 is granted the only stage slot
	w.target = imgV2
	out := w.step()
	if len(out.UpdateBootcNodes) != 3 {
		t.Fatalf("BootcNode writes %+v, want the new target for all three", out.UpdateBootcNodes)
	}
	// node-00's stage slot is handed on for v2 in the same pass; the
	// others wait for it.
	for _, c := range out.UpdateBootcNodes {
		want := fleetv1.RolloutWaitingForStageSlot
		if c.Name == "node-00" {
			want = fleetv1.RolloutStaging
		}
		if c.Spec.DesiredImage != imgV2.String() || c.RolloutState != want {
			t.Errorf("%s: desired %s, rollout %s (%s); want %s, %s", c.Name, c.Spec.DesiredImage, c.RolloutState, c.RolloutReason, imgV2, want)
		}
	}
	// Once the cache shows the patch, a node that still waits is not
	// written again.
	out = w.step()
	if len(out.UpdateBootcNodes) != 0 {
		t.Errorf("BootcNodes written again with the state their spec patch carried: %+v", out.UpdateBootcNodes)
	}
}
