package fleet

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/sim"
	"github.com/bootc-fleet/bootc-fleet/internal/sim/invariant"
)

// LostStage runs a rollout in which a node that staged the target locked
// loses power. bootc discards a download-only staged deployment at a reboot,
// so the node comes back with nothing staged; it must report that, let go of
// the grants of the old boot, be granted a stage again in its new boot,
// stage again, and then take its one gated reboot like the others. With
// underRebootGrant the power cut comes while the node holds a reboot grant
// in phase Reboot that its agent (stopped) never used: the agent lists it as
// unused in the new boot and the coordinator revokes it at once, neither
// waiting for rebootTimeout nor counting a failure.
func LostStage(ctx context.Context, f *Fleet, seed int64, underRebootGrant bool) Result {
	start := time.Now()
	name := fmt.Sprintf("lost%04d", seed)
	if underRebootGrant {
		name = fmt.Sprintf("lostrb%04d", seed)
	}
	res := Result{Seed: seed, Pool: name}
	opts := PoolOptions{Nodes: 3, MaxUnavailable: 1, MaxStaging: 3, HaltAfter: 1, RebootTimeout: time.Minute}
	gen := generationFor(seed)
	opts.Behaviour = func(int) NodeBehaviour {
		// Reboots long enough that the other nodes wait staged for a while.
		return NodeBehaviour{BootTime: 2 * time.Second, StageTime: 200 * time.Millisecond, Generation: gen}
	}
	p := f.AddPool(name, opts)
	v2 := p.Push("v2")
	p.Create("v2", opts)

	// Find a node staged and waiting for a reboot slot, stop its agent, and
	// cut its power. Its BootcNode says Staged until it reboots (amendment 37:
	// an update's reboot is not reported first), so the grants tell: a node
	// whose grant was not in phase Reboot when its agent stopped never began
	// its reboot (the agent acts only in phase Reboot, and here a grant leaves
	// that phase only once its node came back). A node caught in phase Reboot
	// gets its agent back and another is looked for.
	var victim *SimNode
	if !sim.WaitFor(ctx, 2*time.Minute, func() bool {
		for _, n := range p.Nodes {
			bn := &fleetv1.BootcNode{}
			if err := f.Env.Client.Get(ctx, client.ObjectKey{Name: n.Name}, bn); err != nil {
				continue
			}
			st := n.Machine.State()
			if bn.Status.Reason != fleetv1.ReasonWaitingForRebootGrant || st.Staged == nil || !st.Staged.DownloadOnly || st.Staged.Image != v2 || n.Down() {
				continue
			}
			n.StopAgent()
			if now := n.Machine.State().Staged; f.holdsRebootPhase(ctx, name, n.Name) || now == nil || !now.DownloadOnly {
				n.StartAgent(ctx)
				continue
			}
			victim = n
			return true
		}
		return false
	}) {
		res.Problems = append(res.Problems, "no node ever waited staged for a reboot slot")
		res.Duration = time.Since(start)
		return res
	}
	if underRebootGrant {
		// Its agent stopped (so it cannot use the grant); the power cut
		// comes once the coordinator moved its reboot grant to phase Reboot.
		if !sim.WaitFor(ctx, 2*time.Minute, func() bool { return f.holdsRebootPhase(ctx, name, victim.Name) }) {
			res.Problems = append(res.Problems, victim.Name+" never held a reboot grant in phase Reboot")
		}
	}
	victim.Reboot(ctx, false)
	if !sim.WaitFor(ctx, time.Minute, func() bool { return !victim.Down() && victim.Machine.State().Reboots == 1 }) {
		res.Problems = append(res.Problems, victim.Name+" did not come back from its power cut")
	}
	if st := victim.Machine.State(); st.Staged != nil {
		res.Problems = append(res.Problems, fmt.Sprintf("%s kept its download-only staged deployment across a reboot: %+v", victim.Name, st.Staged))
	}
	if !sim.WaitFor(ctx, 3*time.Minute, func() bool { ok, _ := p.Converged(v2); return ok }) {
		_, waiting := p.Converged(v2)
		res.Problems = append(res.Problems, fmt.Sprintf("pool did not converge after the lost stage; waiting for %s; pool %+v", waiting, p.Status()))
	}
	sim.WaitFor(ctx, 10*time.Second, func() bool { return p.Status().Rebooting == 0 })
	stages := 0
	for _, e := range p.Events() {
		if e.Node == victim.Name && e.Kind == invariant.StageStart && e.Image == v2 {
			stages++
		}
	}
	if stages != 2 {
		res.Problems = append(res.Problems, fmt.Sprintf("%s staged %s %d times, want 2 (before and after the power cut)", victim.Name, v2, stages))
	}
	res.Reboots = p.Reboots()
	for _, n := range p.Nodes {
		if got := res.Reboots[n.Name]; got != 1 {
			res.Problems = append(res.Problems, fmt.Sprintf("%s took %d gated reboots, want 1", n.Name, got))
		}
	}
	if p.Halted() || p.Status().Failures != 0 {
		res.Problems = append(res.Problems, fmt.Sprintf("the lost stage counted as a failure: halted %v, failures %d", p.Halted(), p.Status().Failures))
	}
	res.Violations = p.Check(v2, invariant.Pool{MaxUnavailable: 1, MaxStaging: 3, HaltAfter: 1})
	res.Duration = time.Since(start)
	if !res.Failed() {
		p.Remove()
	}
	return res
}

// holdsRebootPhase: node holds a reboot grant of pool in phase Reboot.
func (f *Fleet) holdsRebootPhase(ctx context.Context, pool, node string) bool {
	list, err := f.Kube.CoordinationV1().Leases(lease.Namespace).List(ctx, metav1.ListOptions{LabelSelector: lease.LabelPool + "=" + pool})
	if err != nil {
		return false
	}
	for _, l := range list.Items {
		if l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity == node && l.Annotations[lease.AnnotationPhase] == string(lease.PhaseReboot) {
			return true
		}
	}
	return false
}
