package fleet

import (
	"context"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/sim"
	"github.com/bootc-fleet/bootc-fleet/internal/sim/invariant"
	"github.com/bootc-fleet/bootc-fleet/internal/sim/testbootc"
)

// FailingDownload runs a rollout with maxStaging 1 in which the first node
// in the queue can never download the image. Its agent lets go of the stage
// grant after MaxStageAttempts failures, the coordinator hands the slot to
// the next node and queues the failing one last, so the other nodes converge
// and the pool does not halt (a download failure is not a failed reboot).
// I1-I5 hold, with the failing node judged unable to converge.
func FailingDownload(ctx context.Context, f *Fleet, seed int64) Result {
	start := time.Now()
	name := fmt.Sprintf("pull%04d", seed)
	res := Result{Seed: seed, Pool: name}
	opts := PoolOptions{Nodes: 3, MaxUnavailable: 1, MaxStaging: 1, HaltAfter: 1, RebootTimeout: time.Minute}
	opts.Behaviour = func(int) NodeBehaviour {
		return NodeBehaviour{BootTime: 300 * time.Millisecond, StageTime: 200 * time.Millisecond}
	}
	p := f.AddPool(name, opts)
	bad := p.Nodes[0] // first in name order: it gets the only stage slot first
	bad.Machine.Configure(func(k *testbootc.Knobs) {
		k.SwitchFailure = &testbootc.Failure{ExitCode: 1, Stderr: "error: pulling image: simulated 500 from the registry"}
	})
	v2 := p.Push("v2")
	p.Create("v2", opts)
	others := p.Nodes[1:]
	if !sim.WaitFor(ctx, 120*time.Second, func() bool {
		for _, n := range others {
			if st := n.Machine.State(); n.Down() || st.Booted == nil || st.Booted.Image != v2 {
				return false
			}
		}
		return true
	}) {
		_, waiting := p.Converged(v2)
		res.Problems = append(res.Problems, fmt.Sprintf("the nodes behind a failing download did not converge; waiting for %s; pool %+v", waiting, p.Status()))
	}
	// The failing node keeps being offered the free slot and keeps failing:
	// between its attempts, and after it lets go, it says StageFailed.
	bn := &fleetv1.BootcNode{}
	var getErr error
	if !sim.WaitFor(ctx, 60*time.Second, func() bool {
		getErr = f.Env.Client.Get(ctx, client.ObjectKey{Name: bad.Name}, bn)
		return getErr == nil && bn.Status.Reason == fleetv1.ReasonStageFailed
	}) {
		res.Problems = append(res.Problems, fmt.Sprintf("failing node %s reports %s/%s (%v), want reason StageFailed", bad.Name, bn.Status.Phase, bn.Status.Reason, getErr))
	}
	if p.Halted() {
		res.Problems = append(res.Problems, "the pool halted on a download failure")
	}
	if evs, err := f.Kube.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name}); err == nil {
		letGo := false
		for _, e := range evs.Items {
			letGo = letGo || (strings.Contains(e.Message, bad.Name+" let go of stage slot") && strings.Contains(e.Message, fleetv1.ReasonStageFailed))
		}
		if !letGo {
			res.Problems = append(res.Problems, "no Event says the failing node let go of its stage slot")
		}
	}
	sim.WaitFor(ctx, 10*time.Second, func() bool { return p.Status().Rebooting == 0 })
	fin := p.Final(v2)
	fn := fin.Nodes[bad.Name]
	fn.Healthy, fn.CannotStage = false, true // its download never works
	fin.Nodes[bad.Name] = fn
	res.Violations = invariant.Check(p.Events(), map[string]invariant.Pool{name: {MaxUnavailable: 1, MaxStaging: 1, HaltAfter: 1}}, fin)
	res.Reboots = p.Reboots()
	if res.Reboots[bad.Name] != 0 {
		res.Problems = append(res.Problems, fmt.Sprintf("the failing node rebooted %d times", res.Reboots[bad.Name]))
	}
	res.Duration = time.Since(start)
	if !res.Failed() {
		p.Remove()
	}
	return res
}

