package plan

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// Stage slots released lazily (docs/design.md, amendment 31).

// finishedWorld: n nodes, maxStaging 1; node-00 holds stage-0 and reports
// its image staged and locked, so the slot is Finished.
func finishedWorld(t *testing.T, n int) *world {
	t.Helper()
	w := settled(n, 1, 1)
	w.step()
	if s, ok := w.grantOf("node-00", lease.KindStage); !ok || s.Name != "workers-stage-0" {
		t.Fatalf("setup: node-00 holds no stage-0: %+v", s)
	}
	w.agentReports("node-00", imgV0, imgV1, fleetv1.PhaseStaged)
	if s, _ := w.slot(w.leases["workers-stage-0"]); s.Phase != PhaseFinished {
		t.Fatalf("setup: stage-0 is %s, want %s", s.Phase, PhaseFinished)
	}
	return w
}

func TestStageFinished(t *testing.T) {
	g := lease.Grant{Kind: lease.KindStage, Holder: "n", Image: imgV1, BootID: "b1", SoftRebootCount: 2}
	n := Node{Name: "n", BootID: "b1"}
	st := func(booted, staged string, downloadOnly bool, soft int64) *fleetv1.BootcNodeStatus {
		s := &fleetv1.BootcNodeStatus{BootID: "b1", SoftRebootCount: soft}
		if booted != "" {
			s.Booted = &fleetv1.Deployment{Digest: booted}
		}
		if staged != "" {
			s.Staged = &fleetv1.Deployment{Digest: staged, DownloadOnly: downloadOnly, Signature: fleetv1.SignatureInsecure}
		}
		return s
	}
	for _, c := range []struct {
		name          string
		n             Node
		st            *fleetv1.BootcNodeStatus
		requireSigned bool
		want          bool
	}{
		{"staged locked in the grant's boot", n, st(imgV0.Digest, imgV1.Digest, true, 2), false, true},
		{"staged, not locked: it may lock it under the grant", n, st(imgV0.Digest, imgV1.Digest, false, 2), false, false},
		{"staged locked, but its agent still reports Staging: the stage has not returned", n, func() *fleetv1.BootcNodeStatus {
			s := st(imgV0.Digest, imgV1.Digest, true, 2)
			s.Phase = fleetv1.PhaseStaging
			return s
		}(), false, false},
		{"staged unverified while signed images are required", n, st(imgV0.Digest, imgV1.Digest, true, 2), true, false},
		{"another image staged", n, st(imgV0.Digest, imgV2.Digest, true, 2), false, false},
		{"nothing staged yet", n, st(imgV0.Digest, "", false, 2), false, false},
		{"no fresh report", n, nil, false, false},
		{"booted on the image", n, st(imgV1.Digest, "", false, 2), false, true},
		{"the kubelet reports another boot", Node{Name: "n", BootID: "b2"}, nil, false, true},
		{"the agent reports another soft-reboot count", n, st(imgV0.Digest, "", false, 3), false, true},
		{"held by another node", Node{Name: "m", BootID: "b1"}, st(imgV0.Digest, imgV1.Digest, true, 2), false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := StageFinished(g, c.n, c.st, c.requireSigned); got != c.want {
				t.Fatalf("StageFinished = %v, want %v", got, c.want)
			}
		})
	}
	r := g
	r.Kind = lease.KindReboot
	if StageFinished(r, n, st(imgV1.Digest, "", false, 2), false) {
		t.Fatal("a reboot grant is never finished")
	}
}

