package plan

import (
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"k8s.io/utils/ptr"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/health"
)

// stepWith plans once with the input as edit leaves it, and applies.
func stepWith(w *world, edit func(in *Input)) Output {
	in := w.input()
	edit(&in)
	out := Plan(in)
	w.apply(out)
	return out
}

// gateWorld: n nodes staged on v1, a host gate of timeout 1m, node-00
// rebooted under its grant and back on v1 (its rollback deployment v0).
func gateWorld(t *testing.T, n int, policy fleetv1.FailurePolicy) *world {
	t.Helper()
	w := stagedWorld(n, 1)
	gatedPool(w, time.Minute, 0, policy)
	w.step() // BootcNodes take spec.health
	w.step() // node-00's reboot grant
	rebootAndReturn(t, w, "node-00")
	if out := w.step(); len(changes(out, OpMarkBack, lease.KindReboot)) != 1 {
		t.Fatalf("node-00 back: not marked back %+v", out.Changes)
	}
	return w
}

// The gate's clock runs from when the node was found back; at
// health.timeout the grant is failed with the first failing check's
// reason (a check with no verdict: the first configured one, not
// reported), the image is quarantined in the same pass, and the pool says
// why.
func TestGateFailsAtTimeoutWithTheFirstFailingCheck(t *testing.T) {
	for _, c := range []struct {
		name    string
		spec    func(h *fleetv1.HealthSpec)
		verdict *health.Verdict
		reason  string
		check   string
	}{
		{"no verdict: the host check not reported", nil, nil, fleetv1.ReasonHostNotReported, "Host"},
		{"no verdict, workloads only", func(h *fleetv1.HealthSpec) {
			h.Host, h.Workloads = nil, &fleetv1.WorkloadHealthCheck{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}}}
		}, nil, fleetv1.ReasonWorkloadsNotReady, "Workloads"},
		{"the first failing of a verdict", nil, &health.Verdict{Results: []health.Result{
			{Check: health.CheckHost, Pass: true},
			{Check: health.CheckWorkloads, Reason: fleetv1.ReasonWorkloadsNotReady, Message: "pod kube-system/agent-x not Ready"},
			{Check: health.CheckMetrics, Reason: fleetv1.ReasonMetricsFiring, Message: "ALERTS{node=node-00}"},
		}}, fleetv1.ReasonWorkloadsNotReady, "pod kube-system/agent-x"},
		{"a reason that is no reason", nil, &health.Verdict{Results: []health.Result{{Check: health.CheckHost, Reason: "not a reason!"}}}, fleetv1.ReasonHostNotReported, "Host"},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := gateWorld(t, 3, fleetv1.OnFailureRollback)
			if c.spec != nil {
				c.spec(w.pool.Spec.Health)
			}
			if c.verdict != nil {
				w.health["node-00"] = *c.verdict
			}
			w.now = w.now.Add(59 * time.Second)
			out := w.step()
			if len(changes(out, OpMarkFailed, lease.KindReboot))+len(changes(out, OpRelease, lease.KindReboot)) != 0 {
				t.Fatalf("before the timeout: %+v", out.Changes)
			}
			if out.RequeueAfter <= 0 || out.RequeueAfter > gateRecheck {
				t.Fatalf("requeue %s, want within %s", out.RequeueAfter, gateRecheck)
			}
			if a := w.bns["node-00"].Annotations; a[fleetv1.AnnotationRolloutState] != string(PhaseVerifying) || !strings.Contains(a[fleetv1.AnnotationRolloutReason], "waiting for its health gate") {
				t.Fatalf("node-00 rollout %q: %q", a[fleetv1.AnnotationRolloutState], a[fleetv1.AnnotationRolloutReason])
			}
			w.now = w.now.Add(2 * time.Second)
			out = w.step()
			mf := changes(out, OpMarkFailed, lease.KindReboot)
			if len(mf) != 1 || mf[0].Failure != c.reason || mf[0].Why != WhyHealthCheckFailed {
				t.Fatalf("at the timeout: %+v, want failed %s", out.Changes, c.reason)
			}
			if a := w.bns["node-00"].Annotations; a[fleetv1.AnnotationRolloutState] != string(PhaseFailed) || !strings.Contains(a[fleetv1.AnnotationRolloutReason], "failed its health gate") {
				t.Fatalf("node-00 rollout %q: %q", a[fleetv1.AnnotationRolloutState], a[fleetv1.AnnotationRolloutReason])
			}
			if !hasEvent(out, fleetv1.EventHealthCheckFailed, "node node-00") || !hasEvent(out, fleetv1.EventHealthCheckFailed, c.check) {
				t.Fatalf("no HealthCheckFailed Event naming node-00 and %q: %+v", c.check, out.Events)
			}
			q := out.Status.Quarantine
			if q == nil || q.Digest != imgV1.String() || q.SpecImage != w.pool.Spec.Image || q.Node != "node-00" || q.Reason != c.reason {
				t.Fatalf("quarantine %+v", q)
			}
			if d := cond(out, fleetv1.PoolDegraded); d.Status != metav1.ConditionTrue || d.Reason != fleetv1.ReasonImageFailedHealthCheck {
				t.Fatalf("Degraded %+v", d)
			}
			if p := cond(out, fleetv1.PoolProgressing); p.Status != metav1.ConditionFalse || p.Reason != fleetv1.ReasonImageFailedHealthCheck {
				t.Fatalf("Progressing %+v", p)
			}
			for _, bc := range out.UpdateBootcNodes {
				if bc.Name != "node-00" && bc.Spec.DesiredImage != "" {
					t.Fatalf("%s keeps desired image %s under quarantine", bc.Name, bc.Spec.DesiredImage)
				}
			}
		})
	}
}

