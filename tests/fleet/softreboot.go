package fleet

import (
	"context"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/plan"
	"github.com/bootc-fleet/bootc-fleet/internal/sim"
	"github.com/bootc-fleet/bootc-fleet/internal/sim/invariant"
)

// SoftRebootRollout rolls a fresh image over an AllowSoftReboot pool whose
// nodes stage soft-reboot capable images on a systemd with soft reboot
// (254+), with stale status after each soft reboot. Every node must end on
// the target after exactly one soft reboot and no full reboot, in the boot
// ID it started in, with its reboot slot released and its cordon lifted:
// the coordinator verifies a soft reboot by the agent's soft-reboot count,
// not by a new kubelet boot ID. I1-I5 count the soft reboots as reboots.
func SoftRebootRollout(ctx context.Context, f *Fleet, seed int64) Result {
	start := time.Now()
	name := fmt.Sprintf("soft%04d", seed)
	res := Result{Seed: seed, Pool: name}
	opts := PoolOptions{Nodes: 5, MaxUnavailable: 2, MaxStaging: 2, HaltAfter: 1, RebootTimeout: time.Minute,
		RebootPolicy: fleetv1.RebootPolicyAllowSoftReboot}
	opts.Behaviour = func(int) NodeBehaviour {
		return NodeBehaviour{BootTime: 800 * time.Millisecond, SoftRebootTime: 300 * time.Millisecond, StageTime: 300 * time.Millisecond,
			StaleAfterReboot: 700 * time.Millisecond, SoftRebootCapable: true}
	}
	p := f.AddPool(name, opts)
	bootIDs := map[string]string{}
	for _, n := range p.Nodes {
		bootIDs[n.Name] = n.Machine.BootID()
	}
	v2 := p.Push("v2")
	p.Create("v2", opts)
	if !sim.WaitFor(ctx, 90*time.Second, func() bool { ok, _ := p.Converged(v2); return ok }) {
		_, waiting := p.Converged(v2)
		res.Problems = append(res.Problems, fmt.Sprintf("did not converge by soft reboots; waiting for %s; pool %+v", waiting, p.Status()))
	}
	budget := invariant.Pool{MaxUnavailable: opts.MaxUnavailable, MaxStaging: opts.MaxStaging, HaltAfter: opts.HaltAfter}
	judgeReboots(ctx, p, v2, budget, &res, 1)
	// The slots are free and nobody is cordoned: verified without a new boot ID.
	if !sim.WaitFor(ctx, 20*time.Second, func() bool { return len(heldSlots(ctx, f, name))+len(cordoned(ctx, f, p)) == 0 }) {
		res.Problems = append(res.Problems, fmt.Sprintf("after the rollout slots still held %v, nodes still cordoned %v", heldSlots(ctx, f, name), cordoned(ctx, f, p)))
	}
	for _, n := range p.Nodes {
		st := n.Machine.State()
		if st.BootID != bootIDs[n.Name] || st.Reboots != 0 || st.SoftReboots != 1 || st.SoftRebootCount != 1 {
			res.Problems = append(res.Problems, fmt.Sprintf("node %s: boot ID %s (was %s), %d full and %d soft reboots played, soft-reboot count %d; want the same boot ID, 0, 1, 1",
				n.Name, st.BootID, bootIDs[n.Name], st.Reboots, st.SoftReboots, st.SoftRebootCount))
		}
	}
	res.Duration = time.Since(start)
	if !res.Failed() {
		p.Remove()
	}
	return res
}