// A holder that staged keeps its slot, unwritten: it counts against
// nothing, is not expired for lack of heartbeats, and its holder gets its
// reboot slot while it holds it.
func TestFinishedStageSlotIsKeptWithoutAWrite(t *testing.T) {
	w := finishedWorld(t, 1)
	out := w.step()
	if cs := changes(out, OpGrant, lease.KindReboot); len(cs) != 1 || cs[0].Node != "node-00" {
		t.Fatalf("changes %+v, want node-00's reboot grant", out.Changes)
	}
	for _, c := range out.Changes {
		if c.Kind == lease.KindStage {
			t.Fatalf("wrote the finished stage slot: %+v", c)
		}
	}
	if out.Status.Staging != 0 || out.Status.Rebooting != 1 {
		t.Fatalf("status counts %d staging, %d rebooting; want 0 and 1", out.Status.Staging, out.Status.Rebooting)
	}
	w.now = w.now.Add(10 * time.Minute) // no heartbeat lists it, for many lease durations
	if out := w.plan(); len(changes(out, OpRelease, lease.KindStage))+len(changes(out, OpRevoke, lease.KindStage)) != 0 {
		t.Fatalf("finished stage slot freed: %+v", out.Changes)
	}
}

// The next node's stage grant hands the finished slot on: one write, no
// release before it.
func TestFinishedStageSlotIsHandedOnInOneWrite(t *testing.T) {
	w := finishedWorld(t, 2)
	out := w.step()
	var stage []SlotChange
	for _, c := range out.Changes {
		if c.Kind == lease.KindStage {
			stage = append(stage, c)
		}
	}
	if len(stage) != 1 || stage[0].Op != OpGrant || stage[0].Node != "node-01" || stage[0].Slot != "workers-stage-0" {
		t.Fatalf("stage writes %+v, want one grant of stage-0 to node-01", stage)
	}
	if s, _ := w.slot(w.leases["workers-stage-0"]); s.Phase != PhaseStaging || s.Holder != "node-01" {
		t.Fatalf("stage-0 after the pass: %s held by %s", s.Phase, s.Holder)
	}
}

// A new target: the finished slot is neither revoked nor released; its own
// holder's next stage takes it first, in one write.
func TestImageChangeHandsAFinishedSlotBackToItsHolder(t *testing.T) {
	w := settled(2, 1, 2)
	w.step()
	w.agentReports("node-00", imgV0, imgV1, fleetv1.PhaseStaged)
	w.agentReports("node-01", imgV0, imgV1, fleetv1.PhaseStaged)
	old, _ := w.grantOf("node-01", lease.KindStage)
	w.target = imgV2
	out := w.step()
	for _, c := range out.Changes {
		if c.Kind == lease.KindStage && c.Op != OpGrant {
			t.Fatalf("wrote %+v: a finished slot needs no revoke", c)
		}
	}
	cs := changes(out, OpGrant, lease.KindStage)
	if len(cs) != 2 {
		t.Fatalf("stage grants %+v, want both nodes", cs)
	}
	for _, c := range cs {
		if c.Node == "node-01" && c.Slot != old.Name {
			t.Fatalf("node-01 was granted %s, not its own finished %s", c.Slot, old.Name)
		}
	}
}

// A quarantined target leaves a finished slot as it is: its holder does not
// work under it.
func TestQuarantineLeavesAFinishedSlot(t *testing.T) {
	w := finishedWorld(t, 1)
	w.pool.Status.Quarantine = &fleetv1.Quarantine{SpecImage: w.pool.Spec.Image, Digest: imgV1.Digest, Node: "node-09", Reason: fleetv1.ReasonHostNotRunning}
	out := w.step()
	for _, c := range out.Changes {
		if c.Kind == lease.KindStage {
			t.Fatalf("wrote %+v", c)
		}
	}
}

