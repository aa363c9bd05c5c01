package plan

import (
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

func TestSelfSettableLabel(t *testing.T) {
	for key, want := range map[string]bool{
		"pool":                                      true, // no prefix
		"example.com/pool":                          true,
		"fleet.bootc.dev/pool":                      true,
		"kubernetes.io/hostname":                    true, // a kubelet label: it writes any value
		"kubernetes.io/arch":                        true,
		"node.kubernetes.io/instance-type":          true,
		"foo.node.kubernetes.io/x":                  true, // under an allowed kubelet namespace
		"kubelet.kubernetes.io/x":                   true,
		"topology.kubernetes.io/zone":               true,
		"node-restriction.kubernetes.io/pool":       false,
		"fleet.node-restriction.kubernetes.io/pool": false,
		"node-role.kubernetes.io/worker":            false, // kubernetes.io, not a kubelet label
		"kubernetes.io/role":                        false,
		"example.k8s.io/pool":                       false,
		"k8s.io/pool":                               false,
	} {
		if got := SelfSettableLabel(key); got != want {
			t.Errorf("SelfSettableLabel(%q) = %v, want %v", key, got, want)
		}
	}
}

func TestNodeSelectorRestrictedCondition(t *testing.T) {
	w := settled(2, 1, 1)
	w.pool.Spec.NodeSelector = metav1.LabelSelector{
		MatchLabels: map[string]string{"node-restriction.kubernetes.io/pool": "a"},
		MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: "node-role.kubernetes.io/worker", Operator: metav1.LabelSelectorOpExists},
		},
	}
	out := w.plan()
	if c := cond(out, fleetv1.PoolNodeSelectorRestricted); c.Status != metav1.ConditionTrue || c.Reason != fleetv1.ReasonRestrictedLabels {
		t.Fatalf("restricted keys: %+v", c)
	}
	if hasEvent(out, fleetv1.ReasonSelfSettableLabels, "") {
		t.Fatal("warned about a restricted selector")
	}
	w.pool.Spec.NodeSelector.MatchExpressions = append(w.pool.Spec.NodeSelector.MatchExpressions,
		metav1.LabelSelectorRequirement{Key: "team", Operator: metav1.LabelSelectorOpIn, Values: []string{"a"}})
	w.pool.Spec.NodeSelector.MatchLabels["kubernetes.io/hostname"] = "x"
	out = w.step()
	c := cond(out, fleetv1.PoolNodeSelectorRestricted)
	if c.Status != metav1.ConditionFalse || c.Reason != fleetv1.ReasonSelfSettableLabels ||
		!strings.Contains(c.Message, `"kubernetes.io/hostname", "team"`) || strings.Contains(c.Message, "worker") {
		t.Fatalf("self-settable keys: %+v", c)
	}
	if !hasEvent(out, fleetv1.ReasonSelfSettableLabels, `"team"`) {
		t.Fatalf("no Warning event: %+v", out.Events)
	}
	// Said once, not on every pass.
	if out := w.step(); hasEvent(out, fleetv1.ReasonSelfSettableLabels, "") {
		t.Fatal("warned again with nothing changed")
	}
}

// BootcNodes are created and changed in the queue order (writeOrder): the
// canaries, then the zone rolling, then zone by zone (no zone last), by
// name, a node whose last stage failed behind the others of its wave. The
// controller writes them in this order, so a node gets its target about
// when it is granted; the stage grants of the pass go to the first nodes
// of the same order.
func TestBootcNodesAreWrittenInTheQueueOrder(t *testing.T) {
	w := newWorld(8, 2, 2)
	canaries(w, intstr.FromInt32(1), 0)
	zones(w, "node-00=zone-b node-01=zone-a node-02=zone-b node-03=zone-a node-05=zone-a node-06=zone-b node-07=zone-c")
	w.nodes["node-06"].Canary = true
	names := func(cs []BootcNodeChange) []string {
		var out []string
		for _, c := range cs {
			out = append(out, c.Name)
		}
		return out
	}
	// Created in the queue order: the canary, then its zone (the canaries
	// go zone by zone too), then the other zones, the node without one last.
	want := []string{"node-06", "node-00", "node-02", "node-01", "node-03", "node-05", "node-07", "node-04"}
	if got := names(w.step().CreateBootcNodes); !slices.Equal(got, want) {
		t.Fatalf("created %v, want %v", got, want)
	}
	for _, name := range sortedKeys(w.nodes) {
		w.agentReports(name, imgV0, imageref.Pinned{}, fleetv1.PhaseWaiting)
	}
	w.bns["node-00"].Status.Reason = fleetv1.ReasonStageFailed // behind the others of its zone
	w.target = imgV2
	out := w.step()
	want = []string{"node-06", "node-02", "node-00", "node-01", "node-03", "node-05", "node-07", "node-04"}
	if got := names(out.UpdateBootcNodes); !slices.Equal(got, want) {
		t.Fatalf("targets written in the order %v, want %v", got, want)
	}
	if got := nodesOf(changes(out, OpGrant, lease.KindStage)); !slices.Equal(got, want[:2]) {
		t.Fatalf("stage grants to %v, want the first of the write order %v", got, want[:2])
	}
}
