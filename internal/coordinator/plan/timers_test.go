package plan

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// Every timer runs on the coordinator's clock: a stage grant lives while the
// coordinator keeps seeing new reports that list it; the node's own clock
// (status.lastReportTime) never moves a deadline.
func TestStageGrantExpiresOnTheCoordinatorsClock(t *testing.T) {
	skews := map[string]time.Duration{"node clock right": 0, "node clock -20m": -20 * time.Minute, "node clock +1 day": 24 * time.Hour, "node clock -3m": -3 * time.Minute}
	for name, skew := range skews {
		for _, c := range []struct {
			name    string
			run     func(w *world)
			expired bool
		}{
			{"reports listing the grant keep it", func(w *world) {
				for range 5 { // 5 x 30s: well past the 1m lease since the grant
					w.now = w.now.Add(30 * time.Second)
					w.agentReports("node-00", imgV0, imageref.Pinned{}, fleetv1.PhaseStaging)
				}
			}, false},
			{"reports that do not list the grant do not keep it", func(w *world) {
				for range 3 {
					w.now = w.now.Add(30 * time.Second)
					w.agentReports("node-00", imgV0, imageref.Pinned{}, fleetv1.PhaseStaging)
					w.bns["node-00"].Status.Grants = nil
				}
			}, true},
			{"no new report for a lease duration", func(w *world) {
				w.now = w.now.Add(30 * time.Second)
				w.agentReports("node-00", imgV0, imageref.Pinned{}, fleetv1.PhaseStaging)
				w.now = w.now.Add(61 * time.Second)
			}, true},
			{"a report seen just inside the lease duration", func(w *world) {
				w.now = w.now.Add(30 * time.Second)
				w.agentReports("node-00", imgV0, imageref.Pinned{}, fleetv1.PhaseStaging)
				w.now = w.now.Add(59 * time.Second)
			}, false},
		} {
			t.Run(name+": "+c.name, func(t *testing.T) {
				w := settled(3, 1, 1)
				w.step()
				if _, ok := w.grantOf("node-00", lease.KindStage); !ok {
					t.Fatal("setup: node-00 has no stage grant")
				}
				c.run(w)
				// The node's clock is whatever it is: the coordinator ignores it.
				w.bns["node-00"].Status.LastReportTime = &metav1.MicroTime{Time: w.now.Add(skew)}
				out := w.step()
				rel := changes(out, OpRelease, lease.KindStage)
				if got := len(rel) == 1 && rel[0].Why == WhyExpired; got != c.expired {
					t.Fatalf("expired = %v, want %v (changes %+v)", got, c.expired, out.Changes)
				}
				if !c.expired && (out.RequeueAfter <= 0 || out.RequeueAfter > time.Minute) {
					t.Fatalf("requeue after %s, want by the grant's expiry", out.RequeueAfter)
				}
			})
		}
	}
}

// A node whose download keeps failing lets go of its grant; the slot goes
// to the next node at once, and the failing node waits behind the others.
func TestStageGrantReleasedByAgentGoesToTheNextNode(t *testing.T) {
	w := settled(3, 1, 1)
	w.step()
	if _, ok := w.grantOf("node-00", lease.KindStage); !ok {
		t.Fatal("setup: node-00 has no stage grant")
	}
	w.now = w.now.Add(5 * time.Second)
	w.agentReports("node-00", imgV0, imageref.Pinned{}, fleetv1.PhaseWaiting)
	st := &w.bns["node-00"].Status
	st.Reason, st.Message = fleetv1.ReasonStageFailed, "gave up after 3 failed attempts"
	st.Grants[0].Released = fleetv1.ReasonStageFailed
	out := w.step()
	if rv := changes(out, OpRevoke, lease.KindStage); len(rv) != 1 || rv[0].Why != WhyReleasedByAgent || rv[0].Node != "node-00" {
		t.Fatalf("released grant not revoked at once: %+v", out.Changes)
	}
	// In the same pass, after the revoke.
	if g := changes(out, OpGrant, lease.KindStage); len(g) != 1 || g[0].Node != "node-01" {
		t.Fatalf("stage slot went to %v, want node-01 (node-00 failed and waits at the back)", nodesOf(g))
	}
	// node-01 and node-02 stage; then node-00 gets its turn again.
	for _, n := range []string{"node-01", "node-02"} {
		w.agentReports(n, imgV0, imgV1, fleetv1.PhaseStaged)
		w.step()
	}
	w.agentReports("node-00", imgV0, imageref.Pinned{}, fleetv1.PhaseWaiting)
	w.bns["node-00"].Status.Reason = fleetv1.ReasonStageFailed
	w.step()
	if _, ok := w.grantOf("node-00", lease.KindStage); !ok {
		t.Fatal("node-00 never got another turn")
	}
}