// failGate runs gateWorld's node-00 into its gate's timeout.
func failGate(t *testing.T, w *world) {
	t.Helper()
	w.health["node-00"] = hostFailed
	w.now = w.now.Add(2 * time.Minute)
	if out := w.step(); len(changes(out, OpMarkFailed, lease.KindReboot)) != 1 {
		t.Fatalf("gate not failed: %+v", out.Changes)
	}
}

// The failed grant's slot is re-issued as a rollback grant: a new grant
// (leaseTransitions+1) with the purpose Rollback, for the node's rollback
// deployment and current boot, keeping the failed grant's cordon record;
// the node's desired image is that image. Back on it (no gate), the slot is
// released and the node uncordoned.
func TestRollbackGrantTermsAndRelease(t *testing.T) {
	w := gateWorld(t, 3, fleetv1.OnFailureRollback)
	failGate(t, w)
	failed, _ := w.grantOf("node-00", lease.KindReboot)
	out := w.step()
	gr := changes(out, OpGrant, lease.KindReboot)
	if len(gr) != 1 || !gr[0].Rollback || gr[0].Image != imgV0 || gr[0].Node != "node-00" || gr[0].Cordon != failed.Grant.Cordon ||
		gr[0].BootID != w.nodes["node-00"].BootID || gr[0].Why != WhyRollback {
		t.Fatalf("rollback grant %+v (failed grant cordon %q)", gr, failed.Grant.Cordon)
	}
	s, _ := w.grantOf("node-00", lease.KindReboot)
	g := s.Grant
	if !g.Rollback || g.Transitions != failed.Grant.Transitions+1 || g.Failure != "" || g.Phase != lease.PhaseDraining || g.Cordon != lease.CordonOurs || !s.CordonedByUs {
		t.Fatalf("rollback grant as read: %+v", g)
	}
	if g.Allows(lease.Check{Node: "node-00", Action: lease.ActionReboot, Image: imgV0.String(), BootID: g.BootID}) == nil {
		t.Fatal("a rollback grant allows an update reboot")
	}
	if d := w.bns["node-00"].Spec.DesiredImage; d != imgV0.String() {
		t.Fatalf("node-00 desired %q, want v0", d)
	}
	if !hasEvent(out, fleetv1.EventRollbackGranted, "node-00") || out.Status.Failures != 0 {
		t.Fatalf("events %+v, failures %d", out.Events, out.Status.Failures)
	}
	// explain tells the story: the node rolls back, the others wait on the
	// quarantine.
	if a := w.bns["node-00"].Annotations; a[fleetv1.AnnotationRolloutState] != string(PhaseDraining) || !strings.Contains(a[fleetv1.AnnotationRolloutReason], "rollback grant") {
		t.Fatalf("node-00 rollout %q: %q", a[fleetv1.AnnotationRolloutState], a[fleetv1.AnnotationRolloutReason])
	}
	if a := w.bns["node-01"].Annotations; a[fleetv1.AnnotationRolloutState] != fleetv1.RolloutBlocked || !strings.Contains(a[fleetv1.AnnotationRolloutReason], "quarantined: node node-00 failed on it (HostUnitFailed)") {
		t.Fatalf("node-01 rollout %q: %q", a[fleetv1.AnnotationRolloutState], a[fleetv1.AnnotationRolloutReason])
	}
	for i := 0; i < 4; i++ {
		w.idealWorld()
		w.now = w.now.Add(10 * time.Second)
		out = w.step()
		if r := changes(out, OpRelease, lease.KindReboot); len(r) == 1 {
			if r[0].Why != WhyRolledBack || !r[0].Uncordon || !hasEvent(out, fleetv1.EventRolledBack, "node-00") {
				t.Fatalf("release %+v, events %+v", r, out.Events)
			}
			if bootedOf(w.bns["node-00"]) != imgV0 || w.nodes["node-00"].Unschedulable {
				t.Fatalf("node-00 booted %v, cordoned %v", bootedOf(w.bns["node-00"]), w.nodes["node-00"].Unschedulable)
			}
			if len(changes(out, OpGrant, lease.KindReboot)) != 0 || out.Status.Quarantine == nil {
				t.Fatalf("after the rollback: %+v, quarantine %+v", out.Changes, out.Status.Quarantine)
			}
			return
		}
	}
	t.Fatalf("rollback grant never released: %+v", w.leases)
}

