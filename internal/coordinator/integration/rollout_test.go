package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/controller"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/plan"
)

const repo = "registry.example/os"

var (
	v0 = pinned(repo, '0')
	v1 = pinned(repo, '1')
)

func TestFullRolloutTenNodesMaxUnavailableThree(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := newFleet(t, "full", 10, v0)
	f.run(ctx, 3)
	startCoordinator(t, "full", nil)
	f.createPool(func(p *fleetv1.BootcNodePool) {
		p.Spec.Image = v1.String()
		p.Spec.Rollout.MaxUnavailable = ptr.To(intstr.FromInt32(3))
	})
	// What a pipeline runs after changing spec.image.
	waiting := startWait(ctx, t, "full", "--timeout", "5m")
	f.allOn(t, v1, 180*time.Second)
	eventually(t, 30*time.Second, "pool UpToDate", func() (bool, string) {
		c := f.condition(fleetv1.PoolUpToDate)
		return c.Status == metav1.ConditionTrue, c.Message
	})
	if code, out := waiting.result(t, 60*time.Second); code != 0 || !strings.Contains(out, "pool full is up to date on "+v1.String()) {
		t.Errorf("wait full exited %d once the rollout finished:\n%s", code, out)
	}
	cancel()
	f.assertBudgetHeld(t)
	f.assertRebootsEach(t, 1)
	st := f.getPool().Status
	if st.Updated != 10 || st.Nodes != 10 || st.TargetImage != v1.String() {
		t.Fatalf("status %+v", st)
	}
	if f.maxReboot < 2 {
		t.Errorf("at most %d reboot slots ever held: the rollout did not use its budget", f.maxReboot)
	}
	for _, l := range f.leases(context.Background()) {
		// A stage slot whose holder runs its image is finished and stays
		// held until the next stage grant hands it on (amendment 31).
		finished := l.Labels[lease.LabelSlot] == string(lease.KindStage) && l.Annotations[lease.AnnotationImage] == v1.String()
		if l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "" && !finished {
			t.Errorf("slot %s still held by %s", l.Name, *l.Spec.HolderIdentity)
		}
	}
	var nodes corev1.NodeList
	if err := env.Client.List(context.Background(), &nodes, client.MatchingLabels{"test-pool": f.label}); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Items {
		if n.Spec.Unschedulable {
			t.Errorf("node %s left cordoned", n.Name)
		}
	}
	if len(events(t, "full", fleetv1.EventNodeUpdated)) == 0 {
		t.Error("no NodeUpdated events")
	}
}

