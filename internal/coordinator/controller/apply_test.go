package controller

import (
	"reflect"
	"testing"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/plan"
)

func TestSlotRounds(t *testing.T) {
	const r0, r1, s0, s1, s2 = "p-reboot-0", "p-reboot-1", "p-stage-0", "p-stage-1", "p-stage-2"
	ch := func(slot string, k lease.Kind, op plan.Op, node string) plan.SlotChange {
		return plan.SlotChange{Slot: slot, Kind: k, Op: op, Node: node}
	}
	changes := []plan.SlotChange{
		ch(s0, lease.KindStage, plan.OpRelease, "a"),  // a staged: its reboot grant counts on this
		ch(s1, lease.KindStage, plan.OpRelease, "b"),  // b staged, waits for a reboot slot
		ch(r0, lease.KindReboot, plan.OpRelease, "c"), // c is back ...
		ch(r0, lease.KindReboot, plan.OpGrant, "a"),   // ... and hands its slot to a: one write
		ch(r1, lease.KindReboot, plan.OpAdvance, "d"), // d drained
		ch(s1, lease.KindStage, plan.OpGrant, "e"),    // b's stage slot goes to e
		ch(s2, lease.KindStage, plan.OpGrant, "f"),    // a free stage slot
	}
	got := slotRounds(changes)
	slotsOf := func(round [][]plan.SlotChange) (out [][]plan.Op) {
		for _, chain := range round {
			var ops []plan.Op
			for _, c := range chain {
				ops = append(ops, c.Op)
			}
			out = append(out, ops)
		}
		return out
	}
	want := [][][]plan.Op{
		{{plan.OpRelease}, {plan.OpAdvance}},             // a's stage release, d's advance
		{{plan.OpRelease, plan.OpGrant}},                 // c's slot handed to a
		{{plan.OpRelease, plan.OpGrant}, {plan.OpGrant}}, // b's slot handed to e, then f
	}
	for i := range want {
		if g := slotsOf(got[i]); !reflect.DeepEqual(g, want[i]) {
			t.Fatalf("round %d = %v, want %v (all rounds %+v)", i, g, want[i], got)
		}
	}
	if got[0][0][0].Slot != s0 || got[1][0][0].Slot != r0 || got[2][0][0].Slot != s1 {
		t.Fatalf("rounds in the wrong slots: %+v", got)
	}
}

// A node's routine update is one Event, NodeUpdated; its steps before that
// are logged, and anything else about the node is still an Event
// (amendment 29).
func TestOnlyTheEndOfARoutineUpdateIsAnEvent(t *testing.T) {
	for _, c := range []struct {
		name string
		e    plan.Event
		step bool
	}{
		{"staged", plan.Event{Type: "Normal", Reason: fleetv1.EventStaged, Node: "n"}, true},
		{"reboot granted", plan.Event{Type: "Normal", Reason: fleetv1.EventRebootGranted, Node: "n"}, true},
		{"drained", plan.Event{Type: "Normal", Reason: fleetv1.EventDrained, Node: "n"}, true},
		{"back, waiting out minReadySeconds", plan.Event{Type: "Normal", Reason: fleetv1.EventNodeBack, Node: "n"}, true},
		{"updated is the update's Event", plan.Event{Type: "Normal", Reason: fleetv1.EventNodeUpdated, Node: "n"}, false},
		{"rolled back is the update's Event", plan.Event{Type: "Normal", Reason: fleetv1.EventRolledBack, Node: "n"}, false},
		{"a revoke is told", plan.Event{Type: "Normal", Reason: fleetv1.EventGrantRevoked, Node: "n"}, false},
		{"a warning is told", plan.Event{Type: "Warning", Reason: fleetv1.EventDrainFailed, Node: "n"}, false},
		{"a pool's Event is told", plan.Event{Type: "Normal", Reason: fleetv1.EventRolloutComplete}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := stepOfUpdate(c.e); got != c.step {
				t.Fatalf("stepOfUpdate(%+v) = %v, want %v", c.e, got, c.step)
			}
		})
	}
}