// SoftRebootFallback checks that under AllowSoftReboot, a node whose systemd
// has no soft reboot (252) and a node whose staged image is not soft-reboot
// capable both reboot fully, once each.
func SoftRebootFallback(ctx context.Context, f *Fleet, seed int64) Result {
	start := time.Now()
	name := fmt.Sprintf("softfb%04d", seed)
	res := Result{Seed: seed, Pool: name}
	opts := PoolOptions{Nodes: 2, MaxUnavailable: 1, MaxStaging: 2, HaltAfter: 1, RebootTimeout: time.Minute,
		RebootPolicy: fleetv1.RebootPolicyAllowSoftReboot}
	opts.Behaviour = func(i int) NodeBehaviour {
		b := NodeBehaviour{BootTime: 400 * time.Millisecond, StageTime: 200 * time.Millisecond, StaleAfterReboot: 500 * time.Millisecond}
		if i == 0 {
			b.OldSystemd, b.SoftRebootCapable = true, true
		}
		return b
	}
	p := f.AddPool(name, opts)
	v2 := p.Push("v2")
	p.Create("v2", opts)
	if !sim.WaitFor(ctx, 60*time.Second, func() bool { ok, _ := p.Converged(v2); return ok }) {
		_, waiting := p.Converged(v2)
		res.Problems = append(res.Problems, fmt.Sprintf("did not converge; waiting for %s; pool %+v", waiting, p.Status()))
	}
	judgeReboots(ctx, p, v2, invariant.Pool{MaxUnavailable: 1, MaxStaging: 2, HaltAfter: 1}, &res, 0)
	res.Duration = time.Since(start)
	if !res.Failed() {
		p.Remove()
	}
	return res
}

// judgeReboots waits for the last release, checks I1-I5, and that every
// node rebooted exactly once under its one grant, soft = wantSoft times.
func judgeReboots(ctx context.Context, p *Pool, target string, budget invariant.Pool, res *Result, wantSoft int) {
	judgeOneRebootEach(ctx, p, target, budget, res)
	soft, grants := p.SoftReboots(), p.RebootGrants()
	for _, n := range p.NodeNames() {
		if soft[n] != wantSoft {
			res.Problems = append(res.Problems, fmt.Sprintf("node %s: %d soft reboots of %d, want %d", n, soft[n], res.Reboots[n], wantSoft))
		}
		if grants[n] != 1 {
			res.Problems = append(res.Problems, fmt.Sprintf("node %s: %d reboot grants reached phase Reboot, want 1", n, grants[n]))
		}
	}
}

// heldSlots lists the pool's slot Leases that have a holder.
func heldSlots(ctx context.Context, f *Fleet, pool string) []string {
	ls, err := f.Kube.CoordinationV1().Leases(lease.Namespace).List(ctx, metav1.ListOptions{LabelSelector: lease.LabelPool + "=" + pool})
	if err != nil {
		return []string{"listing: " + err.Error()}
	}
	var out []string
	for _, l := range ls.Items {
		if l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "" && !finishedStage(ctx, f, pool, &l) {
			out = append(out, l.Name+"="+*l.Spec.HolderIdentity)
		}
	}
	return out
}

// finishedStage: l is a stage slot whose holder is done with it, as the
// coordinator reads it (plan.StageFinished): it stays held until the next
// stage grant hands it on (amendment 31).
func finishedStage(ctx context.Context, f *Fleet, pool string, l *coordinationv1.Lease) bool {
	s, ok := plan.ParseSlot(pool, l)
	if !ok || s.State != plan.SlotHeld || s.Kind != lease.KindStage {
		return false
	}
	kn, err := f.Kube.CoreV1().Nodes().Get(ctx, s.Holder, metav1.GetOptions{})
	if err != nil {
		return false
	}
	n := plan.Node{Name: s.Holder, BootID: kn.Status.NodeInfo.BootID}
	bn := &fleetv1.BootcNode{}
	var st *fleetv1.BootcNodeStatus
	if err := f.Env.Client.Get(ctx, client.ObjectKey{Name: s.Holder}, bn); err == nil && bn.Status.BootID == n.BootID {
		st = &bn.Status
	}
	return plan.StageFinished(s.Grant, n, st, false)
}

// cordoned lists the pool's Nodes that are unschedulable.
func cordoned(ctx context.Context, f *Fleet, p *Pool) []string {
	var out []string
	for _, n := range p.Nodes {
		node, err := f.Kube.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			out = append(out, n.Name+": "+err.Error())
			continue
		}
		if node.Spec.Unschedulable {
			out = append(out, n.Name)
		}
	}
	return out
}
