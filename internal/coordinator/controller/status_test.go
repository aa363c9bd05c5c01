package controller

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

func TestStatusUrgent(t *testing.T) {
	base := fleetv1.BootcNodePoolStatus{ObservedGeneration: 2, TargetImage: "r/os@sha256:aa", Nodes: 10, Updated: 3,
		Conditions: []metav1.Condition{{Type: fleetv1.PoolDegraded, Status: metav1.ConditionFalse, Reason: "AsExpected", Message: "all well", ObservedGeneration: 2}}}
	for _, c := range []struct {
		name   string
		change func(*fleetv1.BootcNodePoolStatus)
		urgent bool
	}{
		{"counts only", func(s *fleetv1.BootcNodePoolStatus) { s.Updated, s.Waiting = 4, 6 }, false},
		{"a condition's message only", func(s *fleetv1.BootcNodePoolStatus) { s.Conditions[0].Message = "4 of 10" }, false},
		{"a condition's status", func(s *fleetv1.BootcNodePoolStatus) { s.Conditions[0].Status = metav1.ConditionTrue }, true},
		{"a condition's reason", func(s *fleetv1.BootcNodePoolStatus) { s.Conditions[0].Reason = "DrainFailed" }, true},
		{"a new condition", func(s *fleetv1.BootcNodePoolStatus) {
			s.Conditions = append(s.Conditions, metav1.Condition{Type: fleetv1.PoolHalted, Status: metav1.ConditionTrue, Reason: "x"})
		}, true},
		{"the target image", func(s *fleetv1.BootcNodePoolStatus) { s.TargetImage = "r/os@sha256:bb" }, true},
		{"the observed generation", func(s *fleetv1.BootcNodePoolStatus) { s.ObservedGeneration = 3 }, true},
		{"a quarantine", func(s *fleetv1.BootcNodePoolStatus) {
			s.Quarantine = &fleetv1.Quarantine{SpecImage: "r/os:1", Digest: "r/os@sha256:aa", Node: "n1", Reason: "HostUnitFailed"}
		}, true},
		{"the canaries", func(s *fleetv1.BootcNodePoolStatus) {
			s.Canary = &fleetv1.CanaryStatus{Target: "r/os@sha256:aa", Nodes: []string{"n1"}}
		}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := *base.DeepCopy()
			c.change(&b)
			if got := statusUrgent(base, b); got != c.urgent {
				t.Fatalf("statusUrgent = %v, want %v", got, c.urgent)
			}
		})
	}
}
