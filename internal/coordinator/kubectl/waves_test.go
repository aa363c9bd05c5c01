package kubectl

import (
	"bytes"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// TestStatusShowsWaves: `status POOL` of a pool with canaries and zones
// (amendment 26) shows each node's wave, and a node waiting for a reboot
// slot says which wave it waits for, in the order the real planner grants.
func TestStatusShowsWaves(t *testing.T) {
	w := newQueueWorld(t, lease.KindReboot, []string{"a-1", "a-2", "b-1", "b-2", "c-1"})
	w.pool.Spec.Rollout.Canary = &fleetv1.CanarySpec{Nodes: ptr.To(intstr.FromInt32(1)), Soak: &metav1.Duration{Duration: 600e9}}
	for _, z := range [][2]string{{"a-1", "zone-a"}, {"a-2", "zone-a"}, {"b-1", "zone-b"}, {"b-2", "zone-b"}} {
		w.node(z[0]).Zone = z[1]
	}
	w.node("b-2").Canary = true
	w.plan() // picks the canary, grants it the slot
	if w.pool.Status.Canary == nil || len(w.pool.Status.Canary.Nodes) != 1 || w.pool.Status.Canary.Nodes[0] != "b-2" {
		t.Fatalf("status.canary %+v, want the labelled b-2", w.pool.Status.Canary)
	}
	w.give("b-2")
	w.plan()
	v := w.view()
	if q := v.queue(lease.KindReboot); len(q) != 4 || q[0] != "b-1" {
		t.Fatalf("queue %q: want zone-b (under way) first", q)
	}
	r := &StatusReport{Time: metav1.Time{Time: now}, Pools: []PoolReport{v.poolReport()}}
	for _, name := range v.members {
		r.Nodes = append(r.Nodes, v.nodeReport(name))
	}
	var b bytes.Buffer
	writeStatus(&b, r)
	golden(t, "status-waves", "$ kubectl bootc-fleet status p\n"+b.String())
}