// A failed gate that the next pass rolls back does not halt the pool in
// the pass it fails: no Halted condition or Event saying the node was not
// rolled back, no failure counted, while the rollback is on its way.
func TestAGateFailureToBeRolledBackDoesNotHalt(t *testing.T) {
	w := gateWorld(t, 3, fleetv1.OnFailureRollback)
	w.health["node-00"] = hostFailed
	w.now = w.now.Add(2 * time.Minute)
	for i, what := range []string{"the pass the gate fails", "the pass of the rollback grant"} {
		out := w.step()
		if want := []int{1, 0}[i]; len(changes(out, OpMarkFailed, lease.KindReboot)) != want {
			t.Fatalf("%s: %+v", what, out.Changes)
		}
		if h := cond(out, fleetv1.PoolHalted); h.Status == metav1.ConditionTrue || hasEvent(out, fleetv1.EventHalted, "") || out.Status.Failures != 0 {
			t.Fatalf("%s: Halted %+v, failures %d, events %+v", what, h, out.Status.Failures, out.Events)
		}
	}
	if s, _ := w.grantOf("node-00", lease.KindReboot); !s.Grant.Rollback {
		t.Fatalf("no rollback grant: %+v", s)
	}
}

// With onFailure Halt, the failed node stays held, and the pool's Halted
// condition and the node's explanation say what the operator does: the
// node is not released by coming back, it is on the image already.
func TestAGateFailureUnderHaltSaysWhatToDo(t *testing.T) {
	w := gateWorld(t, 3, fleetv1.OnFailureHalt)
	failGate(t, w)
	out := w.step()
	h := cond(out, fleetv1.PoolHalted)
	if h.Status != metav1.ConditionTrue || !strings.Contains(h.Message, "node-00 failed the health gate with onFailure Halt") ||
		!strings.Contains(h.Message, "uncordon it and delete its slot Lease in "+lease.Namespace) {
		t.Fatalf("Halted %+v", h)
	}
	a := w.bns["node-00"].Annotations
	if a[fleetv1.AnnotationRolloutState] != string(PhaseFailed) || !strings.Contains(a[fleetv1.AnnotationRolloutReason], "bootc rollback") {
		t.Fatalf("node-00 rollout %q: %q", a[fleetv1.AnnotationRolloutState], a[fleetv1.AnnotationRolloutReason])
	}
	if r := w.bns["node-01"].Annotations[fleetv1.AnnotationRolloutReason]; !strings.Contains(r, "(HostUnitFailed); nothing is staged") || !strings.Contains(r, "bad.service") {
		t.Fatalf("node-01 rollout reason %q does not name the failed unit", r)
	}
}

