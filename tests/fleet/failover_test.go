package fleet

import (
	"context"
	"flag"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/sim"
	"github.com/bootc-fleet/bootc-fleet/internal/sim/invariant"
)

var failoverSeed = flag.Int64("failover-seed", 0, "seed of the failover tests' kill delays (default: the time)")

// The leader-election Lease is controller-runtime's default in the binary
// (no flag shortens it): 15 s, renew deadline 10 s, retry every 2 s. A
// SIGKILLed leader releases nothing, so a takeover takes up to about 17 s;
// 90 s bounds it on a loaded machine.
const takeoverBound = 90 * time.Second

// TestProcFleetFailoverStaleStatus: two leader-elected coordinator
// processes, the leader SIGKILLed three times during a rollout whose bootc
// status stays stale for 3 s after every reboot (the double-reboot trap).
// Every node ends on the target with exactly one reboot, under a grant,
// and I1-I5 hold. The takeovers are logged.
func TestProcFleetFailoverStaleStatus(t *testing.T) {
	seed := failoverSeedOf(t)
	f := startProcFleet(t, sim.ProcOptions{Nodes: 4, Replicas: 2, StageTime: 500 * time.Millisecond,
		BootTime: 500 * time.Millisecond, StaleAfterReboot: 3 * time.Second})
	ctx := context.Background()
	v2, err := f.Push("v2")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.CreatePool(ctx, "v2", 1, 2); err != nil {
		t.Fatal(err)
	}
	takeovers := killDuringRollout(t, f, seed, func() bool { ok, _ := f.Converged(ctx, v2); return ok })
	waitConverged(t, f, v2, 4*time.Minute)
	judgeFailover(t, f, v2, takeovers)
}