// No agent report extends a reboot grant: a node that reports a Degraded
// verdict while holding one reaches rebootTimeout, counts as a failure, and
// the pool halts.
func TestDegradedRebootHolderTimesOutAndHalts(t *testing.T) {
	for _, reason := range []string{fleetv1.ReasonRebootDidNotHappen, fleetv1.ReasonStagedDigestMismatch, fleetv1.ReasonUnlockedWithoutGrant} {
		t.Run(reason, func(t *testing.T) {
			w := rebootingWorld(t, false)
			for range 15 { // a report every minute for the whole timeout
				w.now = w.now.Add(time.Minute)
				w.agentReports("node-00", imgV0, imgV1, fleetv1.PhaseDegraded)
				w.bns["node-00"].Status.Reason = reason
			}
			out := w.step()
			if mf := changes(out, OpMarkFailed, lease.KindReboot); len(mf) != 1 {
				t.Fatalf("no RebootTimeout after rebootTimeout of Degraded reports: %+v", out.Changes)
			}
			if c := meta.FindStatusCondition(out.Status.Conditions, fleetv1.PoolHalted); c == nil || c.Status != metav1.ConditionTrue {
				t.Fatalf("pool not halted: %+v", c)
			}
		})
	}
}

// cordoned-by-us is what the cordon call found, not what the cache showed.
func TestCordonOwnershipComesFromTheCordonCall(t *testing.T) {
	t.Run("an admin's cordon a moment before the grant is never lifted", func(t *testing.T) {
		w := stagedWorld(2, 1)
		out := w.plan() // the cache shows node-00 schedulable
		w.nodes["node-00"].Unschedulable = true
		w.apply(out) // ... but the admin cordoned it before our cordon call
		s, ok := w.grantOf("node-00", lease.KindReboot)
		if !ok || s.CordonedByUs {
			t.Fatalf("grant %+v records our cordon; the admin's was first", s)
		}
		w.step()
		w.drains["node-00"] = Drain{Grant: s.Grant.ID, State: DrainDone}
		w.step()
		w.reboot("node-00")
		w.agentReports("node-00", imgV1, imageref.Pinned{}, fleetv1.PhaseIdle)
		out = w.step()
		rel := changes(out, OpRelease, lease.KindReboot)
		if len(rel) != 1 || rel[0].Uncordon || !w.nodes["node-00"].Unschedulable {
			t.Fatalf("release %+v lifted the admin's cordon (unschedulable now %v)", rel, w.nodes["node-00"].Unschedulable)
		}
	})
	t.Run("our cordon, pending with the grant's mark until the advance records it, survives a restart mid-drain", func(t *testing.T) {
		w := stagedWorld(2, 1)
		w.step()
		s, _ := w.grantOf("node-00", lease.KindReboot)
		if !s.CordonPending || !w.cordonedByUs("node-00") || w.nodes["node-00"].CordonedFor != lease.CordonMark(s.Grant.ID) {
			t.Fatalf("after the grant: recorded %v, pending %v, Node mark %q", s.CordonedByUs, s.CordonPending, w.nodes["node-00"].CordonedFor)
		}
		// The coordinator stops mid-drain: the next one drains again, and
		// the advance keeps the record.
		delete(w.drains, "node-00")
		out := w.step()
		if len(out.StartDrains) != 1 || len(out.Changes) != 0 {
			t.Fatalf("restart mid-drain: drains %+v, changes %+v", out.StartDrains, out.Changes)
		}
		w.drains["node-00"] = Drain{Grant: s.Grant.ID, State: DrainDone}
		w.step()
		if s, _ := w.grantOf("node-00", lease.KindReboot); s.Grant.Phase != lease.PhaseReboot || !s.CordonedByUs {
			t.Fatalf("the advance did not keep our cordon's record: %+v", s)
		}
		// And a release restores it.
		w.reboot("node-00")
		w.agentReports("node-00", imgV1, imageref.Pinned{}, fleetv1.PhaseIdle)
		out = w.step()
		if rel := changes(out, OpRelease, lease.KindReboot); len(rel) != 1 || !rel[0].Uncordon || w.nodes["node-00"].Unschedulable {
			t.Fatalf("release %+v did not uncordon our cordon", rel)
		}
	})
	t.Run("a mark the grant does not record is left, and named", func(t *testing.T) {
		// The coordinator stopped between its cordon call and the record.
		w := stagedWorld(2, 1)
		w.step()
		s, _ := w.grantOf("node-00", lease.KindReboot)
		w.leases[s.Name].Annotations[lease.AnnotationCordonedByUs] = "false"
		w.step()
		w.drains["node-00"] = Drain{Grant: s.Grant.ID, State: DrainDone}
		w.step()
		w.reboot("node-00")
		w.agentReports("node-00", imgV1, imageref.Pinned{}, fleetv1.PhaseIdle)
		out := w.step()
		if rel := changes(out, OpRelease, lease.KindReboot); len(rel) != 1 || rel[0].Uncordon || !hasEvent(out, fleetv1.EventCordonLeft, "node-00") {
			t.Fatalf("release %+v, events %+v: want the node left cordoned and named", rel, out.Events)
		}
	})
	t.Run("a revoke before the advance lifts our recorded cordon", func(t *testing.T) {
		w := stagedWorld(2, 1)
		w.step()
		w.nodes["node-00"].InPool = false
		out := w.step()
		if rv := changes(out, OpRevoke, lease.KindReboot); len(rv) != 1 || !rv[0].Uncordon || w.nodes["node-00"].Unschedulable {
			t.Fatalf("revoke %+v left our unrecorded cordon", rv)
		}
	})
}