// A metrics answer taken before the node was found back (the controller
// reuses one for its query interval) says nothing about the new boot: the
// slot is not released on it, and explain says what the gate waits for;
// the next answer releases it.
func TestAMetricsAnswerFromBeforeTheNodeCameBackDoesNotPassIt(t *testing.T) {
	w := gateWorld(t, 2, fleetv1.OnFailureRollback)
	back := w.now
	passing := func(at time.Time) health.Verdict {
		return health.Verdict{Results: []health.Result{{Check: health.CheckHost, Pass: true}, {Check: health.CheckMetrics, Pass: true}}, MetricsAt: at}
	}
	w.health["node-00"] = passing(back.Add(-5 * time.Second))
	w.now = w.now.Add(5 * time.Second)
	if out := w.step(); len(changes(out, OpRelease, lease.KindReboot)) != 0 {
		t.Fatalf("released on an answer from before the node came back: %+v", out.Changes)
	}
	if r := w.bns["node-00"].Annotations[fleetv1.AnnotationRolloutReason]; !strings.Contains(r, "one taken since the node came back") {
		t.Fatalf("node-00 rollout reason %q", r)
	}
	w.health["node-00"] = passing(w.now)
	if out := w.step(); len(changes(out, OpRelease, lease.KindReboot)) != 1 {
		t.Fatalf("not released on an answer taken since it came back: %+v", out.Changes)
	}
}

// A node that reports no rollback deployment is not rolled back: its
// grant stays failed, held, and the pool halts, whatever haltAfterFailures
// says.
func TestNoRollbackDeploymentStaysFailedAndHalts(t *testing.T) {
	w := gateWorld(t, 2, fleetv1.OnFailureRollback)
	w.pool.Spec.Rollout.HaltAfterFailures = ptr.To(int32(5))
	delete(w.rollbacks, "node-00")
	w.agentReports("node-00", imgV1, imageref.Pinned{}, fleetv1.PhaseIdle)
	failGate(t, w)
	for i := 0; i < 3; i++ {
		w.now = w.now.Add(10 * time.Second)
		out := w.step()
		if len(changes(out, OpGrant, lease.KindReboot)) != 0 {
			t.Fatalf("granted: %+v", out.Changes)
		}
		if out.Status.Failures != 1 || cond(out, fleetv1.PoolHalted).Status != metav1.ConditionTrue {
			t.Fatalf("failures %d, Halted %+v", out.Status.Failures, cond(out, fleetv1.PoolHalted))
		}
	}
	if s, _ := w.grantOf("node-00", lease.KindReboot); s.Phase != PhaseFailed {
		t.Fatalf("slot %s", s.Phase)
	}
}

// A rollback grant whose node does not come back within rebootTimeout is
// failed RollbackFailed, held; nothing reboots it again.
func TestRollbackNotBackInTimeFails(t *testing.T) {
	w := gateWorld(t, 2, fleetv1.OnFailureRollback)
	failGate(t, w)
	w.step() // the rollback grant
	s, _ := w.grantOf("node-00", lease.KindReboot)
	w.drains["node-00"] = Drain{Grant: s.Grant.ID, State: DrainDone}
	w.step() // advanced
	w.nodes["node-00"].Ready = false
	w.boots["node-00"]++
	w.nodes["node-00"].BootID = bootID("node-00", w.boots["node-00"])
	w.now = w.now.Add(16 * time.Minute)
	out := w.step()
	if mf := changes(out, OpMarkFailed, lease.KindReboot); len(mf) != 1 || mf[0].Failure != fleetv1.ReasonRollbackFailed {
		t.Fatalf("not RollbackFailed: %+v", out.Changes)
	}
	if !hasEvent(out, fleetv1.EventRollbackFailed, "node node-00 failed its rollback") || hasEvent(out, fleetv1.EventHealthCheckFailed, "") {
		t.Fatalf("the failed rollback is not its own Event (a second HealthCheckFailed folds into the gate's series): %+v", out.Events)
	}
	w.nodes["node-00"].Ready = true
	w.agentReports("node-00", imgV1, imageref.Pinned{}, fleetv1.PhaseIdle)
	for i := 0; i < 3; i++ {
		w.now = w.now.Add(time.Minute)
		if out := w.step(); len(out.Changes) != 0 || out.Status.Failures != 1 {
			t.Fatalf("a failed rollback moved: %+v, failures %d", out.Changes, out.Status.Failures)
		}
	}
}

