package controller

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/plan"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/prober"
	"github.com/bootc-fleet/bootc-fleet/tests/envtest"
	"github.com/bootc-fleet/bootc-fleet/tests/promtest"
)

const (
	gateBoot1 = "11111111-1111-4111-8111-111111111111"
	gateBoot2 = "22222222-2222-4222-8222-222222222222"
)

// gateWorld is a pool's nodes as the planner sees them: n1 and n2 hold
// reboot grants after their drain, n3 a rollback grant, n4 nothing.
func gateWorld() (plan.Input, map[string]*fleetv1.BootcNode) {
	in := plan.Input{Nodes: []plan.Node{
		{Name: "gate-n1", InPool: true, Ready: true, BootID: gateBoot2},
		{Name: "gate-n2", InPool: true, Ready: true, BootID: gateBoot2},
		{Name: "gate-n3", InPool: true, Ready: true, BootID: gateBoot2},
		{Name: "gate-n4", InPool: true, Ready: true, BootID: gateBoot1},
	}}
	slot := func(i int, holder string, ph plan.SlotPhase, rollback bool) plan.Slot {
		return plan.Slot{Name: lease.SlotName("gate", lease.KindReboot, i), Kind: lease.KindReboot, Index: i, State: plan.SlotHeld, Phase: ph, Holder: holder,
			Grant: lease.Grant{Kind: lease.KindReboot, Holder: holder, Phase: lease.PhaseReboot, Rollback: rollback}}
	}
	in.Slots = []plan.Slot{slot(0, "gate-n1", plan.PhaseVerifying, false), slot(1, "gate-n2", plan.PhaseRebooting, false),
		slot(2, "gate-n3", plan.PhaseVerifying, true), {Name: lease.SlotName("gate", lease.KindReboot, 3), Kind: lease.KindReboot, Index: 3, State: plan.SlotFree, Phase: plan.PhaseFree}}
	host := &fleetv1.HostHealth{BootID: gateBoot2, SystemState: fleetv1.SystemRunning, Units: []fleetv1.UnitState{{Name: "kubelet.service", ActiveState: "active"}}}
	bns := map[string]*fleetv1.BootcNode{
		"gate-n1": {Status: fleetv1.BootcNodeStatus{BootID: gateBoot2, Host: host}},
		// n2's agent has not reported in its new boot yet.
		"gate-n2": {Status: fleetv1.BootcNodeStatus{BootID: gateBoot1, Host: &fleetv1.HostHealth{BootID: gateBoot1, SystemState: fleetv1.SystemRunning}}},
		"gate-n3": {Status: fleetv1.BootcNodeStatus{BootID: gateBoot2}},
	}
	return in, bns
}

func gatePod(t *testing.T, c client.Client, ns, name, node string, app string, ready bool, since time.Time) {
	t.Helper()
	ctx := t.Context()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": app}},
		Spec: corev1.PodSpec{NodeName: node, AutomountServiceAccountToken: ptr.To(false), Containers: []corev1.Container{{Name: "c", Image: "registry.example/c:1"}}}}
	if err := c.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	setPodReady(t, c, p, ready, since)
}

func setPodReady(t *testing.T, c client.Client, p *corev1.Pod, ready bool, since time.Time) {
	t.Helper()
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	p.Status.Phase = corev1.PodRunning
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: st, LastTransitionTime: metav1.NewTime(since)}}
	if err := c.Status().Update(t.Context(), p); err != nil {
		t.Fatal(err)
	}
}