// A node with rollout work whose agent stops reporting is counted and named
// on the pool within QuietAfter; an idle node is not judged.
func TestQuietAgentsAreNamedOnThePool(t *testing.T) {
	for _, c := range []struct {
		name  string
		setup func(w *world)
		quiet int32
	}{
		{"reports keep coming", func(w *world) {
			w.now = w.now.Add(40 * time.Second)
			w.agentReports("node-00", imgV0, imageref.Pinned{}, fleetv1.PhaseWaiting)
		}, 0},
		{"nothing new for QuietAfter", func(w *world) { w.now = w.now.Add(46 * time.Second) }, 1},
		{"an idle node on its image is not judged", func(w *world) {
			w.agentReports("node-00", imgV1, imageref.Pinned{}, fleetv1.PhaseIdle)
			w.now = w.now.Add(time.Hour)
		}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := settled(1, 1, 1)
			w.pool.Spec.Rollout.Paused = true // nothing else moves
			w.step()
			w.step()
			c.setup(w)
			in := w.input()
			in.QuietAfter = 45 * time.Second
			out := Plan(in)
			if out.Status.Quiet != c.quiet {
				t.Fatalf("quiet = %d, want %d", out.Status.Quiet, c.quiet)
			}
			cond := meta.FindStatusCondition(out.Status.Conditions, fleetv1.PoolAgentsReporting)
			if cond == nil || (cond.Status == metav1.ConditionFalse) != (c.quiet > 0) || (c.quiet > 0 && !strings.Contains(cond.Message, "node-00")) {
				t.Fatalf("AgentsReporting = %+v", cond)
			}
		})
	}
	t.Run("a node down in its reboot is not judged quiet", func(t *testing.T) {
		w := rebootingWorld(t, false)
		w.now = w.now.Add(5 * time.Minute)
		in := w.input()
		in.QuietAfter = 45 * time.Second
		out := Plan(in)
		if out.Status.Quiet != 1 { // node-01, staged and waiting, went quiet too
			t.Fatalf("quiet = %d, want 1 (node-01 only)", out.Status.Quiet)
		}
		cond := meta.FindStatusCondition(out.Status.Conditions, fleetv1.PoolAgentsReporting)
		if cond == nil || strings.Contains(cond.Message, "node-00") || !strings.Contains(cond.Message, "node-01") {
			t.Fatalf("AgentsReporting = %+v", cond)
		}
	})
	t.Run("a node whose requests are refused is named", func(t *testing.T) {
		w := settled(1, 1, 1)
		w.step()
		meta.SetStatusCondition(&w.bns["node-00"].Status.Conditions, metav1.Condition{Type: fleetv1.ConditionAPIAccess,
			Status: metav1.ConditionFalse, Reason: fleetv1.ReasonRequestRefused, Message: `leases "workers-stage-0" is forbidden`})
		out := w.plan()
		cond := meta.FindStatusCondition(out.Status.Conditions, fleetv1.PoolAgentsReporting)
		if cond == nil || cond.Reason != fleetv1.ReasonAgentRequestsRefused || !strings.Contains(cond.Message, "forbidden") {
			t.Fatalf("AgentsReporting = %+v", cond)
		}
	})
}