// Early in the boot after a rollback's reboot, bootc status can still
// show the boot before: the failed image booted, the rollback grant's image
// as its rollback deployment, which is what a rollback that did not take
// looks like. While the agent reports its status settling (Rebooting,
// StatusSettling) that is no verdict: the grant is not failed; once the
// status shows the previous image, the slot is released as rolled back.
// The same holds for an update grant: a stale status is not the host
// rolling back by itself.
func TestASettlingStatusIsNoVerdictOnTheImage(t *testing.T) {
	for _, rollback := range []bool{true, false} {
		t.Run(fmt.Sprintf("rollback=%v", rollback), func(t *testing.T) {
			w := gateWorld(t, 2, fleetv1.OnFailureRollback)
			stale, want := imgV1, imgV0 // booted as the stale status shows it; the rollback deployment
			if rollback {
				failGate(t, w)
				w.step() // the rollback grant
			} else {
				// Back to node-00's update grant in phase Reboot, in the
				// boot it was granted in, with v1 as its rollback.
				w = stagedWorld(2, 1)
				gatedPool(w, time.Minute, 0, fleetv1.OnFailureRollback)
				w.step()
				w.step()
				w.rollbacks["node-00"] = imgV1
				stale, want = imgV0, imgV1
			}
			s, _ := w.grantOf("node-00", lease.KindReboot)
			w.drains["node-00"] = Drain{Grant: s.Grant.ID, State: DrainDone}
			w.step() // advanced to Reboot
			if s, _ := w.grantOf("node-00", lease.KindReboot); s.Grant.Phase != lease.PhaseReboot || s.Grant.Rollback != rollback {
				t.Fatalf("grant %+v, want phase Reboot, rollback %v", s.Grant, rollback)
			}
			w.boots["node-00"]++
			w.nodes["node-00"].BootID = bootID("node-00", w.boots["node-00"])
			w.agentReports("node-00", stale, imageref.Pinned{}, fleetv1.PhaseRebooting)
			w.bns["node-00"].Status.Reason = fleetv1.ReasonStatusSettling
			w.bns["node-00"].Status.Rollback = &fleetv1.Deployment{Image: want.String(), Digest: want.Digest}
			for i := 0; i < 3; i++ {
				w.now = w.now.Add(10 * time.Second)
				if out := w.step(); len(changes(out, OpMarkFailed, lease.KindReboot))+len(changes(out, OpRelease, lease.KindReboot)) != 0 {
					t.Fatalf("a settling status judged: %+v", out.Changes)
				}
			}
			if rollback {
				// Settled: booted on the previous image.
				w.rollbacks["node-00"] = imgV1
				w.agentReports("node-00", imgV0, imageref.Pinned{}, fleetv1.PhaseIdle)
				w.now = w.now.Add(10 * time.Second)
				if r := changes(w.step(), OpRelease, lease.KindReboot); len(r) != 1 || r[0].Why != WhyRolledBack {
					t.Fatalf("not released as rolled back: %+v", r)
				}
			}
		})
	}
}

