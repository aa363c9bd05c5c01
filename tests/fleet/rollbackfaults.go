package fleet

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/sim"
	"github.com/bootc-fleet/bootc-fleet/internal/sim/invariant"
)

// RollbackFault is where scenario (d) of issue 27 interrupts a rollback,
// between the canary's gate failure and the release of its rollback grant.
type RollbackFault string

// The interruptions InterruptedRollback plays.
const (
	// RestartAtQuarantine: the coordinator restarts as soon as the pool
	// says the target is quarantined (the gate failed; the rollback grant
	// may or may not be written yet).
	RestartAtQuarantine RollbackFault = "coordinator restart once the target is quarantined"
	// RestartAtRollbackGrant: the coordinator restarts as soon as the
	// rollback grant is on the slot (phase Draining or Reboot).
	RestartAtRollbackGrant RollbackFault = "coordinator restart once the rollback grant is written"
	// RestartWhileRollingBack: the coordinator restarts while the canary
	// reboots into its rollback deployment.
	RestartWhileRollingBack RollbackFault = "coordinator restart while the canary reboots into the rollback"
	// RestartBeforeRelease: the coordinator restarts once the canary is
	// back on its old image, before the rollback slot is released.
	RestartBeforeRelease RollbackFault = "coordinator restart with the canary back, its slot still held"
	// CrashBeforeRollbackReboot: the canary's agent dies after `bootc
	// rollback` queued the rollback deployment and before it asked logind
	// to reboot; restarted in the same boot, it must reboot once, not roll
	// back again (a second `bootc rollback` reverts the first).
	CrashBeforeRollbackReboot RollbackFault = "agent crash between bootc rollback and the reboot"
)

// RollbackFaults lists every interruption, in the order of the rollback.
var RollbackFaults = []RollbackFault{RestartAtQuarantine, RestartAtRollbackGrant, RestartWhileRollingBack,
	RestartBeforeRelease, CrashBeforeRollbackReboot}

// rollbackGateTimeout is the pool's health.timeout: the schema's least.
const rollbackGateTimeout = 30 * time.Second

// InterruptedRollback is scenario (d): a pool of three nodes gating on the
// host with one canary (node 0, labelled) rolls out an image pushed bad;
// the canary fails its gate, the image is quarantined and the canary rolled
// back, and fault interrupts that. Whatever the interruption, the canary
// ends rebooted exactly twice under two reboot grants (the update, then the
// rollback), booted on its old digest, the bad digest quarantined, no other
// node rebooted, and I1-I6 hold.
func InterruptedRollback(ctx context.Context, f *Fleet, seed int64, fault RollbackFault) Result {
	start := time.Now()
	name := fmt.Sprintf("rbf%04d", seed)
	res := Result{Seed: seed, Pool: name}
	gen := generationFor(seed)
	opts := PoolOptions{Nodes: 3, MaxUnavailable: 1, MaxStaging: 3, HaltAfter: 1, RebootTimeout: time.Minute,
		Behaviour: func(i int) NodeBehaviour {
			// The canary's reboots last long enough to restart the
			// coordinator while it is down.
			b := NodeBehaviour{BootTime: 300 * time.Millisecond, StageTime: 100 * time.Millisecond, Generation: gen}
			if i == 0 {
				b.BootTime = 3 * time.Second
				if fault == CrashBeforeRollbackReboot {
					b.CrashBeforeRollbackReboot = 1
				}
			}
			return b
		},
		Labels: func(i int) map[string]string {
			if i == 0 {
				return map[string]string{fleetv1.LabelCanary: "true"}
			}
			return nil
		},
		Mutate: func(bnp *fleetv1.BootcNodePool) {
			bnp.Spec.Health = &fleetv1.HealthSpec{Timeout: &metav1.Duration{Duration: rollbackGateTimeout}, Host: &fleetv1.HostHealthCheck{}}
			bnp.Spec.Rollout.OnFailure = fleetv1.OnFailureRollback
			one := intstr.FromInt32(1)
			bnp.Spec.Rollout.Canary = &fleetv1.CanarySpec{Nodes: &one}
			// A window before the rollback slot is released, for
			// RestartBeforeRelease to hit.
			bnp.Spec.Rollout.MinReadySeconds = 3
		},
	}
	p := f.AddPool(name, opts)
	canary := p.Nodes[0]
	old := canary.bootedImage()
	bad := p.PushBad("v2")
	p.Create("v2", opts)
	hit := make(chan time.Duration, 1)
	go p.interruptRollback(ctx, canary, old, fault, start, hit)

	done := func() bool {
		q := p.Status().Quarantine
		return q != nil && q.Digest == bad && !canary.Down() && canary.bootedImage() == old &&
			p.Reboots()[canary.Name] >= 2 && p.holder(ctx, canary.Name) == ""
	}
	if !sim.WaitFor(ctx, 4*time.Minute, done) {
		res.Problems = append(res.Problems, fmt.Sprintf("the canary was not rolled back to %s with its slot released within 4m (%s); pool %+v; cluster:%s",
			old, fault, p.Status(), f.describe(ctx, p)))
	}
	// Nothing more may happen: no other node may take the bad image.
	time.Sleep(2 * time.Second)
	res.Problems = append(res.Problems, judgeRollback(p, canary.Name, bad, old)...)
	select {
	case at := <-hit:
		res.Notes = append(res.Notes, fmt.Sprintf("%s at +%s", fault, at))
	default:
		switch {
		case fault != CrashBeforeRollbackReboot:
			res.Problems = append(res.Problems, fmt.Sprintf("the rollback never reached the point of %q", fault))
		case canary.behave().CrashBeforeRollbackReboot > 0:
			res.Problems = append(res.Problems, "the canary's agent never reached the reboot into its rollback")
		}
	}
	budget := invariant.Pool{MaxUnavailable: opts.MaxUnavailable, MaxStaging: opts.MaxStaging, HaltAfter: opts.HaltAfter}
	res.Violations = p.Check(old, budget)
	res.Reboots = p.Reboots()
	res.Duration = time.Since(start)
	if !res.Failed() {
		p.Remove()
	}
	return res
}