// TestHealthGateReadsPodsAndHostReports: against a real API server, the
// gate's verdicts reach the planner's input for the nodes in the gate only,
// from the node's pods read by field and label selector and its host report.
func TestHealthGateReadsPodsAndHostReports(t *testing.T) {
	env := envtest.Start(t)
	c, err := client.New(env.Config, client.Options{Scheme: Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	for _, ns := range []string{"gate-a", "gate-b"} {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now()
	gatePod(t, c, "gate-a", "cni-n1", "gate-n1", "cni", true, now.Add(-time.Hour))
	gatePod(t, c, "gate-a", "web-n1", "gate-n1", "web", false, now) // not selected
	gatePod(t, c, "gate-b", "cni-n2", "gate-n2", "cni", false, now)
	gatePod(t, c, "gate-b", "cni-n3", "gate-n3", "cni", false, now)
	done := &corev1.Pod{}
	gatePod(t, c, "gate-b", "job-n1", "gate-n1", "cni", false, now)
	if err := c.Get(ctx, client.ObjectKey{Namespace: "gate-b", Name: "job-n1"}, done); err != nil {
		t.Fatal(err)
	}
	done.Status.Phase = corev1.PodSucceeded // ended: not a workload of the node any more
	if err := c.Status().Update(ctx, done); err != nil {
		t.Fatal(err)
	}

	pool := &fleetv1.BootcNodePool{ObjectMeta: metav1.ObjectMeta{Name: "gate"}, Spec: fleetv1.BootcNodePoolSpec{Health: &fleetv1.HealthSpec{
		Host:      &fleetv1.HostHealthCheck{RequiredUnits: []string{"kubelet.service"}},
		Workloads: &fleetv1.WorkloadHealthCheck{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "cni"}}, MinReadySeconds: 30},
	}}}
	g := newHealthGate(c, Options{HealthQueryInterval: time.Minute, HealthQueryTimeout: 10 * time.Second}, logr.Discard())
	in, bns := gateWorld()
	if recheck := g.fill(ctx, pool, bns, &in, now); recheck != gateRecheck {
		t.Errorf("recheck %s, want %s while a node has not passed", recheck, gateRecheck)
	}
	if len(in.Health) != 2 || in.MetricsError != "" || in.MetricsBlocked != nil {
		t.Fatalf("health %+v, metrics %q %v: want verdicts for gate-n1 and gate-n2 only", in.Health, in.MetricsError, in.MetricsBlocked)
	}
	if v := in.Health["gate-n1"]; !v.Passed() || len(v.Results) != 2 {
		t.Fatalf("gate-n1: %+v", v)
	}
	v := in.Health["gate-n2"]
	if first, _ := v.FirstFailure(); first.Reason != fleetv1.ReasonHostNotReported {
		t.Fatalf("gate-n2 first failure %+v", first)
	}
	if w := v.Results[1]; w.Pass || !strings.Contains(w.Message, "gate-b/cni-n2 (not Ready)") || strings.Contains(w.Message, "cni-n3") {
		t.Fatalf("gate-n2 workloads %+v", w)
	}

	// The pod turns Ready; a minute later, so does the gate's workloads check.
	var p corev1.Pod
	if err := c.Get(ctx, client.ObjectKey{Namespace: "gate-b", Name: "cni-n2"}, &p); err != nil {
		t.Fatal(err)
	}
	setPodReady(t, c, &p, true, now)
	in, bns = gateWorld()
	g.fill(ctx, pool, bns, &in, now.Add(10*time.Second))
	if w := in.Health["gate-n2"].Results[1]; w.Pass || !strings.Contains(w.Message, "Ready for 10s of 30s") {
		t.Fatalf("gate-n2 workloads 10s on: %+v", w)
	}
	in, bns = gateWorld()
	g.fill(ctx, pool, bns, &in, now.Add(time.Minute))
	if w := in.Health["gate-n2"].Results[1]; !w.Pass {
		t.Fatalf("gate-n2 workloads a minute on: %+v", w)
	}

	// No gate: nothing filled.
	in, bns = gateWorld()
	if recheck := g.fill(ctx, &fleetv1.BootcNodePool{ObjectMeta: metav1.ObjectMeta{Name: "gate"}}, bns, &in, now); recheck != 0 || in.Health != nil {
		t.Fatalf("no gate: recheck %s, health %+v", recheck, in.Health)
	}
}

// TestHealthGateMetrics: the pool's query against a real Prometheus, its
// token Secret read from the coordinator's namespace, run once per
// interval however often the pool is reconciled.
func TestHealthGateMetrics(t *testing.T) {
	env := envtest.Start(t)
	c, err := client.New(env.Config, client.Options{Scheme: Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	promURL := promtest.Start(t, "")
	ctx := t.Context()
	pool := &fleetv1.BootcNodePool{ObjectMeta: metav1.ObjectMeta{Name: "gate"}, Spec: fleetv1.BootcNodePoolSpec{Health: &fleetv1.HealthSpec{
		Metrics: &fleetv1.MetricsHealthCheck{URL: promURL, Query: `label_replace(vector(1), "node", "gate-n2", "", "") or label_replace(vector(1), "node", "elsewhere", "", "")`,
			BearerTokenSecret: "gate-token"},
	}}}
	g := newHealthGate(c, Options{HealthQueryInterval: time.Minute, HealthQueryTimeout: 10 * time.Second}, logr.Discard())
	var queries atomic.Int32
	g.query = func(ctx context.Context, t prober.Target) (model.Vector, error) {
		queries.Add(1)
		return prober.Query(ctx, t)
	}
	now := time.Now()
	in, bns := gateWorld()
	g.fill(ctx, pool, bns, &in, now)
	if !strings.Contains(in.MetricsError, "Secret bootc-fleet-system/gate-token not found") || queries.Load() != 0 {
		t.Fatalf("missing Secret: %q after %d queries", in.MetricsError, queries.Load())
	}
	if r := in.Health["gate-n1"].Results[0]; r.Reason != fleetv1.ReasonMetricsQueryFailed {
		t.Fatalf("gate-n1 with the query failing: %+v", r)
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: lease.Namespace, Name: "gate-token"}, Data: map[string][]byte{"token": []byte("t0ken")}}
	if err := c.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}
	// Still the cached answer within the interval.
	in, bns = gateWorld()
	g.fill(ctx, pool, bns, &in, now.Add(time.Second))
	if in.MetricsError == "" {
		t.Fatal("the failed answer was not kept for the interval")
	}
	for i := range 3 {
		in, bns = gateWorld()
		g.fill(ctx, pool, bns, &in, now.Add(time.Minute+time.Duration(i)*time.Second))
	}
	if queries.Load() != 1 {
		t.Fatalf("%d queries in one interval, want 1", queries.Load())
	}
	if in.MetricsError != "" || len(in.MetricsBlocked) != 1 || !strings.Contains(in.MetricsBlocked["gate-n2"], `node="gate-n2"`) {
		t.Fatalf("metrics error %q, blocked %v", in.MetricsError, in.MetricsBlocked)
	}
	if r := in.Health["gate-n2"].Results[0]; r.Reason != fleetv1.ReasonMetricsFiring || !in.Health["gate-n1"].Passed() {
		t.Fatalf("verdicts %+v", in.Health)
	}
	// A changed query is run at once; one that returns no vector fails.
	pool.Spec.Health.Metrics.Query = "1"
	in, bns = gateWorld()
	g.fill(ctx, pool, bns, &in, now.Add(time.Minute+5*time.Second))
	if !strings.Contains(in.MetricsError, "scalar") || in.MetricsBlocked != nil {
		t.Fatalf("scalar: %q, %v", in.MetricsError, in.MetricsBlocked)
	}
}
