package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	"github.com/bootc-fleet/bootc-fleet/internal/sim"
	"github.com/bootc-fleet/bootc-fleet/internal/sim/invariant"
)

// autoscalerView is what a Node says to cluster-autoscaler and Karpenter,
// with the coordinator's record of the marks it set.
func autoscalerView(n *corev1.Node) map[string]string {
	out := map[string]string{}
	for _, k := range []string{lease.NodeAnnotationScaleDownDisabled, lease.NodeAnnotationDoNotDisrupt, lease.NodeAnnotationAutoscalerMarks} {
		if v, ok := n.Annotations[k]; ok {
			out[k] = v
		}
	}
	return out
}

// AutoscalerMarks rolls a fresh image over four nodes, two at a time, whose
// administrators told the autoscalers different things before: Karpenter may
// disrupt node 0 (do-not-disrupt=false); node 1 is Karpenter's to keep
// (=true) and cluster-autoscaler's to scale down (scale-down-disabled=false);
// node 2 says nothing; cluster-autoscaler must not scale node 3 down (=true).
// A watch on the Nodes checks every version the API server stored: a node is
// cordoned exactly while it carries the coordinator's record of its marks
// (cordon, marks and record are one update, and so are uncordon and their
// removal), and while it does both marks say "true". Every node must be seen
// held, and end with exactly the annotations it had before, though the
// coordinator is crashed and restarted while the first node is held (the
// record is on the Node, amendment 28); I1-I5 hold and each node reboots
// once.
func AutoscalerMarks(ctx context.Context, f *Fleet, seed int64) Result {
	start := time.Now()
	name := fmt.Sprintf("asm%04d", seed)
	res := Result{Seed: seed, Pool: name}
	opts := PoolOptions{Nodes: 4, MaxUnavailable: 2, MaxStaging: 2, HaltAfter: 1, RebootTimeout: time.Minute}
	opts.Behaviour = func(int) NodeBehaviour {
		return NodeBehaviour{BootTime: 400 * time.Millisecond, StageTime: 300 * time.Millisecond, StaleAfterReboot: 500 * time.Millisecond}
	}
	p := f.AddPool(name, opts)
	before := map[string]map[string]string{
		p.Nodes[0].Name: {lease.NodeAnnotationDoNotDisrupt: "false"},
		p.Nodes[1].Name: {lease.NodeAnnotationDoNotDisrupt: "true", lease.NodeAnnotationScaleDownDisabled: "false"},
		p.Nodes[2].Name: {},
		p.Nodes[3].Name: {lease.NodeAnnotationScaleDownDisabled: "true"},
	}
	for node, ann := range before {
		body, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": ann}})
		if _, err := f.Kube.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, body, metav1.PatchOptions{}); err != nil {
			res.Problems = append(res.Problems, "setting an administrator's annotations: "+err.Error())
			return res
		}
	}
	w, err := f.Kube.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{LabelSelector: sim.PoolLabel + "=" + name})
	if err != nil {
		res.Problems = append(res.Problems, "watching Nodes: "+err.Error())
		return res
	}
	obs := &markWatch{held: map[string]bool{}, firstHeld: make(chan struct{})}
	done := make(chan struct{})
	go func() { defer close(done); obs.follow(w) }()

	v2 := p.Push("v2")
	p.Create("v2", opts)
	// The record of what the marks were must outlive the coordinator that
	// wrote it: crash it while the first node is held.
	select {
	case <-obs.firstHeld:
		f.RestartCoordinator(time.Second)
	case <-ctx.Done():
	case <-time.After(60 * time.Second):
		res.Problems = append(res.Problems, "no node was held within 60s")
	}
	if !sim.WaitFor(ctx, 90*time.Second, func() bool { ok, _ := p.Converged(v2); return ok }) {
		_, waiting := p.Converged(v2)
		res.Problems = append(res.Problems, fmt.Sprintf("did not converge; waiting for %s; pool %+v", waiting, p.Status()))
	}
	judgeOneRebootEach(ctx, p, v2, invariant.Pool{MaxUnavailable: opts.MaxUnavailable, MaxStaging: opts.MaxStaging, HaltAfter: opts.HaltAfter}, &res)
	restored := func() (bool, string) {
		for node, want := range before {
			n, err := f.Kube.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			if got := autoscalerView(n); !maps.Equal(got, want) || n.Spec.Unschedulable {
				return false, fmt.Sprintf("node %s: autoscaler annotations %v (unschedulable %v), want %v as before the rollout", node, got, n.Spec.Unschedulable, want)
			}
		}
		return true, ""
	}
	if !sim.WaitFor(ctx, 20*time.Second, func() bool { ok, _ := restored(); return ok && len(heldSlots(ctx, f, name)) == 0 }) {
		_, why := restored()
		res.Problems = append(res.Problems, fmt.Sprintf("after the rollout: slots held %v; %s", heldSlots(ctx, f, name), why))
	}
	w.Stop()
	<-done
	res.Problems = append(res.Problems, obs.problems...)
	for node := range before {
		if !obs.held[node] {
			res.Problems = append(res.Problems, fmt.Sprintf("node %s was never seen cordoned with both autoscaler marks", node))
		}
	}
	res.Duration = time.Since(start)
	if !res.Failed() {
		p.Remove()
	}
	return res
}

// markWatch checks every Node version a watch delivers.
type markWatch struct {
	mu        sync.Mutex
	held      map[string]bool // seen cordoned with both marks and the record
	firstHeld chan struct{}   // closed when the first node is seen held
	problems  []string
}

func (m *markWatch) follow(w watch.Interface) {
	for ev := range w.ResultChan() {
		n, ok := ev.Object.(*corev1.Node)
		if !ok || ev.Type == watch.Deleted {
			continue
		}
		_, recorded := n.Annotations[lease.NodeAnnotationAutoscalerMarks]
		marked := n.Annotations[lease.NodeAnnotationScaleDownDisabled] == lease.AutoscalerMarkValue &&
			n.Annotations[lease.NodeAnnotationDoNotDisrupt] == lease.AutoscalerMarkValue
		m.mu.Lock()
		switch {
		case recorded != n.Spec.Unschedulable:
			m.problems = append(m.problems, fmt.Sprintf("node %s version %s: unschedulable %v but autoscaler annotations %v: the cordon and the marks' record were not one update",
				n.Name, n.ResourceVersion, n.Spec.Unschedulable, autoscalerView(n)))
		case recorded && !marked:
			m.problems = append(m.problems, fmt.Sprintf("node %s version %s: cordoned for a reboot without both autoscaler marks: %v", n.Name, n.ResourceVersion, autoscalerView(n)))
		case recorded:
			if len(m.held) == 0 {
				close(m.firstHeld)
			}
			m.held[n.Name] = true
		}
		m.mu.Unlock()
	}
}