// While the target is quarantined, stage grants and Draining reboot grants
// for it are revoked, no grant is given and desired images are cleared; a
// new spec.image clears the quarantine.
func TestQuarantineRevokesAndANewImageClearsIt(t *testing.T) {
	w := settled(3, 1, 3)
	w.step() // stage grants to all three
	w.agentReports("node-00", imgV0, imgV1, fleetv1.PhaseStaged)
	w.step() // node-00: stage released, reboot grant (Draining)
	if s, ok := w.grantOf("node-00", lease.KindReboot); !ok || s.Phase != PhaseDraining {
		t.Fatalf("node-00 reboot grant %+v", s)
	}
	q := &fleetv1.Quarantine{SpecImage: w.pool.Spec.Image, Digest: imgV1.String(), Node: "node-09", Reason: fleetv1.ReasonHostUnitFailed, Since: metav1.NewTime(t0)}
	w.pool.Status.Quarantine = q
	out := w.step()
	rv := append(changes(out, OpRevoke, lease.KindReboot), changes(out, OpRevoke, lease.KindStage)...)
	if len(rv) != 3 {
		t.Fatalf("revokes %+v", out.Changes)
	}
	for _, c := range rv {
		if c.Why != WhyQuarantined {
			t.Fatalf("revoke %+v", c)
		}
	}
	if len(changes(out, OpGrant, lease.KindReboot))+len(changes(out, OpGrant, lease.KindStage)) != 0 {
		t.Fatalf("granted under quarantine: %+v", out.Changes)
	}
	for name, bn := range w.bns {
		if bn.Spec.DesiredImage != "" {
			t.Fatalf("%s desired %s under quarantine", name, bn.Spec.DesiredImage)
		}
	}
	if out.Status.Quarantine == nil || *out.Status.Quarantine != *q {
		t.Fatalf("quarantine not kept: %+v", out.Status.Quarantine)
	}
	w.pool.Spec.Image, w.target = "quay.io/example/os:v2", imgV2
	out = w.step()
	if out.Status.Quarantine != nil || !hasEvent(out, fleetv1.EventImageChanged, "quarantine") {
		t.Fatalf("quarantine not lifted: %+v, events %+v", out.Status.Quarantine, out.Events)
	}
	if d := w.bns["node-00"].Spec.DesiredImage; d != imgV2.String() {
		t.Fatalf("desired %q after the new image", d)
	}
}

// The metrics query gates reboot grants: a node it returns series for gets
// none; while it fails, nobody does.
func TestMetricsGateHoldsRebootGrants(t *testing.T) {
	w := stagedWorld(2, 1)
	out := stepWith(w, func(in *Input) { in.MetricsError = "connection refused" })
	if g := changes(out, OpGrant, lease.KindReboot); len(g) != 0 {
		t.Fatalf("granted while the query fails: %+v", g)
	}
	if p := cond(out, fleetv1.PoolProgressing); !strings.Contains(p.Message, fleetv1.ReasonMetricsQueryFailed) || out.RequeueAfter <= 0 {
		t.Fatalf("Progressing %q, requeue %s", p.Message, out.RequeueAfter)
	}
	if bn := w.bns["node-00"]; bn.Annotations[fleetv1.AnnotationRolloutState] != fleetv1.RolloutBlocked {
		t.Fatalf("node-00 rollout %q", bn.Annotations[fleetv1.AnnotationRolloutState])
	}
	out = stepWith(w, func(in *Input) {
		in.MetricsBlocked = map[string]string{"node-00": `ALERTS{alertname="DiskFull",node="node-00"}`}
	})
	if g := changes(out, OpGrant, lease.KindReboot); len(g) != 1 || g[0].Node != "node-01" {
		t.Fatalf("grants %+v, want node-01 only", g)
	}
}

// Where a BootcNode has a desired image, its spec.health carries the pool's
// required units, for its agent to report on.
func TestBootcNodeHealthCarriesRequiredUnits(t *testing.T) {
	w := settled(2, 1, 2)
	gatedPool(w, time.Minute, 0, "")
	w.step()
	for name, bn := range w.bns {
		if h := bn.Spec.Health; h == nil || len(h.RequiredUnits) != 1 || h.RequiredUnits[0] != "kubelet.service" {
			t.Fatalf("%s spec.health %+v", name, h)
		}
	}
	w.pool.Spec.Health = nil
	w.step()
	for name, bn := range w.bns {
		if bn.Spec.Health != nil {
			t.Fatalf("%s keeps spec.health %+v", name, bn.Spec.Health)
		}
	}
}

