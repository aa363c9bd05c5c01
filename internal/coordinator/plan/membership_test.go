package plan

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