func TestDrainBlockedByPDBNeverReboots(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := newFleet(t, "pdb", 2, v0)
	blocked := "pdb-n00"
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "pdb-test"}}
	if err := env.Client.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web-0", Namespace: ns.Name, Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{NodeName: blocked, AutomountServiceAccountToken: ptr.To(false),
			Containers: []corev1.Container{{Name: "web", Image: "registry.example/web:1"}}},
	}
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "web-pdb", Namespace: ns.Name},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(1)),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}},
	}
	for _, o := range []client.Object{pod, pdb} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	// A Running, Ready pod (a Pending one may be evicted regardless of PDBs).
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	if err := env.Client.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
	f.run(ctx, 1)
	startCoordinator(t, "pdb", nil)
	f.createPool(func(p *fleetv1.BootcNodePool) {
		p.Spec.Image = v1.String()
		p.Spec.Rollout.DrainTimeout = &metav1.Duration{Duration: 2 * time.Second}
	})
	// Whichever node gets the reboot slot first, pdb-n00 cannot drain.
	eventually(t, 90*time.Second, "a DrainFailed event naming the PDB", func() (bool, string) {
		evs := events(t, "pdb", fleetv1.EventDrainFailed)
		for _, e := range evs {
			if strings.Contains(e, "pdb-test/web-pdb") && strings.Contains(e, "pdb-test/web-0") {
				return true, ""
			}
		}
		return false, fmt.Sprintf("events %v; status %+v; reboots %d", allEvents(t, "pdb"), f.getPool().Status, f.node(blocked).reboots)
	})
	c := f.condition(fleetv1.PoolDegraded)
	if c.Reason != fleetv1.ReasonDrainFailed || !strings.Contains(c.Message, "web-pdb") {
		t.Fatalf("Degraded = %+v", c)
	}
	// Retried: a second attempt fails too, and the slot never reached Reboot.
	eventually(t, 90*time.Second, "a second drain attempt", func() (bool, string) {
		evs := events(t, "pdb", fleetv1.EventDrainFailed)
		for _, e := range evs {
			if strings.Contains(e, "attempt 2") {
				return true, ""
			}
		}
		return false, strings.Join(evs, " | ")
	})
	f.mu.Lock()
	reboots := f.nodes[blocked].reboots
	f.mu.Unlock()
	if reboots != 0 {
		t.Fatalf("node %s rebooted with an undrained pod", blocked)
	}
	for _, l := range f.leases(ctx) {
		g, err := lease.Parse(&l)
		if err != nil || g.Holder != blocked || g.Kind != lease.KindReboot {
			continue
		}
		if g.Phase != lease.PhaseDraining {
			t.Fatalf("grant advanced to %s without a drain", g.Phase)
		}
		// The cordon the coordinator made is recorded by the advance;
		// until then the grant says pending and the Node carries the
		// grant's mark, written in the cordon's own update (amendment 29).
		var n corev1.Node
		if err := env.Client.Get(ctx, clientKey("", blocked), &n); err != nil {
			t.Fatal(err)
		}
		if g.Cordon != lease.CordonPending || !n.Spec.Unschedulable || n.Annotations[lease.NodeAnnotationCordonedFor] != lease.CordonMark(g.ID) {
			t.Fatalf("draining grant records cordon %q, Node unschedulable %v with mark %q, want pending, true, %q",
				g.Cordon, n.Spec.Unschedulable, n.Annotations[lease.NodeAnnotationCordonedFor], lease.CordonMark(g.ID))
		}
	}
	// Once the PDB is gone the drain completes and the rollout finishes.
	if err := env.Client.Delete(ctx, pdb); err != nil {
		t.Fatal(err)
	}
	f.allOn(t, v1, 180*time.Second)
	// Every cordon was the coordinator's, and is lifted.
	eventually(t, 60*time.Second, "every node uncordoned", func() (bool, string) {
		var nodes corev1.NodeList
		if err := env.Client.List(ctx, &nodes); err != nil {
			return false, err.Error()
		}
		for _, n := range nodes.Items {
			if strings.HasPrefix(n.Name, "pdb-") && n.Spec.Unschedulable {
				return false, n.Name + " is still cordoned"
			}
		}
		return true, ""
	})
	cancel()
	f.assertBudgetHeld(t)
	f.assertRebootsEach(t, 1)
}

