package controller

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// TestOnlyRolloutNotesStartNoPass: a BootcNode update starts a pass unless
// all it changed is the coordinator's rollout notes (and the version every
// write changes).
func TestOnlyRolloutNotesStartNoPass(t *testing.T) {
	base := func() *fleetv1.BootcNode {
		bn := &fleetv1.BootcNode{ObjectMeta: metav1.ObjectMeta{Name: "n1", ResourceVersion: "10", Generation: 2,
			Labels: map[string]string{"fleet.bootc.dev/pool": "p"}}}
		bn.SetRollout(fleetv1.RolloutWaitingForRebootSlot, "staged; waits for a reboot slot")
		bn.Spec.Pool, bn.Spec.DesiredImage = "p", "q.io/os@sha256:"+strings.Repeat("a", 64)
		bn.Status.Phase, bn.Status.BootID = fleetv1.PhaseStaged, "boot-1"
		return bn
	}
	cases := []struct {
		name   string
		change func(bn *fleetv1.BootcNode)
		pass   bool
	}{
		{"rollout notes only", func(bn *fleetv1.BootcNode) {
			bn.SetRollout(fleetv1.RolloutRebooting, "rebooting into it")
		}, false},
		{"notes removed by someone", func(bn *fleetv1.BootcNode) {
			bn.Annotations = nil
		}, false},
		{"status", func(bn *fleetv1.BootcNode) { bn.Status.Phase = fleetv1.PhaseRebooting }, true},
		{"status boot", func(bn *fleetv1.BootcNode) { bn.Status.BootID = "boot-2" }, true},
		{"spec", func(bn *fleetv1.BootcNode) { bn.Spec.DesiredImage = ""; bn.Generation = 3 }, true},
		{"labels", func(bn *fleetv1.BootcNode) { bn.Labels = nil }, true},
		{"another annotation", func(bn *fleetv1.BootcNode) { bn.SetNoPlatformImage("no image for linux/s390x") }, true},
		{"deletion", func(bn *fleetv1.BootcNode) { bn.DeletionTimestamp = &metav1.Time{} }, true},
	}
	p := bootcNodeChanged()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			old, cur := base(), base()
			tc.change(cur)
			cur.ResourceVersion = "11"
			if got := p.Update(event.UpdateEvent{ObjectOld: old, ObjectNew: cur}); got != tc.pass {
				t.Fatalf("starts a pass = %v, want %v", got, tc.pass)
			}
		})
	}
	// Creations and deletions always do.
	if !p.Create(event.CreateEvent{Object: base()}) || !p.Delete(event.DeleteEvent{Object: base()}) {
		t.Fatal("a BootcNode created or deleted must start a pass")
	}
}