// A stage grant that goes out with the node's new target (amendment 29)
// does not expire while the coordinator's own patch of the BootcNode has
// not landed (the agent has nothing to list it for yet), and its lease
// duration runs from when the coordinator first saw the BootcNode ask for
// the grant's image: a BootcNode writer hours behind at 5,000 nodes does
// not turn every early grant into an expiry.
func TestEarlyStageGrantWaitsForItsBootcNode(t *testing.T) {
	w := settled(2, 1, 1)
	w.target = imgV2
	w.step()
	s, ok := w.grantOf("node-00", lease.KindStage)
	if !ok || s.Grant.Image != imgV2 {
		t.Fatalf("no stage grant for v2 in the pass that set the target: %+v", s)
	}
	// The BootcNode patch has not landed: it still asks for v1.
	w.bns["node-00"].Spec.DesiredImage = imgV1.String()
	w.now = w.now.Add(3 * time.Minute)
	if rel := changes(w.plan(), OpRelease, lease.KindStage); len(rel) != 0 {
		t.Fatalf("stage grant expired before its holder's BootcNode asked for its image: %+v", rel)
	}
	// It lands now: the lease duration runs from here.
	w.bns["node-00"].Spec.DesiredImage = imgV2.String()
	w.hb["node-00"] = Heartbeat{SpecSeen: w.now}
	if rel := changes(w.plan(), OpRelease, lease.KindStage); len(rel) != 0 {
		t.Fatalf("stage grant expired the moment its holder's BootcNode asked for its image: %+v", rel)
	}
	w.now = w.now.Add(61 * time.Second)
	if rel := changes(w.plan(), OpRelease, lease.KindStage); len(rel) != 1 || rel[0].Why != WhyExpired {
		t.Fatalf("no report listing the grant for a lease duration after the BootcNode asked: %+v, want it expired", rel)
	}
}

// A stage grant for a node whose target was written long before (a later
// wave) does not expire while the coordinator's own patch naming the slot
// has not landed: the agent watches only the slots its BootcNode names
// (amendment 39), so it cannot list the grant yet. From the patch on, the
// lease duration runs from when the coordinator first saw it.
func TestStageGrantWaitsForItsSlotsName(t *testing.T) {
	w := settled(2, 1, 1)
	w.target = imgV2
	w.step()
	// node-00 is done with its stage; node-01, whose target landed long
	// ago, is granted the slot next.
	w.agentReports("node-00", imgV0, imgV2, fleetv1.PhaseStaged)
	w.hb["node-01"] = Heartbeat{SpecSeen: w.now.Add(-10 * time.Minute), SlotsSeen: w.now.Add(-10 * time.Minute)}
	w.step()
	s, ok := w.grantOf("node-01", lease.KindStage)
	if !ok || s.Grant.Image != imgV2 {
		t.Fatalf("no stage grant for node-01: %s", describeNodes(w))
	}
	// The patch naming the slot has not landed.
	w.bns["node-01"].SetSlots(nil)
	w.now = w.now.Add(3 * time.Minute)
	if rel := changes(w.plan(), OpRelease, lease.KindStage); len(rel) != 0 {
		t.Fatalf("stage grant %s expired before its holder's BootcNode named the slot: %+v", s.Name, rel)
	}
	// It lands now: the lease duration runs from here.
	w.bns["node-01"].SetSlots([]string{s.Name})
	w.hb["node-01"] = Heartbeat{SpecSeen: w.now.Add(-13 * time.Minute), SlotsSeen: w.now}
	if rel := changes(w.plan(), OpRelease, lease.KindStage); len(rel) != 0 {
		t.Fatalf("stage grant expired the moment its holder's BootcNode named the slot: %+v", rel)
	}
	w.now = w.now.Add(61 * time.Second)
	if rel := changes(w.plan(), OpRelease, lease.KindStage); len(rel) != 1 || rel[0].Why != WhyExpired {
		t.Fatalf("no report listing the grant for a lease duration after the BootcNode named it: %+v, want it expired", rel)
	}
}