func TestNodeThatNeverReturnsTimesOutThenHalts(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := newFleet(t, "halt", 3, v0)
	stuck := "halt-n00"
	f.node(stuck).stuck = true
	for _, n := range []string{"halt-n01", "halt-n02"} {
		f.node(n).offline = true // their agents start once the pool halted
	}
	f.run(ctx, 2)
	metricsAddr := freeAddr(t)
	startCoordinator(t, "halt", func(o *controller.Options) { o.MetricsBindAddress = metricsAddr })
	f.createPool(func(p *fleetv1.BootcNodePool) {
		p.Spec.Image = v1.String()
		p.Spec.Rollout.MaxUnavailable = ptr.To(intstr.FromInt32(2))
		p.Spec.Rollout.RebootTimeout = &metav1.Duration{Duration: 2 * time.Second}
		p.Spec.Rollout.HaltAfterFailures = ptr.To(int32(1))
	})
	waiting := startWait(ctx, t, "halt")
	eventually(t, 90*time.Second, "pool Halted", func() (bool, string) {
		c := f.condition(fleetv1.PoolHalted)
		return c.Status == metav1.ConditionTrue && c.Reason == fleetv1.ReasonFailuresReached, c.Message
	})
	checkHaltedPoolMetrics(t, metricsAddr, "halt", stuck)
	if code, out := waiting.result(t, 60*time.Second); code == 0 || !strings.Contains(out, "error: pool halt is halted: FailuresReached: ") || !strings.Contains(out, "halt-n00 (RebootTimeout)") {
		t.Errorf("wait halt exited %d once the pool halted; want non-zero naming the failure:\n%s", code, out)
	}
	var failed *coordinationv1.Lease
	for _, l := range f.leases(ctx) {
		if l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity == stuck && l.Labels[lease.LabelSlot] == string(lease.KindReboot) {
			failed = l.DeepCopy()
		}
	}
	if failed == nil || failed.Annotations[lease.AnnotationFailure] != fleetv1.ReasonRebootTimeout {
		t.Fatalf("reboot slot of %s not marked RebootTimeout: %+v", stuck, failed)
	}
	if st := f.getPool().Status; st.Failures != 1 || st.Degraded < 1 {
		t.Fatalf("status %+v", st)
	}
	if len(events(t, "halt", fleetv1.EventRebootTimeout)) == 0 {
		t.Fatal("no RebootTimeout event")
	}
	// Staging continues while halted; rebooting does not.
	for _, n := range []string{"halt-n01", "halt-n02"} {
		f.mu.Lock()
		f.nodes[n].offline = false
		f.mu.Unlock()
	}
	eventually(t, 90*time.Second, "the other nodes staged", func() (bool, string) {
		st := f.getPool().Status
		return st.Staged == 2, ""
	})
	// Two more resync periods: a reboot grant would have been written by now.
	time.Sleep(2500 * time.Millisecond)
	for _, l := range f.leases(ctx) {
		if g, err := lease.Parse(&l); err == nil && g.Kind == lease.KindReboot && g.Holder != stuck {
			t.Fatalf("reboot grant %s to %s while halted", g.Lease, g.Holder)
		}
	}
	if l := failedLease(f, stuck); l == nil {
		t.Fatal("the failed reboot slot was reclaimed")
	}
	cancel()
	f.assertBudgetHeld(t)
}

func failedLease(f *fleet, node string) *coordinationv1.Lease {
	for _, l := range f.leases(context.Background()) {
		if l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity == node && l.Annotations[lease.AnnotationFailure] != "" {
			return &l
		}
	}
	return nil
}

func TestPauseStopsGrantsResumeFinishes(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := newFleet(t, "pause", 4, v0)
	f.run(ctx, 2)
	startCoordinator(t, "pause", nil)
	f.createPool(func(p *fleetv1.BootcNodePool) {
		p.Spec.Image = v1.String()
		p.Spec.Rollout.MaxUnavailable = ptr.To(intstr.FromInt32(2))
		p.Spec.Rollout.Paused = true
	})
	eventually(t, 60*time.Second, "Progressing=False Paused with all agents Waiting", func() (bool, string) {
		c := f.condition(fleetv1.PoolProgressing)
		st := f.getPool().Status
		return c.Reason == fleetv1.ReasonPaused && st.Waiting == 4, c.Reason
	})
	// A wait with a short timeout gives up, naming what blocks the pool.
	short := startWait(ctx, t, "pause", "--timeout", "2s")
	if code, out := short.result(t, 60*time.Second); code == 0 || !strings.Contains(out, "error: timed out after 2s waiting for pool pause to be UpToDate: ") || !strings.Contains(out, "blocked: Paused") {
		t.Errorf("wait --timeout 2s on a paused pool exited %d; want non-zero naming the pause:\n%s", code, out)
	}
	waiting := startWait(ctx, t, "pause")
	time.Sleep(1500 * time.Millisecond) // one resync: still nothing granted
	if !waiting.running() {
		_, out := waiting.result(t, time.Second)
		t.Fatalf("wait ended while the pool was paused:\n%s", out)
	}
	for _, l := range f.leases(ctx) {
		if l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "" {
			t.Fatalf("slot %s granted while paused", l.Name)
		}
	}
	// The coordinator writes the pool's status meanwhile: retry conflicts,
	// as kubectl edit would have the operator do.
	if err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		p := f.getPool()
		p.Spec.Rollout.Paused = false
		return env.Client.Update(ctx, p)
	}); err != nil {
		t.Fatal(err)
	}
	f.allOn(t, v1, 180*time.Second)
	if code, out := waiting.result(t, 60*time.Second); code != 0 {
		t.Errorf("wait pause exited %d after the resumed rollout:\n%s", code, out)
	}
	cancel()
	f.assertBudgetHeld(t)
	f.assertRebootsEach(t, 1)
}