// The holder's report moves the slot: its locked stage gone in the grant's
// boot makes it a live grant again (counted, heartbeated, expired); booted
// on the image it is finished.
func TestFinishedSlotFollowsItsHoldersReport(t *testing.T) {
	w := finishedWorld(t, 2)
	w.agentReports("node-00", imgV0, imageref.Pinned{}, fleetv1.PhaseStaging)
	if s, _ := w.slot(w.leases["workers-stage-0"]); s.Phase != PhaseStaging {
		t.Fatalf("stage-0 with its stage gone is %s, want %s", s.Phase, PhaseStaging)
	}
	if out := w.plan(); len(changes(out, OpGrant, lease.KindStage)) != 0 {
		t.Fatalf("granted past maxStaging while the holder stages again: %+v", out.Changes)
	}
	w.agentReports("node-00", imgV1, imageref.Pinned{}, fleetv1.PhaseIdle)
	if s, _ := w.slot(w.leases["workers-stage-0"]); s.Phase != PhaseFinished {
		t.Fatalf("stage-0 of a holder booted on its image is %s, want %s", s.Phase, PhaseFinished)
	}
}

// Its holder gone, a finished slot is written free as a Staging one is (a
// deleted Node has no report, so its slot reads Staging).
func TestFinishedSlotOfAHolderThatLeft(t *testing.T) {
	for _, c := range []struct {
		name   string
		mutate func(w *world)
		want   Transition
	}{
		{"node deleted", func(w *world) { delete(w.nodes, "node-00") }, Transition{From: PhaseStaging, Op: OpRelease, Why: WhyNodeDeleted, To: PhaseFree}},
		{"node left the pool", func(w *world) { w.nodes["node-00"].InPool = false }, Transition{From: PhaseFinished, Op: OpRevoke, Why: WhyLeftPool, To: PhaseFree}},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := finishedWorld(t, 1)
			w.nodes["node-00"].Ready = false // no reboot grant meanwhile
			c.mutate(w)
			before := leaseCopies(w)
			out := w.plan()
			seen, _ := slotTransitions(w, before, out, w.now) // before the pass deletes the BootcNode
			w.apply(out)
			if len(seen) != 1 || seen[0] != c.want {
				t.Fatalf("transitions %v, want %v", seen, c.want)
			}
		})
	}
}

// A finished slot beyond a shrunk maxStaging is released, then deleted.
func TestSurplusFinishedSlotIsReleasedThenDeleted(t *testing.T) {
	w := settled(2, 1, 2)
	w.step()
	w.agentReports("node-00", imgV0, imgV1, fleetv1.PhaseStaged)
	w.agentReports("node-01", imgV0, imgV1, fleetv1.PhaseStaged)
	for _, n := range w.nodes {
		n.Ready = false // no reboot grants: only the stage slots move
	}
	w.pool.Spec.Rollout.MaxStaging = ptr.To(intstr.FromInt32(1))
	checkSlotStep(t, w, "workers-stage-1", []Transition{{From: PhaseFinished, Op: OpRelease, Why: WhySurplus, To: PhaseFree}})
	if out := w.step(); len(out.DeleteSlots) != 1 || out.DeleteSlots[0] != "workers-stage-1" {
		t.Fatalf("deleted %v, want workers-stage-1", out.DeleteSlots)
	}
	if s, _ := w.slot(w.leases["workers-stage-0"]); s.Phase != PhaseFinished {
		t.Fatalf("stage-0 is %s, want it kept %s", s.Phase, PhaseFinished)
	}
}

// A stage the agent still reports Staging has not returned, though bootc
// shows the image staged: the slot stays live, neither finished nor
// released, until the agent reports otherwise (amendment 31).
func TestStagedWhileStagingKeepsTheSlotLive(t *testing.T) {
	for _, locked := range []bool{true, false} {
		w := settled(2, 1, 1)
		w.step()
		w.agentReports("node-00", imgV0, imgV1, fleetv1.PhaseStaging)
		w.bns["node-00"].Status.Staged.DownloadOnly = locked
		if s, _ := w.slot(w.leases["workers-stage-0"]); s.Phase != PhaseStaging {
			t.Fatalf("locked %v: stage-0 is %s, want %s", locked, s.Phase, PhaseStaging)
		}
		for _, c := range w.step().Changes {
			if c.Kind == lease.KindStage {
				t.Fatalf("locked %v: wrote %+v while the stage has not returned", locked, c)
			}
		}
	}
}
