package controller

import (
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/plan"
)

// Grants wait for a BootcNode to ask for the target, so a wish that changes
// a node's spec is written before every wish that only explains, even ones
// queued earlier and ready; among equals the queue is first come, first
// served. (The workers are not started: the test takes the queue's order.)
func TestBootcNodeWriterWritesSpecChangesFirst(t *testing.T) {
	b := newBootcNodeWriter(nil, nil, logr.Discard())
	defer b.queue.ShutDown()
	for _, n := range []string{"notes-a", "notes-b", "notes-c"} {
		b.set("pool", plan.BootcNodeChange{Name: n}, true, "")
	}
	time.Sleep(annotationDelay + 100*time.Millisecond) // the notes are ready now
	for _, n := range []string{"spec-a", "spec-b"} {
		b.set("pool", plan.BootcNodeChange{Name: n}, false, "")
	}
	// A node with notes queued that then needs a spec change moves up.
	b.set("pool", plan.BootcNodeChange{Name: "notes-c"}, false, "")

	want := []string{"spec-a", "spec-b", "notes-c", "notes-a", "notes-b"}
	for i, w := range want {
		got, prio, shut := b.queue.GetWithPriority()
		if shut {
			t.Fatal("queue shut down")
		}
		b.queue.Done(got)
		if got != w {
			t.Fatalf("write %d: got %s (priority %d), want %s; order wanted %v", i, got, prio, w, want)
		}
	}
}

// A node's new target is handed to the writer as soon as the stage grant
// written with it is (amendment 29's order, Lease first), before the rest
// of the pass's slots, and so is the name of a slot its agent is to watch
// (amendment 39), a reboot slot's first; a change of the annotations alone,
// or a node granted nothing, waits for applyBootcNodes.
func TestTargetsAreHandedOverWithTheirStageGrants(t *testing.T) {
	b := newBootcNodeWriter(nil, nil, logr.Discard())
	defer b.queue.ShutDown()
	spec := func(img string) fleetv1.BootcNodeSpec {
		return fleetv1.BootcNodeSpec{Pool: "pool", DesiredImage: img}
	}
	w := &observed{bootcNodes: map[string]*fleetv1.BootcNode{}}
	for _, n := range []string{"a", "b", "c", "d"} {
		w.bootcNodes[n] = &fleetv1.BootcNode{Spec: spec("old")}
	}
	changes := []plan.BootcNodeChange{
		{Name: "a", Spec: spec("new"), RolloutState: fleetv1.RolloutStaging},
		{Name: "b", Spec: spec("old"), RolloutState: fleetv1.RolloutDraining}, // notes only
		{Name: "c", Spec: spec("new"), RolloutState: fleetv1.RolloutWaitingForStageSlot},
		{Name: "d", Spec: spec("new"), RolloutState: fleetv1.RolloutStaging},
		// an advance to phase Reboot: notes and the slot's name its agent
		// is to watch
		{Name: "e", Spec: spec("old"), RolloutState: fleetv1.RolloutRebooting, Slots: []string{"pool-reboot-0"}},
		// a stage grant for a target written before: notes and a stage slot
		{Name: "f", Spec: spec("new"), RolloutState: fleetv1.RolloutStaging, Slots: []string{"pool-stage-1"}},
		// a slot named already: notes only
		{Name: "g", Spec: spec("old"), RolloutState: fleetv1.RolloutRebooting, Slots: []string{"pool-reboot-1"}},
	}
	w.bootcNodes["e"] = &fleetv1.BootcNode{Spec: spec("old")}
	w.bootcNodes["f"] = &fleetv1.BootcNode{Spec: spec("new")}
	w.bootcNodes["g"] = &fleetv1.BootcNode{Spec: spec("old")}
	w.bootcNodes["g"].SetSlots([]string{"pool-reboot-1"})
	targets := newTargetsAfterGrants(w, changes)
	targets.granted(b, "pool", []plan.SlotChange{{Op: plan.OpRelease, Kind: lease.KindStage, Node: "x"}, {Op: plan.OpGrant, Kind: lease.KindStage, Node: "d"}})
	targets.granted(b, "pool", []plan.SlotChange{{Op: plan.OpGrant, Kind: lease.KindReboot, Node: "b"}})
	targets.granted(b, "pool", []plan.SlotChange{{Op: plan.OpGrant, Kind: lease.KindStage, Node: "a"}})
	targets.granted(b, "pool", []plan.SlotChange{{Op: plan.OpAdvance, Kind: lease.KindReboot, Node: "e"}})
	targets.granted(b, "pool", []plan.SlotChange{{Op: plan.OpGrant, Kind: lease.KindStage, Node: "f"}})
	targets.granted(b, "pool", []plan.SlotChange{{Op: plan.OpAdvance, Kind: lease.KindReboot, Node: "g"}})
	// e first: a new reboot slot's name outranks a target (priorityReboot);
	// a new stage slot's goes as a target does.
	for _, want := range []string{"e", "d", "a", "f"} {
		got, _, _ := b.queue.GetWithPriority()
		b.queue.Done(got)
		if got != want {
			t.Fatalf("handed over %s, want %s (e, then d, a and f as their grants were written)", got, want)
		}
	}
	if n := b.queue.Len(); n != 0 {
		t.Fatalf("%d more handed over, want none: b and g change only notes, c was granted nothing", n)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.want["d"].change.Spec.DesiredImage != "new" || !b.want["d"].spec {
		t.Fatalf("d's wish %+v", b.want["d"])
	}
}