func TestCoordinatorRestartMidRolloutResumes(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := newFleet(t, "restart", 6, v0)
	f.run(ctx, 2)
	stop := startCoordinator(t, "restart-a", nil)
	f.createPool(func(p *fleetv1.BootcNodePool) {
		p.Spec.Image = v1.String()
		p.Spec.Rollout.MaxUnavailable = ptr.To(intstr.FromInt32(2))
	})
	eventually(t, 90*time.Second, "a reboot slot held", func() (bool, string) {
		for _, l := range f.leases(ctx) {
			if g, err := lease.Parse(&l); err == nil && g.Kind == lease.KindReboot {
				return true, ""
			}
		}
		return false, ""
	})
	stop()
	startCoordinator(t, "restart-b", nil)
	f.allOn(t, v1, 180*time.Second)
	cancel()
	f.assertBudgetHeld(t)
	f.assertRebootsEach(t, 1)
}

func TestTwoCoordinatorsRacingNeverDoubleGrant(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := newFleet(t, "race", 8, v0)
	f.run(ctx, 2)
	// No leader election: both reconcile the same pool at once, and only
	// the Leases' resourceVersions keep them apart.
	startCoordinator(t, "race-a", nil)
	startCoordinator(t, "race-b", nil)
	f.createPool(func(p *fleetv1.BootcNodePool) {
		p.Spec.Image = v1.String()
		p.Spec.Rollout.MaxUnavailable = ptr.To(intstr.FromInt32(2))
	})
	f.allOn(t, v1, 240*time.Second)
	cancel()
	f.assertBudgetHeld(t)
	f.assertRebootsEach(t, 1)
}

// TestRacingGrantWritesConflict: two planners that read the same free slot
// both decide to grant it; against the real API server exactly one Update
// wins and the other gets a Conflict.
func TestRacingGrantWritesConflict(t *testing.T) {
	ctx := context.Background()
	l := plan.NewSlotLease("racers", plan.SlotRef{Name: lease.SlotName("racers", lease.KindReboot, 0), Kind: lease.KindReboot})
	if err := env.Client.Create(ctx, l); err != nil {
		t.Fatal(err)
	}
	for round := 0; round < 20; round++ {
		var read coordinationv1.Lease
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(l), &read); err != nil {
			t.Fatal(err)
		}
		results := make(chan error, 2)
		for _, node := range []string{"racer-a", "racer-b"} {
			go func() {
				mine := read.DeepCopy()
				plan.ApplyToLease(mine, plan.SlotChange{Op: plan.OpGrant, Kind: lease.KindReboot, Node: node, Image: v1, BootID: newBootID(node, 1), CordonedByUs: true}, time.Now(), time.Minute)
				results <- env.Client.Update(ctx, mine)
			}()
		}
		ok, conflicts := 0, 0
		for i := 0; i < 2; i++ {
			switch err := <-results; {
			case err == nil:
				ok++
			case isConflict(err):
				conflicts++
			default:
				t.Fatal(err)
			}
		}
		if ok != 1 || conflicts != 1 {
			t.Fatalf("round %d: %d writes won, %d conflicted; want exactly one winner", round, ok, conflicts)
		}
		var after coordinationv1.Lease
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(l), &after); err != nil {
			t.Fatal(err)
		}
		g, err := lease.Parse(&after)
		if err != nil || int(g.Transitions) != round+1 {
			t.Fatalf("round %d: lease %+v (%v)", round, g, err)
		}
		plan.ApplyToLease(&after, plan.SlotChange{Op: plan.OpRelease}, time.Now(), time.Minute)
		if err := env.Client.Update(ctx, &after); err != nil {
			t.Fatal(err)
		}
	}
}
