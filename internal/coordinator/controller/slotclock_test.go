package controller

import (
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/plan"
)

// A previous leader whose clock ran 20 minutes ahead advanced a grant to
// phase Reboot, or recorded a node back, or released a slot: the times it
// wrote lie in this coordinator's past. The reboot timeout, minReadySeconds
// and pauseBetweenBatches still run their whole length from when this
// coordinator first saw each record, on its own clock (amendment 21).
func TestTimersRunFromThisCoordinatorsFirstSight(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	ahead := now.Add(-20 * time.Minute) // what the other leader wrote, as our clock reads it
	img := imageref.Pinned{Repository: "quay.io/example/os", Digest: "sha256:" + fill('1')}
	pool := &fleetv1.BootcNodePool{ObjectMeta: metav1.ObjectMeta{Name: "p", Generation: 1}, Spec: fleetv1.BootcNodePoolSpec{
		NodeSelector: metav1.LabelSelector{MatchLabels: map[string]string{"p": "p"}}, Image: "quay.io/example/os:1",
		Rollout: fleetv1.RolloutSpec{MaxUnavailable: ptr.To(intstr.FromInt32(2)), RebootTimeout: &metav1.Duration{Duration: 15 * time.Minute},
			MinReadySeconds: 60, PauseBetweenBatches: &metav1.Duration{Duration: 10 * time.Minute}}}}
	boot := "11111111-0000-4000-8000-000000000001"
	reboot := func(name, node string, annotations map[string]string) *coordinationv1.Lease {
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: lease.Namespace, UID: "uid-" + "x",
			Labels: map[string]string{lease.LabelPool: "p", lease.LabelSlot: "reboot", lease.LabelHolder: node},
			Annotations: map[string]string{lease.AnnotationImage: img.String(), lease.AnnotationBootID: boot, lease.AnnotationPhase: "Reboot",
				lease.AnnotationCordonedByUs: "false"}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(node), AcquireTime: &metav1.MicroTime{Time: ahead}, RenewTime: &metav1.MicroTime{Time: ahead},
				LeaseDurationSeconds: ptr.To(int32(60)), LeaseTransitions: ptr.To(int32(1))}}
		for k, v := range annotations {
			l.Annotations[k] = v
		}
		return l
	}
	leases := []*coordinationv1.Lease{
		reboot("p-reboot-0", "down", nil), // never came back
		reboot("p-reboot-1", "back", map[string]string{lease.AnnotationBackSince: ahead.Format(time.RFC3339Nano), lease.AnnotationCameBack: ahead.Format(time.RFC3339Nano)}),
	}
	nodes := []plan.Node{{Name: "down", InPool: true, BootID: boot}, {Name: "back", InPool: true, Ready: true, BootID: "22222222-0000-4000-8000-000000000002"}}
	bns := []fleetv1.BootcNode{{ObjectMeta: metav1.ObjectMeta{Name: "back"}, Spec: fleetv1.BootcNodeSpec{Pool: "p", DesiredImage: img.String()},
		Status: fleetv1.BootcNodeStatus{BootID: nodes[1].BootID, Booted: &fleetv1.Deployment{Image: img.String(), Digest: img.Digest}}}}
	clock := newSlotClock()
	pass := func(at time.Time) plan.Output {
		in := plan.Input{Pool: pool, Target: img, Nodes: nodes, BootcNodes: bns, Now: at, LeaseDuration: time.Minute, Drains: map[string]plan.Drain{}}
		for _, l := range leases {
			s, ok := plan.ParseSlot("p", l)
			if !ok || s.State != plan.SlotHeld {
				t.Fatalf("setup: slot %s is %v (%s)", l.Name, s.State, s.Problem)
			}
			in.Slots = append(in.Slots, s)
		}
		clock.observe("p", in.Slots, at)
		return plan.Plan(in)
	}
	for _, at := range []time.Time{now, now.Add(30 * time.Second), now.Add(14 * time.Minute)} {
		for _, c := range pass(at).Changes {
			switch {
			case c.Op == plan.OpMarkFailed:
				t.Fatalf("at +%s: %s marked %s by a timer a previous leader's clock started", at.Sub(now), c.Node, c.Failure)
			case c.Op == plan.OpRelease && c.Node == "back" && at.Sub(now) < time.Minute:
				t.Fatalf("at +%s: released before minReadySeconds on this coordinator's clock", at.Sub(now))
			}
		}
	}
	if out := pass(now.Add(16 * time.Minute)); len(out.Changes) == 0 {
		t.Fatal("the timers never end")
	}
}

func fill(c byte) string {
	b := make([]byte, 64)
	for i := range b {
		b[i] = c
	}
	return string(b)
}

// released-at (pauseBetweenBatches) is timed the same way, and a record
// that changes is seen anew; records of slots gone are forgotten.
func TestSlotClockReleasedAt(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	c := newSlotClock()
	slots := func(rel time.Time) []plan.Slot {
		return []plan.Slot{{Name: "p-reboot-0", Kind: lease.KindReboot, State: plan.SlotFree, ReleasedAt: rel}}
	}
	s := slots(now.Add(-time.Hour))
	c.observe("p", s, now)
	if !s[0].ReleasedAt.Equal(now) {
		t.Fatalf("released-at %s, want this coordinator's first sight %s", s[0].ReleasedAt, now)
	}
	s = slots(now.Add(-time.Hour))
	c.observe("p", s, now.Add(time.Minute))
	if !s[0].ReleasedAt.Equal(now) {
		t.Fatalf("released-at moved to %s on a second sight", s[0].ReleasedAt)
	}
	s = slots(now.Add(time.Minute))
	c.observe("p", s, now.Add(2*time.Minute))
	if !s[0].ReleasedAt.Equal(now.Add(2 * time.Minute)) {
		t.Fatalf("a new release is not seen anew: %s", s[0].ReleasedAt)
	}
	c.observe("q", nil, now)
	if len(c.seen) != 1 {
		t.Fatalf("another pool's pass forgot p's records: %v", c.seen)
	}
	c.observe("p", nil, now)
	if len(c.seen) != 0 {
		t.Fatalf("records of slots gone are kept: %v", c.seen)
	}
}
