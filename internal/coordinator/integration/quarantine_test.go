package integration

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// A pool with a host gate whose node never reports its host health fails
// that node's gate at health.timeout (HostNotReported), and the real API
// server takes what the planner writes: the failure on the Lease,
// status.quarantine, Degraded ImageFailedHealthCheck, every other desired
// image cleared. The node reports no rollback deployment, so it is not
// rolled back: its slot stays held and the pool halts (amendment 25). No
// other node is rebooted.
func TestGateTimeoutQuarantinesTheTarget(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := newFleet(t, "gate", 3, v0)
	f.run(ctx, 1)
	startCoordinator(t, "gate", nil)
	f.createPool(func(p *fleetv1.BootcNodePool) {
		p.Spec.Image = v1.String()
		p.Spec.Rollout.MaxUnavailable = ptr.To(intstr.FromInt32(1))
		p.Spec.Rollout.HaltAfterFailures = ptr.To(int32(3))
		p.Spec.Health = &fleetv1.HealthSpec{Timeout: &metav1.Duration{Duration: 30 * time.Second},
			Host: &fleetv1.HostHealthCheck{RequiredUnits: []string{"kubelet.service"}}}
	})
	var q *fleetv1.Quarantine
	eventually(t, 120*time.Second, "target quarantined", func() (bool, string) {
		p := f.getPool()
		q = p.Status.Quarantine
		c := f.condition(fleetv1.PoolDegraded)
		return q != nil && c.Reason == fleetv1.ReasonImageFailedHealthCheck, c.Message
	})
	if q.Digest != v1.String() || q.SpecImage != v1.String() || q.Reason != fleetv1.ReasonHostNotReported {
		t.Fatalf("quarantine %+v", q)
	}
	failed := failedLease(f, q.Node)
	if failed == nil || failed.Annotations[lease.AnnotationFailure] != fleetv1.ReasonHostNotReported {
		t.Fatalf("reboot slot of %s not marked %s: %+v", q.Node, fleetv1.ReasonHostNotReported, failed)
	}
	f.mu.Lock()
	var names []string
	for name := range f.nodes {
		names = append(names, name)
	}
	f.mu.Unlock()
	eventually(t, 30*time.Second, "pool Halted, other desired images cleared", func() (bool, string) {
		for _, name := range names {
			var bn fleetv1.BootcNode
			if err := f.c.Get(ctx, clientKey("", name), &bn); err != nil || (name != q.Node && bn.Spec.DesiredImage != "") {
				return false, name + " desired " + bn.Spec.DesiredImage
			}
		}
		c := f.condition(fleetv1.PoolHalted)
		return c.Status == metav1.ConditionTrue, c.Message
	})
	if len(events(t, "gate", fleetv1.EventHealthCheckFailed)) == 0 {
		t.Fatal("no HealthCheckFailed event")
	}
	cancel()
	f.assertBudgetHeld(t)
	f.mu.Lock()
	defer f.mu.Unlock()
	for name, n := range f.nodes {
		if name != q.Node && n.reboots != 0 {
			t.Fatalf("%s rebooted %d time(s) into a quarantined target", name, n.reboots)
		}
	}
}
