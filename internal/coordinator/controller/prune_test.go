package controller

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/plan"
)

func reporting(name string, uid types.UID, phase fleetv1.NodePhase, at time.Time) fleetv1.BootcNode {
	return fleetv1.BootcNode{ObjectMeta: metav1.ObjectMeta{Name: name, UID: uid},
		Status: fleetv1.BootcNodeStatus{Phase: phase, LastReportTime: &metav1.MicroTime{Time: at}}}
}

// What the coordinator remembers of a node's reports goes with the node:
// a BootcNode deleted (or deleted and made again) leaves no entry behind.
func TestHeartbeatsForgetNodesThatAreGone(t *testing.T) {
	h := newHeartbeats()
	t0 := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	a, b := reporting("a", "uid-a", fleetv1.PhaseIdle, t0), reporting("b", "uid-b", fleetv1.PhaseIdle, t0)
	h.observe([]fleetv1.BootcNode{a, b}, t0)
	if len(h.nodes) != 2 {
		t.Fatalf("setup: %d entries", len(h.nodes))
	}
	// b is deleted; a is deleted and created again under a new UID.
	a2 := reporting("a", "uid-a2", fleetv1.PhaseIdle, t0)
	h.forgetGone(map[string]*fleetv1.BootcNode{"a": &a2})
	if _, ok := h.nodes["b"]; ok {
		t.Fatal("a deleted BootcNode's heartbeat is still remembered")
	}
	if s, ok := h.nodes["a"]; ok && s.uid == "uid-a" {
		t.Fatal("a BootcNode made again keeps its predecessor's heartbeat")
	}
}

// SlotsSeen is when the coordinator first saw the BootcNode's current
// slots annotation: it moves when the names change, not with every look.
func TestHeartbeatsTimeTheSlotsAnnotation(t *testing.T) {
	h := newHeartbeats()
	t0 := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	a := reporting("a", "uid-a", fleetv1.PhaseIdle, t0)
	a.SetSlots(nil)
	if got := h.observe([]fleetv1.BootcNode{a}, t0)["a"].SlotsSeen; !got.Equal(t0) {
		t.Fatalf("first sight: SlotsSeen %s, want %s", got, t0)
	}
	if got := h.observe([]fleetv1.BootcNode{a}, t0.Add(time.Minute))["a"].SlotsSeen; !got.Equal(t0) {
		t.Fatalf("same names a minute later: SlotsSeen %s, want %s", got, t0)
	}
	a.SetSlots([]string{"p-stage-0"})
	t2 := t0.Add(2 * time.Minute)
	if got := h.observe([]fleetv1.BootcNode{a}, t2)["a"].SlotsSeen; !got.Equal(t2) {
		t.Fatalf("a slot named: SlotsSeen %s, want %s", got, t2)
	}
}

// The GrantLatency clocks (who waits since when) keep only nodes that still
// wait in the pool; a pool deleted leaves none.
func TestWaitingForgetsNodesThatStoppedWaiting(t *testing.T) {
	r := &poolReconciler{waiting: map[string]time.Time{}}
	t0 := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	in := func(bns ...fleetv1.BootcNode) plan.Input {
		i := plan.Input{Now: t0, BootcNodes: bns}
		for _, bn := range bns {
			i.Nodes = append(i.Nodes, plan.Node{Name: bn.Name, InPool: true})
		}
		return i
	}
	w := &observed{}
	r.observeMetrics("p", w, in(reporting("n1", "1", fleetv1.PhaseWaiting, t0), reporting("n2", "2", fleetv1.PhaseStaged, t0)), nil)
	r.observeMetrics("q", w, in(reporting("m1", "3", fleetv1.PhaseWaiting, t0)), nil)
	if len(r.waiting) != 3 {
		t.Fatalf("setup: waiting %v", r.waiting)
	}
	// n1 left the pool (or was deleted), n2 went Degraded.
	r.observeMetrics("p", w, in(reporting("n2", "2", fleetv1.PhaseDegraded, t0)), nil)
	for _, k := range []string{waitKey("p", "n1", lease.KindStage), waitKey("p", "n2", lease.KindReboot)} {
		if _, ok := r.waiting[k]; ok {
			t.Fatalf("%s still waiting: %v", k, r.waiting)
		}
	}
	if _, ok := r.waiting[waitKey("q", "m1", lease.KindStage)]; !ok {
		t.Fatal("another pool's waiting node was forgotten")
	}
	r.forgetPool("q")
	if len(r.waiting) != 0 {
		t.Fatalf("a deleted pool's nodes are still waiting: %v", r.waiting)
	}
}
