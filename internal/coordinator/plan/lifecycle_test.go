package plan

import (
	"fmt"
	"slices"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// TestRebootGrantTransitions: a reboot grant past its drain, in each of
// its phases, ends or moves by each cause the planner has, through exactly
// the edges plan.Transitions lists; so does a Draining grant whose Lease
// someone else annotated. The phases are made by writing the Lease's
// records (back-since, came-back, failure) as the coordinator writes them.
func TestRebootGrantTransitions(t *testing.T) {
	const slot = "workers-reboot-0"
	stamp := func(at time.Time) string { return at.UTC().Format(time.RFC3339Nano) }
	records := map[string]func(l *coordinationv1.Lease, now time.Time){
		"Rebooting": func(*coordinationv1.Lease, time.Time) {},
		"Verifying": func(l *coordinationv1.Lease, now time.Time) {
			l.Annotations[lease.AnnotationBackSince], l.Annotations[lease.AnnotationCameBack] = stamp(now), stamp(now)
		},
		"Verifying, came back and fell over since": func(l *coordinationv1.Lease, now time.Time) {
			l.Annotations[lease.AnnotationCameBack] = stamp(now)
		},
		"Verifying, back-since without came-back (an older grant)": func(l *coordinationv1.Lease, now time.Time) {
			l.Annotations[lease.AnnotationBackSince] = stamp(now)
		},
		"Failed": func(l *coordinationv1.Lease, _ time.Time) {
			l.Annotations[lease.AnnotationFailure] = fleetv1.ReasonRebootTimeout
		},
		"Failed, back since": func(l *coordinationv1.Lease, now time.Time) {
			l.Annotations[lease.AnnotationFailure] = fleetv1.ReasonRebootTimeout
			l.Annotations[lease.AnnotationBackSince], l.Annotations[lease.AnnotationCameBack] = stamp(now), stamp(now)
		},
	}
	causes := map[string]func(w *world){
		"verified back": func(w *world) {
			w.reboot("node-00")
			w.agentReports("node-00", imgV1, imageref.Pinned{}, fleetv1.PhaseIdle)
		},
		"Node deleted, rebootTimeout passed": func(w *world) {
			delete(w.nodes, "node-00")
			w.now = w.now.Add(16 * time.Minute)
		},
		"left the pool": func(w *world) { w.nodes["node-00"].InPool = false },
		"back in another boot, grant unused": func(w *world) {
			s, _ := w.grantOf("node-00", lease.KindReboot)
			w.reboot("node-00")
			w.agentReports("node-00", imgV0, imageref.Pinned{}, fleetv1.PhaseWaiting)
			w.bns["node-00"].Status.Grants = []fleetv1.GrantInUse{{Lease: s.Grant.ID.Lease, UID: s.Grant.ID.UID,
				LeaseTransitions: s.Grant.ID.Transitions, Released: fleetv1.ReasonRebootGrantUnused}}
		},
		"signed images now required, stage unverified and unused": func(w *world) {
			w.pool.Spec.RequireSignedImages = true
			bn := w.bns["node-00"]
			bn.Spec.RequireSignedImages, bn.Generation = true, 2
			w.agentReports("node-00", imgV0, imgV1, fleetv1.PhaseWaiting)
			bn.Status.ObservedGeneration, bn.Status.Staged.Signature = 2, fleetv1.SignatureInsecure
		},
		"not Ready": func(w *world) {
			w.reboot("node-00")
			w.agentReports("node-00", imgV1, imageref.Pinned{}, fleetv1.PhaseIdle)
			w.nodes["node-00"].Ready = false
		},
		"not Ready past rebootTimeout": func(w *world) {
			w.nodes["node-00"].Ready = false
			w.now = w.now.Add(16 * time.Minute)
		},
	}
	edge := func(from SlotPhase, op Op, why string, to SlotPhase) Transition {
		return Transition{From: from, Op: op, Why: why, To: to}
	}
	type tc struct {
		record, cause string
		minReady      int32
		want          []Transition
	}
	var cases []tc
	// Every end of a grant in phase Reboot, from each of its phases.
	for _, r := range []struct {
		record string
		phase  SlotPhase
	}{{"Rebooting", PhaseRebooting}, {"Verifying", PhaseVerifying}, {"Failed", PhaseFailed}} {
		cases = append(cases,
			tc{r.record, "verified back", 0, []Transition{edge(r.phase, OpRelease, WhyVerified, PhaseFree)}},
			tc{r.record, "Node deleted, rebootTimeout passed", 0, []Transition{edge(r.phase, OpRelease, WhyNodeDeleted, PhaseFree)}},
			tc{r.record, "left the pool", 0, []Transition{edge(r.phase, OpRevoke, WhyLeftPool, PhaseFree)}},
			tc{r.record, "back in another boot, grant unused", 0, []Transition{edge(r.phase, OpRevoke, WhyBootChanged, PhaseFree)}},
			tc{r.record, "signed images now required, stage unverified and unused", 0, []Transition{edge(r.phase, OpRevoke, WhyStagedUnverified, PhaseFree)}})
	}
	// The minReadySeconds records and the reboot timer.
	cases = append(cases,
		tc{"Rebooting", "verified back", 60, []Transition{edge(PhaseRebooting, OpMarkBack, WhyBackOnImage, PhaseVerifying)}},
		tc{"Rebooting", "not Ready past rebootTimeout", 60, []Transition{edge(PhaseRebooting, OpMarkFailed, WhyRebootTimeout, PhaseFailed)}},
		tc{"Verifying, came back and fell over since", "verified back", 60, []Transition{edge(PhaseVerifying, OpMarkBack, WhyBackOnImage, PhaseVerifying)}},
		tc{"Verifying", "not Ready", 60, []Transition{edge(PhaseVerifying, OpMarkBack, WhyNotBackAnyMore, PhaseVerifying)}},
		tc{"Verifying", "not Ready past rebootTimeout", 60, []Transition{edge(PhaseVerifying, OpMarkBack, WhyNotBackAnyMore, PhaseVerifying)}},
		tc{"Verifying, back-since without came-back (an older grant)", "not Ready", 60, []Transition{edge(PhaseVerifying, OpMarkBack, WhyNotBackAnyMore, PhaseRebooting)}},
		tc{"Verifying, back-since without came-back (an older grant)", "not Ready past rebootTimeout", 0, []Transition{edge(PhaseVerifying, OpMarkFailed, WhyRebootTimeout, PhaseFailed)}},
		tc{"Failed", "verified back", 60, []Transition{edge(PhaseFailed, OpMarkBack, WhyBackOnImage, PhaseFailed)}},
		tc{"Failed, back since", "not Ready", 60, []Transition{edge(PhaseFailed, OpMarkBack, WhyNotBackAnyMore, PhaseFailed)}},
	)
	for _, c := range cases {
		t.Run(fmt.Sprintf("%s, %s, minReadySeconds %d", c.record, c.cause, c.minReady), func(t *testing.T) {
			w := rebootingWorld(t, false)
			w.pool.Spec.Rollout.MinReadySeconds = c.minReady
			w.now = w.now.Add(time.Second)
			records[c.record](w.leases[slot], w.now)
			causes[c.cause](w)
			checkSlotStep(t, w, slot, c.want)
		})
	}
	// A Draining grant with the records only phase Reboot gets: the advance
	// keeps them, and the Lease reads as they say.
	for _, c := range []struct {
		record string
		to     SlotPhase
	}{{"Failed", PhaseFailed}, {"Verifying", PhaseVerifying}} {
		t.Run("Draining, annotated "+c.record+", drained", func(t *testing.T) {
			w := stagedWorld(2, 1)
			w.step()
			s, _ := w.grantOf("node-00", lease.KindReboot)
			records[c.record](w.leases[slot], w.now)
			w.drains["node-00"] = Drain{Grant: s.Grant.ID, State: DrainDone}
			checkSlotStep(t, w, slot, []Transition{edge(PhaseDraining, OpAdvance, WhyDrained, c.to)})
		})
	}
}

// checkSlotStep plans and applies one pass and checks the transitions of
// slot's changes (a grant handing it on excepted) are want.
func checkSlotStep(t *testing.T, w *world, slot string, want []Transition) {
	t.Helper()
	before := leaseCopies(w)
	out := w.step()
	seen, _ := slotTransitions(w, before, out, w.now)
	var got []Transition
	for i, c := range out.Changes {
		if c.Slot == slot && c.Op != OpGrant {
			got = append(got, seen[i])
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("transitions %v, want %v (changes %+v)", got, want, out.Changes)
	}
	for _, e := range got {
		if !e.Allowed() {
			t.Fatalf("transition %s is not in plan.Transitions", e)
		}
	}
}

// TestStageAndDrainingGrantTransitions: a stage grant and a reboot grant
// still Draining end by each cause the planner has, through exactly the
// edges plan.Transitions lists.
func TestStageAndDrainingGrantTransitions(t *testing.T) {
	edge := func(from SlotPhase, op Op, why string) []Transition {
		to := PhaseFree
		if op == OpCordon {
			to = from
		}
		return []Transition{{From: from, Op: op, Why: why, To: to}}
	}
	common := []struct {
		name   string
		mutate func(w *world)
		op     Op
		why    string
	}{
		{"target changed", func(w *world) { w.target = imgV2 }, OpRevoke, WhyImageChanged},
		{"node rebooted since the grant", func(w *world) { w.reboot("node-00") }, OpRevoke, WhyBootChanged},
		{"node left the pool", func(w *world) { w.nodes["node-00"].InPool = false }, OpRevoke, WhyLeftPool},
		{"node deleted", func(w *world) { delete(w.nodes, "node-00") }, OpRelease, WhyNodeDeleted},
	}
	for _, c := range common {
		t.Run("Staging, "+c.name, func(t *testing.T) {
			w := settled(1, 1, 1)
			w.step()
			c.mutate(w)
			if c.why == WhyBootChanged {
				// The grant is void in the new boot: finished, kept until
				// the next stage grant hands it on (amendment 31).
				checkSlotStep(t, w, "workers-stage-0", nil)
				if s, _ := w.slot(w.leases["workers-stage-0"]); s.Phase != PhaseFinished {
					t.Fatalf("stage slot of a rebooted holder is %s, want %s", s.Phase, PhaseFinished)
				}
				return
			}
			checkSlotStep(t, w, "workers-stage-0", edge(PhaseStaging, c.op, c.why))
		})
		t.Run("Draining, "+c.name, func(t *testing.T) {
			w := stagedWorld(2, 1)
			w.step()
			c.mutate(w)
			checkSlotStep(t, w, "workers-reboot-0", edge(PhaseDraining, c.op, c.why))
		})
	}
	for _, c := range []struct {
		name   string
		mutate func(w *world)
		op     Op
		why    string
	}{
		{"agent reports the image staged, not locked", func(w *world) {
			w.agentReports("node-00", imgV0, imgV1, fleetv1.PhaseStaged)
			w.bns["node-00"].Status.Staged.DownloadOnly = false
		}, OpRelease, WhyStaged},
		{"no report listing the grant for a lease duration", func(w *world) { w.now = w.now.Add(61 * time.Second) }, OpRelease, WhyExpired},
		{"agent let go of the grant", func(w *world) {
			s, _ := w.grantOf("node-00", lease.KindStage)
			w.agentReports("node-00", imgV0, imageref.Pinned{}, fleetv1.PhaseWaiting)
			w.bns["node-00"].Status.Grants[0].Released = fleetv1.ReasonStageFailed
			if w.bns["node-00"].Status.Grants[0].Lease != s.Name {
				t.Fatal("setup: the agent does not list the grant")
			}
		}, OpRevoke, WhyReleasedByAgent},
		{"held past stageTimeout", func(w *world) {
			w.input()                 // the coordinator sees the grant now
			for i := 0; i < 62; i++ { // heartbeats keep it alive meanwhile
				w.now = w.now.Add(time.Minute)
				w.agentReports("node-00", imgV0, imageref.Pinned{}, fleetv1.PhaseStaging)
			}
		}, OpRevoke, WhyStageTimedOut},
	} {
		t.Run("Staging, "+c.name, func(t *testing.T) {
			w := settled(1, 1, 1)
			w.step()
			c.mutate(w)
			checkSlotStep(t, w, "workers-stage-0", edge(PhaseStaging, c.op, c.why))
		})
	}
	t.Run("Draining, uncordoned by someone", func(t *testing.T) {
		w := stagedWorld(2, 1)
		w.step()
		w.nodes["node-00"].Unschedulable = false
		checkSlotStep(t, w, "workers-reboot-0", edge(PhaseDraining, OpCordon, WhyCordon))
	})
	t.Run("Draining, signed images now required, stage unverified", func(t *testing.T) {
		w := stagedWorld(2, 1)
		w.step()
		w.pool.Spec.RequireSignedImages = true
		checkSlotStep(t, w, "workers-reboot-0", edge(PhaseDraining, OpRevoke, WhyStagedUnverified))
	})
}