// TestProcFleetFailoverDrains: the same with a pod on every node (each
// node drained before its reboot) and one node cordoned by an
// administrator before the pool exists: it is rolled too, and its cordon
// is never lifted, by any leader.
func TestProcFleetFailoverDrains(t *testing.T) {
	seed := failoverSeedOf(t)
	f := startProcFleet(t, sim.ProcOptions{Nodes: 4, Replicas: 2, StageTime: 500 * time.Millisecond,
		BootTime: 500 * time.Millisecond, StaleAfterReboot: time.Second})
	ctx := context.Background()
	admin := f.Nodes[3].Name
	n, err := f.Kube.CoreV1().Nodes().Get(ctx, admin, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Spec.Unschedulable = true
	if _, err := f.Kube.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	evicted := watchPodDeletions(t, f)
	for _, pn := range f.Nodes {
		if err := runPodOn(ctx, f, pn.Name); err != nil {
			t.Fatal(err)
		}
	}
	v2, err := f.Push("v2")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.CreatePool(ctx, "v2", 2, 2); err != nil {
		t.Fatal(err)
	}
	converged := func() bool { ok, _ := convergedBut(ctx, f, v2, admin); return ok }
	takeovers := killDuringRollout(t, f, seed, converged)
	deadline := time.Now().Add(4 * time.Minute)
	for !converged() {
		if time.Now().After(deadline) {
			_, pending := convergedBut(ctx, f, v2, admin)
			t.Fatalf("not converged on %s within 4m: %s", v2, pending)
		}
		time.Sleep(250 * time.Millisecond)
	}
	judgeFailover(t, f, v2, takeovers)
	// Every node was drained before its reboot: its pod was gone first.
	gone := evicted()
	for _, e := range f.Log.Events() {
		if e.Kind != invariant.Reboot {
			continue
		}
		at, ok := gone[e.Node+"-web"]
		if !ok || at.After(e.At) {
			t.Errorf("%s rebooted at %s, its pod evicted at %v (ok %v): not drained first", e.Node, e.At.Format("15:04:05.000"), at.Format("15:04:05.000"), ok)
		}
	}
	// The administrator's cordon: never lifted, still there.
	for _, e := range f.Log.Events() {
		if e.Kind == invariant.Uncordon && e.Node == admin {
			t.Errorf("the administrator's cordon on %s was lifted: %s", admin, e)
		}
	}
	if n, err := f.Kube.CoreV1().Nodes().Get(ctx, admin, metav1.GetOptions{}); err != nil || !n.Spec.Unschedulable {
		t.Errorf("%s is no longer cordoned at the end (err %v)", admin, err)
	}
}

func failoverSeedOf(t *testing.T) int64 {
	seed := *failoverSeed
	if seed == 0 {
		seed = time.Now().UnixNano() % 100000
	}
	t.Logf("failover seed %d (replay: -run %s -failover-seed %d)", seed, t.Name(), seed)
	return seed
}

// killDuringRollout kills the leader three times while the rollout runs
// and checks that each kill hit a rollout in flight.
func killDuringRollout(t *testing.T, f *sim.ProcFleet, seed int64, done func() bool) []sim.Takeover {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	takeovers, err := f.KillLeaders(ctx, seed, 3, takeoverBound, done)
	if err != nil {
		t.Fatalf("failover seed %d: %v", seed, err)
	}
	if len(takeovers) < 2 {
		t.Errorf("failover seed %d: the rollout ended after %d kills; want at least 2 kills mid-rollout", seed, len(takeovers))
	}
	for i, tk := range takeovers {
		if len(tk.HeldAtKill) == 0 && i < len(takeovers)-1 {
			t.Logf("kill %d: no slot was held at that moment", i+1)
		}
	}
	return takeovers
}

// judgeFailover checks I1-I5, one reboot per node under a grant, the test
// bootc's own log (checkOneRebootEach), and logs the takeovers. That every
// node ends uncordoned (but an administrator's) is the convergence wait's
// check, before it.
func judgeFailover(t *testing.T, f *sim.ProcFleet, target string, takeovers []sim.Takeover) {
	t.Helper()
	checkOneRebootEach(t, f, target)
	f.FillFirstWrites(takeovers)
	var worst time.Duration
	for i, tk := range takeovers {
		t.Logf("takeover %d: %s", i+1, tk)
		worst = max(worst, tk.Working)
	}
	t.Logf("%d SIGKILLs of the leader; longest time to a working successor %s", len(takeovers), worst.Round(time.Millisecond))
	if t.Failed() {
		for _, e := range f.Log.Events() {
			t.Logf("%s", e)
		}
		for _, r := range f.Replicas() {
			logTail(t, "coordinator "+r.Name, r.Log)
		}
	}
}

// convergedBut is sim.ProcFleet.Converged, except that node admin must stay
// cordoned (an administrator's cordon) rather than end uncordoned.
func convergedBut(ctx context.Context, f *sim.ProcFleet, target, admin string) (bool, string) {
	var pending []string
	for _, n := range f.Nodes {
		m, err := n.Bootc.Machine()
		if err != nil || n.Down() || m.State().Booted == nil || m.State().Booted.Image != target {
			pending = append(pending, n.Name+"(not booted on target)")
			continue
		}
		kn, err := f.Kube.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil || !sim.NodeReady(kn) || kn.Spec.Unschedulable != (n.Name == admin) {
			pending = append(pending, n.Name+"(not Ready, or cordon not as it should end)")
			continue
		}
		bn := &fleetv1.BootcNode{}
		if err := f.Env.Client.Get(ctx, client.ObjectKey{Name: n.Name}, bn); err != nil || bn.Status.Phase != fleetv1.PhaseIdle {
			pending = append(pending, n.Name+"("+string(bn.Status.Phase)+")")
		}
	}
	if held := f.BusySlots(ctx); len(held) > 0 {
		pending = append(pending, fmt.Sprint(held))
	}
	return len(pending) == 0, fmt.Sprint(pending)
}

// runPodOn puts a Running bare pod <node>-web on node (drains evict it;
// sim.FinishPodDeletions plays the kubelet's part).
func runPodOn(ctx context.Context, f *sim.ProcFleet, node string) error {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: node + "-web", Namespace: "default", Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "web", Image: "registry.example/web:1"}}}}
	created, err := f.Kube.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	created.Status = corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	_, err = f.Kube.CoreV1().Pods("default").UpdateStatus(ctx, created, metav1.UpdateOptions{})
	return err
}

// watchPodDeletions records when each pod of "default" was first seen
// marked for deletion or deleted; the returned func reads the record.
func watchPodDeletions(t *testing.T, f *sim.ProcFleet) func() map[string]time.Time {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w, err := f.Kube.CoreV1().Pods("default").Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	gone := map[string]time.Time{}
	go func() {
		defer w.Stop()
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok || (ev.Type != watch.Deleted && p.DeletionTimestamp == nil) {
				continue
			}
			mu.Lock()
			if _, seen := gone[p.Name]; !seen {
				gone[p.Name] = time.Now()
			}
			mu.Unlock()
		}
	}()
	return func() map[string]time.Time {
		mu.Lock()
		defer mu.Unlock()
		out := make(map[string]time.Time, len(gone))
		for k, v := range gone {
			out[k] = v
		}
		return out
	}
}