// In the pass a gate fails, no Draining update grant advances into its
// reboot: the next pass revokes it, as its target is quarantined.
func TestNoAdvanceInThePassAGateFails(t *testing.T) {
	w := stagedWorld(3, 2)
	gatedPool(w, time.Minute, 0, fleetv1.OnFailureRollback)
	w.step()
	w.step() // reboot grants to node-00 (slot 0) and node-01 (slot 1)
	rebootAndReturn(t, w, "node-01")
	w.step() // node-01 back (Verifying)
	s, ok := w.grantOf("node-00", lease.KindReboot)
	if !ok || s.Phase != PhaseDraining {
		t.Fatalf("node-00: %+v", s)
	}
	w.drains["node-00"] = Drain{Grant: s.Grant.ID, State: DrainDone}
	w.health["node-01"] = hostFailed
	w.now = w.now.Add(2 * time.Minute)
	out := w.step()
	if len(changes(out, OpMarkFailed, lease.KindReboot)) != 1 || len(changes(out, OpAdvance, lease.KindReboot)) != 0 {
		t.Fatalf("the gate failed and a grant advanced: %+v", out.Changes)
	}
	rv := changes(out, OpRevoke, lease.KindReboot)
	rv = append(rv, changes(w.step(), OpRevoke, lease.KindReboot)...)
	if len(rv) != 1 || rv[0].Node != "node-00" || rv[0].Why != WhyQuarantined || !rv[0].Uncordon {
		t.Fatalf("node-00's grant not revoked: %+v", rv)
	}
}

// A spec.health that names no check gates nothing: the node is released
// once back, as without one.
func TestHealthWithoutChecksGatesNothing(t *testing.T) {
	w := stagedWorld(2, 1)
	w.pool.Spec.Health = &fleetv1.HealthSpec{Timeout: &metav1.Duration{Duration: time.Minute}}
	w.step()
	rebootAndReturn(t, w, "node-00")
	out := w.step()
	if r := changes(out, OpRelease, lease.KindReboot); len(r) != 1 || r[0].Why != WhyVerified {
		t.Fatalf("not released: %+v", out.Changes)
	}
}

// A node back from its rollback reboot whose agent still waits for bootc's
// status to show the new boot (early-boot status lags: it still shows the
// failed image booted and the rollback image as the rollback deployment,
// as before the reboot) has given no verdict: the rollback grant is not
// failed on it. Once the status settles on the rollback image the slot is
// released; an agent that settled on the failed image fails it.
func TestSettlingStatusAfterARollbackRebootIsNoVerdict(t *testing.T) {
	for _, tt := range []struct {
		name    string
		settled imageref.Pinned
		want    string
	}{
		{"settles on the rollback image", imgV0, WhyRolledBack},
		{"settles on the failed image", imgV1, WhyRollbackFailed},
	} {
		t.Run(tt.name, func(t *testing.T) {
			w := gateWorld(t, 2, fleetv1.OnFailureRollback)
			failGate(t, w)
			w.step() // the rollback grant
			s, _ := w.grantOf("node-00", lease.KindReboot)
			w.drains["node-00"] = Drain{Grant: s.Grant.ID, State: DrainDone}
			w.step() // advanced
			w.boots["node-00"]++
			w.nodes["node-00"].BootID = bootID("node-00", w.boots["node-00"])
			w.now = w.now.Add(5 * time.Second)
			w.agentReports("node-00", imgV1, imageref.Pinned{}, fleetv1.PhaseRebooting)
			w.bns["node-00"].Status.Reason = fleetv1.ReasonStatusSettling
			for i := 0; i < 3; i++ {
				w.now = w.now.Add(2 * time.Second)
				if out := w.step(); len(out.Changes) != 0 {
					t.Fatalf("pass %d, status still settling: %+v", i, out.Changes)
				}
			}
			if tt.settled == imgV0 {
				w.rollbacks["node-00"] = imgV1
			}
			w.agentReports("node-00", tt.settled, imageref.Pinned{}, fleetv1.PhaseIdle)
			var got []SlotChange
			for i := 0; i < 3 && len(got) == 0; i++ {
				w.now = w.now.Add(2 * time.Second)
				out := w.step()
				got = append(changes(out, OpRelease, lease.KindReboot), changes(out, OpMarkFailed, lease.KindReboot)...)
			}
			if len(got) != 1 || got[0].Why != tt.want {
				t.Fatalf("settled on %s: %+v, want %s", tt.settled, got, tt.want)
			}
		})
	}
}
