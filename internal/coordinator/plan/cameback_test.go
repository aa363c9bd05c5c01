package plan

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// A node that came back within rebootTimeout is done with the reboot
// timeout: a NotReady blip during minReadySeconds, even after rebootTimeout
// (counted from phase Reboot) has passed, restarts only the minReadySeconds
// clock; it is never marked RebootTimeout and never halts the pool.
func TestBlipAfterRebootTimeoutRestartsOnlyMinReady(t *testing.T) {
	w := stagedWorld(2, 1)
	w.pool.Spec.Rollout.MinReadySeconds = 30 * 60 // longer than rebootTimeout (15m)
	w.step()
	rebootAndReturn(t, w, "node-00")
	if out := w.step(); len(changes(out, OpMarkBack, lease.KindReboot)) != 1 {
		t.Fatalf("node back: not marked %+v", out.Changes)
	}
	// 16 minutes after phase Reboot the node blips NotReady.
	w.now = w.now.Add(16 * time.Minute)
	w.nodes["node-00"].Ready = false
	out := w.step()
	if mf := changes(out, OpMarkFailed, lease.KindReboot); len(mf) != 0 || hasEvent(out, fleetv1.EventRebootTimeout, "") {
		t.Fatalf("a node that came back in time was marked %+v, events %+v", mf, out.Events)
	}
	if mb := changes(out, OpMarkBack, lease.KindReboot); len(mb) != 1 || !mb[0].BackSince.IsZero() {
		t.Fatalf("blip: the minReadySeconds clock was not cleared: %+v", out.Changes)
	}
	if out.Status.Failures != 0 || cond(out, fleetv1.PoolHalted).Status == metav1.ConditionTrue {
		t.Fatalf("blip counted as a failure: failures %d, conditions %+v", out.Status.Failures, out.Status.Conditions)
	}
	// Still NotReady a while later: still no timeout.
	w.now = w.now.Add(20 * time.Minute)
	if out := w.step(); len(changes(out, OpMarkFailed, lease.KindReboot)) != 0 {
		t.Fatalf("marked failed while not back after having come back: %+v", out.Changes)
	}
	// Ready again: the minReadySeconds clock starts over, then the slot goes.
	w.nodes["node-00"].Ready = true
	w.agentReports("node-00", imgV1, imageref.Pinned{}, fleetv1.PhaseIdle)
	if out := w.step(); len(changes(out, OpMarkBack, lease.KindReboot)) != 1 {
		t.Fatalf("back again: not marked %+v", out.Changes)
	}
	w.now = w.now.Add(29 * time.Minute)
	if out := w.step(); len(changes(out, OpRelease, lease.KindReboot)) != 0 {
		t.Fatal("released before minReadySeconds after the blip")
	}
	w.now = w.now.Add(2 * time.Minute)
	out = w.step()
	if r := changes(out, OpRelease, lease.KindReboot); len(r) != 1 || r[0].Why != WhyVerified {
		t.Fatalf("not released after minReadySeconds: %+v", out.Changes)
	}
	if out.Status.Failures != 0 {
		t.Fatalf("failures %d", out.Status.Failures)
	}
}

// A node that never came back still times out, minReadySeconds or not.
func TestNeverBackStillTimesOutWithMinReady(t *testing.T) {
	w := stagedWorld(2, 1)
	w.pool.Spec.Rollout.MinReadySeconds = 30 * 60
	w.step()
	rebootAndReturn(t, w, "node-00")
	w.nodes["node-00"].Ready = false // never seen back
	w.now = w.now.Add(16 * time.Minute)
	out := w.step()
	if mf := changes(out, OpMarkFailed, lease.KindReboot); len(mf) != 1 || mf[0].Failure != fleetv1.ReasonRebootTimeout {
		t.Fatalf("not marked failed: %+v", out.Changes)
	}
}