// interruptRollback plays fault once, when the rollback reaches its point.
func (p *Pool) interruptRollback(ctx context.Context, canary *SimNode, old string, fault RollbackFault, start time.Time, hit chan<- time.Duration) {
	reached := map[RollbackFault]func() bool{
		RestartAtQuarantine:    func() bool { return p.Status().Quarantine != nil },
		RestartAtRollbackGrant: func() bool { return p.rollbackGrantOf(ctx, canary.Name) },
		RestartWhileRollingBack: func() bool {
			return p.rollbackReboots(canary.Name) > 0 && canary.Down()
		},
		RestartBeforeRelease: func() bool {
			return p.rollbackReboots(canary.Name) > 0 && !canary.Down() && canary.bootedImage() == old && p.holder(ctx, canary.Name) != ""
		},
	}[fault]
	if reached == nil {
		return // an agent fault: NodeBehaviour plays it
	}
	if !sim.WaitFor(ctx, 3*time.Minute, reached) {
		return // the end judgement says what did not happen
	}
	hit <- time.Since(start).Round(time.Millisecond)
	p.f.RestartCoordinator(time.Second)
}

// rollbackReboots counts node's reboots into its rollback deployment.
func (p *Pool) rollbackReboots(node string) int {
	n := 0
	for _, e := range p.Events() {
		if e.Kind == invariant.Reboot && e.Node == node && e.Rollback {
			n++
		}
	}
	return n
}

// rollbackGrantOf reports whether node holds a rollback grant of the pool.
func (p *Pool) rollbackGrantOf(ctx context.Context, node string) bool {
	list, err := p.f.Kube.CoordinationV1().Leases(lease.Namespace).List(ctx, metav1.ListOptions{LabelSelector: lease.LabelPool + "=" + p.Name})
	if err != nil {
		return false
	}
	for i := range list.Items {
		l := &list.Items[i]
		if g, err := lease.Parse(l); err == nil && g.Holder == node && g.Rollback {
			return true
		}
	}
	return false
}

// holder is the reboot slot node holds, "" if none.
func (p *Pool) holder(ctx context.Context, node string) string {
	list, err := p.f.Kube.CoordinationV1().Leases(lease.Namespace).List(ctx, metav1.ListOptions{LabelSelector: lease.LabelPool + "=" + p.Name})
	if err != nil {
		return "unknown: " + err.Error()
	}
	for _, l := range list.Items {
		if l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity == node && l.Labels[lease.LabelSlot] == string(lease.KindReboot) {
			return l.Name
		}
	}
	return ""
}

// judgeRollback checks the end of a rollback: the canary rebooted twice,
// under two grants, first into bad, then back into old; no other node
// rebooted; every node on old; bad quarantined, the pool Degraded for it.
func judgeRollback(p *Pool, canary, bad, old string) []string {
	var out []string
	reboots, grants := p.Reboots(), p.RebootGrants()
	if reboots[canary] != 2 || grants[canary] != 2 {
		out = append(out, fmt.Sprintf("canary %s: %d reboots under %d reboot grants, want 2 under 2", canary, reboots[canary], grants[canary]))
	}
	var into []string
	runs, quarantined := 0, false
	for _, e := range p.Events() {
		switch {
		case e.Kind == invariant.Reboot && e.Node == canary:
			into = append(into, fmt.Sprintf("%s rollback=%v", e.Image, e.Rollback))
		case e.Kind == invariant.RollbackRun && e.Node == canary:
			runs++
		case e.Kind == invariant.Quarantine && e.Image == bad:
			quarantined = true
		}
	}
	// What I1 and I6 judge must be in the log: one bootc rollback (an
	// agent that crashed after it must not run a second, which reverts
	// the first), and the quarantine.
	if runs != 1 || !quarantined {
		out = append(out, fmt.Sprintf("the log has %d runs of bootc rollback on %s (want 1) and quarantine of %s logged %v", runs, canary, bad, quarantined))
	}
	if want := []string{bad + " rollback=false", old + " rollback=true"}; fmt.Sprint(into) != fmt.Sprint(want) {
		out = append(out, fmt.Sprintf("canary %s rebooted into %v, want %v", canary, into, want))
	}
	for _, n := range p.Nodes {
		if n.Name != canary && reboots[n.Name] > 0 {
			out = append(out, fmt.Sprintf("node %s rebooted %d times; only the canary may", n.Name, reboots[n.Name]))
		}
		if img := n.bootedImage(); img != old {
			out = append(out, fmt.Sprintf("node %s booted on %s, want the old %s", n.Name, img, old))
		}
	}
	st := p.Status()
	if st.Quarantine == nil || st.Quarantine.Digest != bad || st.Quarantine.Node != canary {
		out = append(out, fmt.Sprintf("quarantine %+v, want %s failed on %s", st.Quarantine, bad, canary))
	}
	degraded := false
	for _, c := range st.Conditions {
		degraded = degraded || (c.Type == fleetv1.PoolDegraded && c.Status == metav1.ConditionTrue && c.Reason == fleetv1.ReasonImageFailedHealthCheck)
	}
	if !degraded {
		out = append(out, fmt.Sprintf("pool not Degraded with reason %s: %v", fleetv1.ReasonImageFailedHealthCheck, st.Conditions))
	}
	return out
}
