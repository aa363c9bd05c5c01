package controller

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/metrics"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/plan"
)

// The gauges follow the pass's status and slots: progress moves on first
// sight, more nodes updated and a new target, not on fewer updated; a
// held slot has its series until it is free; a failure mark and an agent's
// SignatureRejected in its current boot are failed nodes; a slot whose mark
// is no reason is malformed, with no node series.
func TestPoolGaugesFollowStatusAndSlots(t *testing.T) {
	const name = "gauges"
	t.Cleanup(func() { metrics.ForgetPool(name) })
	img := imageref.Pinned{Repository: "quay.io/example/os", Digest: "sha256:" + fill('1')}
	boot := "11111111-0000-4000-8000-000000000001"
	t0 := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	grant := func(kind lease.Kind, i int, node string, at time.Time) *coordinationv1.Lease {
		l := plan.NewSlotLease(name, plan.SlotRef{Kind: kind, Index: i})
		plan.ApplyToLease(l, plan.SlotChange{Op: plan.OpGrant, Kind: kind, Node: node, Image: img, BootID: boot}, at, time.Minute)
		return l
	}
	free := plan.NewSlotLease(name, plan.SlotRef{Kind: lease.KindReboot, Index: 1})
	leases := map[string]*coordinationv1.Lease{"r0": grant(lease.KindReboot, 0, "n1", t0), "r1": free, "s0": grant(lease.KindStage, 0, "n2", t0.Add(time.Minute))}
	lease.MarkFailed(leases["r0"], fleetv1.ReasonRebootTimeout)
	pool := &fleetv1.BootcNodePool{ObjectMeta: metav1.ObjectMeta{Name: name}}
	pool.Spec.Rollout.Paused = true
	in := plan.Input{Now: t0.Add(time.Hour),
		Nodes: []plan.Node{{Name: "n3", InPool: true, BootID: boot}, {Name: "n4", InPool: true, BootID: boot}},
		BootcNodes: []fleetv1.BootcNode{
			{ObjectMeta: metav1.ObjectMeta{Name: "n3"}, Spec: fleetv1.BootcNodeSpec{Pool: name, DesiredImage: img.String()},
				Status: fleetv1.BootcNodeStatus{BootID: boot, Phase: fleetv1.PhaseDegraded, Reason: fleetv1.ReasonSignatureRejected}},
			// Reported in an earlier boot: not acted on, not counted.
			{ObjectMeta: metav1.ObjectMeta{Name: "n4"}, Spec: fleetv1.BootcNodeSpec{Pool: name, DesiredImage: img.String()},
				Status: fleetv1.BootcNodeStatus{BootID: "22222222-0000-4000-8000-000000000002", Phase: fleetv1.PhaseDegraded, Reason: fleetv1.ReasonSignatureRejected}},
		}}
	st := fleetv1.BootcNodePoolStatus{Nodes: 5, Updated: 2, Quiet: 1, TargetImage: img.String()}
	meta := func(typ string, s metav1.ConditionStatus) metav1.Condition {
		return metav1.Condition{Type: typ, Status: s, Reason: "R", LastTransitionTime: metav1.NewTime(t0)}
	}
	st.Conditions = []metav1.Condition{meta(fleetv1.PoolHalted, metav1.ConditionTrue), meta(fleetv1.PoolMaintenanceWindow, metav1.ConditionFalse)}
	p := newPoolProgress()
	p.observePool(pool, st, leases, in, nil)

	for _, c := range []struct {
		what      string
		got, want float64
	}{
		{"nodes", testutil.ToFloat64(metrics.PoolNodes.WithLabelValues(name)), 5},
		{"updated", testutil.ToFloat64(metrics.PoolNodesUpdated.WithLabelValues(name)), 2},
		{"quiet", testutil.ToFloat64(metrics.PoolNodesQuiet.WithLabelValues(name)), 1},
		{"halted", testutil.ToFloat64(metrics.PoolHalted.WithLabelValues(name)), 1},
		{"paused", testutil.ToFloat64(metrics.PoolPaused.WithLabelValues(name)), 1},
		{"in window", testutil.ToFloat64(metrics.PoolInWindow.WithLabelValues(name)), 0},
		{"reboot budget", testutil.ToFloat64(metrics.PoolSlots.WithLabelValues(name, "reboot")), 2},
		{"stage budget", testutil.ToFloat64(metrics.PoolSlots.WithLabelValues(name, "stage")), 1},
		{"progress on first sight", testutil.ToFloat64(metrics.PoolLastProgress.WithLabelValues(name)), float64(in.Now.Unix())},
		{"n1 held since", testutil.ToFloat64(metrics.NodeSlotHeldSince.WithLabelValues(name, "n1", "reboot")), float64(t0.Unix())},
		{"n2 held since", testutil.ToFloat64(metrics.NodeSlotHeldSince.WithLabelValues(name, "n2", "stage")), float64(t0.Add(time.Minute).Unix())},
		{"n1 failed", testutil.ToFloat64(metrics.NodeFailed.WithLabelValues(name, "n1", "RebootTimeout")), 1},
		{"n3 failed", testutil.ToFloat64(metrics.NodeFailed.WithLabelValues(name, "n3", "SignatureRejected")), 1},
		{"held series", float64(seriesOf(t, metrics.NodeSlotHeldSince, name)), 2},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
		}
	}
	if n := seriesOf(t, metrics.NodeFailed, name); n != 2 {
		t.Errorf("%d failed series, want 2 (n4's report is from an earlier boot)", n)
	}

	// Fewer updated is no progress; the stage slot freed drops its series;
	// a slot whose failure mark is no reason is malformed: no series.
	in.Now = in.Now.Add(time.Hour)
	st.Updated = 1
	leases["s0"] = plan.NewSlotLease(name, plan.SlotRef{Kind: lease.KindStage, Index: 0})
	leases["r0"].Annotations[lease.AnnotationFailure] = "not a reason\n"
	in.BootcNodes = nil
	p.observePool(pool, st, leases, in, nil)
	if got := testutil.ToFloat64(metrics.PoolLastProgress.WithLabelValues(name)); got != float64(t0.Add(time.Hour).Unix()) {
		t.Errorf("progress moved to %v on fewer nodes updated", time.Unix(int64(got), 0).UTC())
	}
	if n := seriesOf(t, metrics.NodeSlotHeldSince, name); n != 0 {
		t.Errorf("%d held series after the stage slot was freed and the reboot slot malformed, want 0", n)
	}
	if n := seriesOf(t, metrics.NodeFailed, name); n != 0 {
		t.Errorf("%d failed series, want none", n)
	}
	if got := testutil.ToFloat64(metrics.PoolSlots.WithLabelValues(name, "reboot")); got != 2 {
		t.Errorf("reboot budget %v, want 2 (a malformed slot is still a slot)", got)
	}

	// More updated, and a new target, are progress.
	in.Now = in.Now.Add(time.Hour)
	st.Updated = 3
	p.observePool(pool, st, leases, in, nil)
	if got := testutil.ToFloat64(metrics.PoolLastProgress.WithLabelValues(name)); got != float64(in.Now.Unix()) {
		t.Errorf("progress at %v, want %v after more nodes updated", time.Unix(int64(got), 0).UTC(), in.Now)
	}
}

// seriesOf counts the series of c whose pool label is pool.
func seriesOf(t *testing.T, c prometheus.Collector, pool string) int {
	t.Helper()
	ch := make(chan prometheus.Metric, 100)
	go func() { c.Collect(ch); close(ch) }()
	n := 0
	for m := range ch {
		var d dto.Metric
		if err := m.Write(&d); err != nil {
			t.Fatal(err)
		}
		for _, l := range d.GetLabel() {
			if l.GetName() == metrics.LabelPool && l.GetValue() == pool {
				n++
			}
		}
	}
	return n
}