// QuietAgent runs a rollout in which an agent stops midway. The pool counts
// and names its node (status.quiet, condition AgentsReporting) within
// QuietAfter, and stops doing so once the agent reports again; the rollout
// then converges.
//
// The node is held (fleet.bootc.dev/hold) until its agent is back, so it
// still has rollout work when its agent stops, whatever the other nodes'
// pace: without the hold, on a busy machine it could be granted first and
// finish before the harness saw it Waiting (the node's Waiting report is
// then a moment between two polls, and a converged node has no work to be
// quiet about).
func QuietAgent(ctx context.Context, f *Fleet, quietAfter time.Duration) Result {
	start := time.Now()
	name := "quiet"
	res := Result{Pool: name}
	opts := PoolOptions{Nodes: 3, MaxUnavailable: 1, MaxStaging: 1, HaltAfter: 1, RebootTimeout: time.Minute}
	opts.Behaviour = func(int) NodeBehaviour {
		return NodeBehaviour{BootTime: 300 * time.Millisecond, StageTime: 200 * time.Millisecond}
	}
	p := f.AddPool(name, opts)
	silent := p.Nodes[2]
	v2 := p.Push("v2")
	if !sim.WaitFor(ctx, 30*time.Second, func() bool {
		bn := &fleetv1.BootcNode{}
		return f.Env.Client.Get(ctx, client.ObjectKey{Name: silent.Name}, bn) != nil // no BootcNode before the pool
	}) {
		res.Problems = append(res.Problems, "setup: a BootcNode exists before the pool")
	}
	hold := func(on bool) error {
		v := "null"
		if on {
			v = `"quiet agent test"`
		}
		patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%s}}}`, fleetv1.AnnotationHold, v)
		_, err := f.Kube.CoreV1().Nodes().Patch(ctx, silent.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		return err
	}
	if err := hold(true); err != nil {
		res.Problems = append(res.Problems, "holding "+silent.Name+": "+err.Error())
		return res
	}
	p.Create("v2", opts)
	// Held, the node waits for a grant it cannot get: its Waiting report
	// for v2 stays until the hold is lifted. The bound only guards a stall.
	if !sim.WaitFor(ctx, 3*time.Minute, func() bool {
		bn := &fleetv1.BootcNode{}
		return f.Env.Client.Get(ctx, client.ObjectKey{Name: silent.Name}, bn) == nil && bn.Status.Phase == fleetv1.PhaseWaiting &&
			bn.Spec.DesiredImage != "" && bn.Status.ObservedGeneration == bn.Generation
	}) {
		res.Problems = append(res.Problems, "the node never reported Waiting")
	}
	silent.StopAgent()
	// The pool may name the node quietAfter after the coordinator saw its
	// last report, which was written at or before this (one clock here).
	last := time.Now()
	if bn := (&fleetv1.BootcNode{}); f.Env.Client.Get(ctx, client.ObjectKey{Name: silent.Name}, bn) == nil && bn.Status.LastReportTime != nil {
		last = bn.Status.LastReportTime.Time
	}
	named := func() (bool, string) {
		st := p.Status()
		c := meta.FindStatusCondition(st.Conditions, fleetv1.PoolAgentsReporting)
		return st.Quiet >= 1 && c != nil && c.Status == metav1.ConditionFalse && strings.Contains(c.Message, silent.Name), fmt.Sprintf("quiet %d, %+v", st.Quiet, c)
	}
	// Named in the pass the coordinator requeued for quietAfter after the
	// last report it saw; the bound only guards a stall on a busy machine.
	if !sim.WaitFor(ctx, quietAfter+3*time.Minute, func() bool { ok, _ := named(); return ok }) {
		_, why := named()
		res.Problems = append(res.Problems, "the pool never named the quiet node: "+why)
	} else if took := time.Since(last); took < quietAfter {
		res.Problems = append(res.Problems, fmt.Sprintf("named quiet %s after its last report, before quietAfter %s", took, quietAfter))
	}
	silent.StartAgent(f.ctx)
	if err := hold(false); err != nil {
		res.Problems = append(res.Problems, "lifting the hold: "+err.Error())
	}
	if !sim.WaitFor(ctx, 120*time.Second, func() bool {
		ok, _ := p.Converged(v2)
		return ok && p.Status().Quiet == 0
	}) {
		_, waiting := p.Converged(v2)
		res.Problems = append(res.Problems, fmt.Sprintf("did not converge with the agent back (waiting for %s), or still quiet: %+v", waiting, p.Status()))
	}
	judgeOneRebootEach(ctx, p, v2, invariant.Pool{MaxUnavailable: 1, MaxStaging: 1, HaltAfter: 1}, &res)
	res.Duration = time.Since(start)
	return res
}
