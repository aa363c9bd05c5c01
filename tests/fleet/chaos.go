package fleet

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	"github.com/bootc-fleet/bootc-fleet/internal/sim"
	"github.com/bootc-fleet/bootc-fleet/internal/sim/invariant"
	"github.com/bootc-fleet/bootc-fleet/internal/sim/testbootc"
)

// ClusterFaults says whether a chaos seed may also crash the coordinator
// and cut the API server, faults that every pool of the fleet feels.
type ClusterFaults int

// How often a chaos seed may draw cluster-wide faults.
const (
	NoClusterFaults   ClusterFaults = iota // never
	SomeClusterFaults                      // one seed in five (a shared fleet)
	ClusterFaultsOn                        // every seed may (a fleet per seed)
)

// Fault is one injected fault, logged so a failing seed explains itself.
type Fault struct {
	At   time.Duration
	Kind FaultKind
	What string
}

// FaultKind names a kind of fault, for the campaign's tally.
type FaultKind string

// The kinds of fault chaos injects, as the tally names them.
const (
	KindAgentCrash        FaultKind = "agent crash"
	KindCrashBeforeReboot FaultKind = "crash between record and reboot"
	KindStageFails        FaultKind = "stage failure"
	KindStageHangs        FaultKind = "stage hang"
	KindLongStale         FaultKind = "stale status 10-60s"
	KindNeverReturns      FaultKind = "node never returns"
	KindPDB               FaultKind = "blocking PDB"
	KindPDBRemoved        FaultKind = "PDB removed"
	KindImageChange       FaultKind = "image change"
	KindCoordinatorCrash  FaultKind = "coordinator crash"
	KindAPIOutage         FaultKind = "API server outage"
	KindLeaseConflicts    FaultKind = "lease conflicts"
	KindClockSkew         FaultKind = "node clock skewed"
	KindHostile           FaultKind = "hostile node"
	KindSetup             FaultKind = "setup problem"
)

// Chaos runs one randomized rollout of a pool under faults drawn from the
// seed: agent crashes at random moments and between recording and issuing
// a reboot, coordinator crashes and restarts, bootc stage failures and
// hangs, stale status after reboots, a node that never comes back, a PDB
// that blocks a drain for a while, lease update conflicts, and 1-3 image
// changes at random moments; with cluster faults also coordinator crashes
// and API server outages (they hit every pool of the fleet); in half the
// seeds a health gate on the host, canaries and images pushed bad
// (chaosbad.go). It checks I1-I6 over the whole run.
//
// The seed decides the fleet, the faults and their timing; goroutine
// scheduling is not replayed, so a replay reproduces the same plan, not the
// same interleaving.
func Chaos(ctx context.Context, f *Fleet, seed int64, cluster ClusterFaults) (Result, []Fault) {
	start := time.Now()
	r := rand.New(rand.NewPCG(uint64(seed), 0xc4a05))
	// Draws added later come from streams of their own, so every older
	// draw of a seed (and its plan) stays as it was.
	side := rand.New(rand.NewPCG(uint64(seed), 0xc1a57))
	withClusterFaults := cluster == ClusterFaultsOn || (cluster == SomeClusterFaults && side.IntN(5) == 0)
	name := fmt.Sprintf("c%04d", seed)
	opts := PoolOptions{
		Nodes:          3 + r.IntN(4),
		MaxUnavailable: 1 + r.IntN(2),
		MaxStaging:     1 + r.IntN(3),
		HaltAfter:      1,
		RebootTimeout:  20 * time.Second,
		DrainTimeout:   2 * time.Second,
	}
	dead := -1
	if r.IntN(8) == 0 {
		dead = r.IntN(opts.Nodes)
	}
	behaviours := make([]NodeBehaviour, opts.Nodes)
	for i := range behaviours {
		behaviours[i] = NodeBehaviour{
			BootTime:          time.Duration(200+r.IntN(600)) * time.Millisecond,
			StaleAfterReboot:  time.Duration(r.IntN(3000)) * time.Millisecond,
			StageTime:         time.Duration(100+r.IntN(700)) * time.Millisecond,
			CrashBeforeReboot: r.IntN(2),
			NeverReturn:       i == dead,
			Generation:        generationFor(seed + int64(i)),
		}
	}
	// Now and then one node's bootc status stays stale for 10-60 s after
	// each of its reboots, as slow as the design allows. A stream of its
	// own keeps every other draw of the seed as it was.
	long := rand.New(rand.NewPCG(uint64(seed), 0x57a1e))
	longStale := -1
	if long.IntN(8) == 0 {
		longStale = long.IntN(opts.Nodes)
		behaviours[longStale].StaleAfterReboot = time.Duration(10+long.IntN(51)) * time.Second
		// The operator's rebootTimeout covers the boot and the settle.
		opts.RebootTimeout = max(opts.RebootTimeout, behaviours[longStale].StaleAfterReboot+20*time.Second)
	}
	// Now and then one node's clock is wrong: off by -20 min, +1 day or
	// -3 min, a different one in each boot. Nothing it writes may move a
	// coordinator timer (design.md, amendment 8).
	skew := rand.New(rand.NewPCG(uint64(seed), 0x5ce3))
	skewed := -1
	if skew.IntN(4) == 0 {
		skewed = skew.IntN(opts.Nodes)
		offsets := []time.Duration{-20 * time.Minute, 24 * time.Hour, -3 * time.Minute}
		k := skew.IntN(len(offsets))
		behaviours[skewed].ClockSkews = append(offsets[k:], offsets[:k]...)
	}
	// Every third seed has a hostile node, each kind in turn (seeds 3, 6,
	// ..., 18 cover them all): the last node by name (the stage queue's
	// last) writes forged, malformed or oversized status into its own
	// BootcNode with its own credentials (hostile.go). A kind that keeps a
	// share of maxStaging for as long as it reports (TakesStageCapacity;
	// issue 26 item 3 bounds the Staging share) gets a second stage slot,
	// so the other nodes can converge.
	hostile, hostileKind := -1, HostileKind("")
	if seed%3 == 0 {
		hostile, hostileKind = opts.Nodes-1, HostileKinds[(seed/3)%int64(len(HostileKinds))]
		if hostileKind.TakesStageCapacity() {
			opts.MaxStaging = max(opts.MaxStaging, 2)
		}
	}
	// Half the seeds gate on the host, some with canaries, and some of
	// those roll an image pushed bad (chaosbad.go).
	bad := drawBad(seed, opts.Nodes, dead >= 0)
	for i, on := range bad.crashRollback {
		if on {
			behaviours[i].CrashBeforeRollbackReboot = 1
		}
	}
	opts.Mutate = bad.mutate
	opts.Behaviour = func(i int) NodeBehaviour { return behaviours[i] }
	var faults []Fault
	var faultsMu sync.Mutex // faults fire in goroutines of their own
	note := func(kind FaultKind, format string, a ...any) {
		faultsMu.Lock()
		defer faultsMu.Unlock()
		faults = append(faults, Fault{At: time.Since(start).Round(time.Millisecond), Kind: kind, What: fmt.Sprintf(format, a...)})
	}
	if longStale >= 0 {
		note(KindLongStale, "node %d: bootc status stays stale for %s after each reboot", longStale, behaviours[longStale].StaleAfterReboot)
	}
	if bad.gated {
		note(KindBadImage, "%s", bad)
	}
	if skewed >= 0 {
		note(KindClockSkew, "node %d: its clock is off by %v in its successive boots", skewed, behaviours[skewed].ClockSkews)
	}
	for i, b := range behaviours {
		if b.NeverReturn {
			note(KindNeverReturns, "node %d will never come back from its reboot", i)
		}
		if b.CrashBeforeReboot > 0 {
			note(KindCrashBeforeReboot, "node %d's agent dies once between recording and issuing its reboot", i)
		}
	}

	p := f.AddPool(name, opts)
	hostileRec := &HostileRecord{}
	if hostile >= 0 {
		note(KindHostile, "node %d (%s) is hostile: %s", hostile, p.Nodes[hostile].Name, hostileKind)
		p.Nodes[hostile].MakeHostile(f.ctx, hostileKind, hostileRec)
	}
	tags := []string{"v2"}
	changes := 1 + r.IntN(3)
	for i := 0; i < changes; i++ {
		tags = append(tags, fmt.Sprintf("v%d", i+3))
	}
	images := map[string]string{}
	for i, tag := range tags {
		images[tag] = bad.push(p, tags, i)
	}
	// Stage failures and a hang on some nodes.
	for i, n := range p.Nodes {
		switch r.IntN(5) {
		case 0:
			times := 1 + r.IntN(2)
			n.Machine.Configure(func(k *testbootc.Knobs) {
				k.SwitchFailure = &testbootc.Failure{ExitCode: 1, Stderr: "error: pulling image: simulated network failure", Times: times}
			})
			note(KindStageFails, "node %d: bootc switch fails %d time(s)", i, times)
		case 1:
			b := behaviours[i]
			b.StageTime = 4 * time.Second
			n.SetBehaviour(b)
			note(KindStageHangs, "node %d: bootc switch hangs for 4s", i)
		}
	}
	// A PDB that blocks draining one node for a while.
	blocked := -1
	if r.IntN(3) == 0 {
		blocked = r.IntN(opts.Nodes)
		if err := f.blockDrain(ctx, p.Nodes[blocked].Name); err != nil {
			note(KindSetup, "could not set up the PDB: %v", err)
			blocked = -1
		} else {
			note(KindPDB, "node %d: a PodDisruptionBudget blocks its drain", blocked)
		}
	}
	p.Create("v2", opts)
	firstReconcile := make(chan time.Duration, 1)
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go func(created time.Time) {
		if sim.WaitFor(watchCtx, 5*time.Minute, func() bool { return p.Status().ObservedGeneration > 0 }) {
			firstReconcile <- time.Since(created)
		}
	}(time.Now())

	// The fault schedule: each entry fires at a random moment.
	type event struct {
		at time.Duration
		do func()
	}
	var plan []event
	// Image changes fire in tag order, at least 1s apart, so the last tag
	// is the final target.
	var imageMu sync.Mutex
	applied := 0 // index in tags of the pool's image
	at := time.Duration(500+r.IntN(2000)) * time.Millisecond
	for i := 1; i < len(tags); i++ {
		tag := tags[i]
		at += time.Duration(1000+r.IntN(2000)) * time.Millisecond
		plan = append(plan, event{at, func() {
			// Each change runs in a goroutine of its own: on a busy machine
			// one can be delayed past the next. An older tag never
			// overwrites a newer one, so the last tag stays the target.
			imageMu.Lock()
			defer imageMu.Unlock()
			if i <= applied {
				note(KindImageChange, "image change to %s skipped: the change to %s, planned later, was made first", tag, tags[applied])
				return
			}
			if err := p.SetImage(tag); err != nil {
				note(KindSetup, "changing the image to %s: %v", tag, err)
				return
			}
			applied = i
			note(KindImageChange, "image changed to %s", tag)
		}})
	}
	for k := r.IntN(4); k > 0; k-- {
		i := r.IntN(opts.Nodes)
		plan = append(plan, event{time.Duration(r.IntN(8000)) * time.Millisecond, func() {
			note(KindAgentCrash, "node %d's agent crashes and restarts", i)
			n := p.Nodes[i]
			n.CrashAgent()
			time.Sleep(300 * time.Millisecond)
			if !n.Down() {
				n.StartAgent(f.ctx)
			}
		}})
	}
	if withClusterFaults && r.IntN(2) == 0 {
		plan = append(plan, event{time.Duration(1000+r.IntN(7000)) * time.Millisecond, func() {
			note(KindCoordinatorCrash, "coordinator crashes; restarted 1s later")
			f.RestartCoordinator(time.Second)
		}})
	}
	if withClusterFaults && r.IntN(2) == 0 {
		plan = append(plan, event{time.Duration(1000+r.IntN(7000)) * time.Millisecond, func() {
			note(KindAPIOutage, "API server unreachable for 4s (every connection cut)")
			f.API.Cut(4 * time.Second)
		}})
	}
	if r.IntN(2) == 0 {
		plan = append(plan, event{time.Duration(r.IntN(6000)) * time.Millisecond, func() {
			note(KindLeaseConflicts, "lease update conflicts for 3s (a third writer touches the slot Leases)")
			f.touchLeases(ctx, p.Name, 3*time.Second)
		}})
	}
	if blocked >= 0 {
		plan = append(plan, event{time.Duration(4000+r.IntN(4000)) * time.Millisecond, func() {
			note(KindPDBRemoved, "the blocking PDB is removed")
			f.unblockDrain(ctx, p.Nodes[blocked].Name)
		}})
	}
	done := make(chan struct{})
	for _, e := range plan {
		go func() {
			select {
			case <-time.After(e.at):
				e.do()
			case <-done:
			case <-ctx.Done():
			}
		}()
	}
	last := tags[len(tags)-1]
	target := images[last]
	res := Result{Seed: seed, Pool: name}
	settled := func() bool {
		if p.Status().TargetImage != target {
			return false
		}
		if dead >= 0 && p.Nodes[dead].Dead() {
			return p.Halted()
		}
		ok, _ := p.Converged(target)
		return ok
	}
	maxFault := 9 * time.Second
	bound := maxFault + 240*time.Second
	if longStale >= 0 {
		bound += 3 * behaviours[longStale].StaleAfterReboot // up to three reboots of that node
	}
	if !sim.WaitFor(ctx, bound, func() bool { return time.Since(start) > maxFault && settled() }) {
		_, waiting := p.Converged(target)
		res.Problems = append(res.Problems, fmt.Sprintf("did not settle on %s (%s) within the bound; waiting for %s; pool %+v", last, target, waiting, p.Status()))
		res.Problems = append(res.Problems, "cluster state: "+f.describe(ctx, p))
	}
	close(done)
	sim.WaitFor(ctx, 5*time.Second, func() bool { return p.Status().Rebooting == 0 || (dead >= 0 && p.Halted()) })
	budget := invariant.Pool{MaxUnavailable: opts.MaxUnavailable, MaxStaging: opts.MaxStaging, HaltAfter: opts.HaltAfter}
	fin := p.Final(target)
	if dead >= 0 && p.Nodes[dead].Dead() {
		// Halted: nodes that were still waiting for a reboot slot keep their
		// old image by design; they are judged by I1-I3 and I5 only.
		for n, fn := range fin.Nodes {
			if fn.Booted != target {
				fn.Healthy = false
				fin.Nodes[n] = fn
			}
		}
	}
	if hostile >= 0 {
		// Judged apart: it never converges, and what it wrote must not
		// stop any other node (I1-I5 over the others).
		hn := p.Nodes[hostile].Name
		delete(fin.Nodes, hn)
		res.Problems = append(res.Problems, judgeHostile(ctx, f, p, hn, hostileKind, hostileRec, &res.Notes)...)
	}
	if bad.mode == badAtTheEnd && len(res.Problems) == 0 {
		// The target moves on to an image pushed bad: nodes end on the
		// last good one (target), but one that failed its gate under Halt.
		// (After the hostile node's judgement: a quarantined target
		// blocks every node, which its rollout state then says first.)
		var problems []string
		fin, problems = bad.badEnd(ctx, f, p, target, note)
		res.Problems = append(res.Problems, problems...)
		if hostile >= 0 {
			delete(fin.Nodes, p.Nodes[hostile].Name)
		}
	}
	select {
	case res.FirstReconcile = <-firstReconcile:
	default: // never reconciled: the liveness problem above says so
	}
	res.Violations = invariant.Check(p.Events(), map[string]invariant.Pool{name: budget}, fin)
	if s := bad.summary(p.Events()); s != "" {
		res.Notes = append(res.Notes, s)
	}
	res.Reboots = p.Reboots()
	res.Duration = time.Since(start)
	if !res.Failed() {
		p.Remove() // a failed pool stays for a post-mortem
	}
	return res, faults
}

// blockDrain puts a Running pod on node, covered by a PDB that allows no
// disruption (the disruption controller does not run here, so its status
// is written directly).
func (f *Fleet) blockDrain(ctx context.Context, node string) error {
	ns := "default"
	labels := map[string]string{"app": node}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: node + "-web", Namespace: ns, Labels: labels},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "web", Image: "registry.example/web:1"}}}}
	created, err := f.Kube.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	created.Status = corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	if _, err := f.Kube.CoreV1().Pods(ns).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return err
	}
	one := intstr.FromInt32(1)
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: node + "-pdb", Namespace: ns},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: &one, Selector: &metav1.LabelSelector{MatchLabels: labels}}}
	pdb, err = f.Kube.PolicyV1().PodDisruptionBudgets(ns).Create(ctx, pdb, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	pdb.Status = policyv1.PodDisruptionBudgetStatus{ObservedGeneration: pdb.Generation, DisruptionsAllowed: 0,
		CurrentHealthy: 1, DesiredHealthy: 1, ExpectedPods: 1}
	_, err = f.Kube.PolicyV1().PodDisruptionBudgets(ns).UpdateStatus(ctx, pdb, metav1.UpdateOptions{})
	return err
}

func (f *Fleet) unblockDrain(ctx context.Context, node string) {
	_ = f.Kube.PolicyV1().PodDisruptionBudgets("default").Delete(ctx, node+"-pdb", metav1.DeleteOptions{})
}

// touchLeases writes an unrelated annotation on the pool's slot Leases for
// d, so the coordinator's and the agents' updates meet conflicts.
func (f *Fleet) touchLeases(ctx context.Context, pool string, d time.Duration) {
	end := time.Now().Add(d)
	for i := 0; time.Now().Before(end) && ctx.Err() == nil; i++ {
		list, err := f.Kube.CoordinationV1().Leases(lease.Namespace).List(ctx, metav1.ListOptions{LabelSelector: lease.LabelPool + "=" + pool})
		if err == nil {
			for _, l := range list.Items {
				if l.Annotations == nil {
					l.Annotations = map[string]string{}
				}
				l.Annotations["chaos.bootc.dev/touch"] = fmt.Sprint(i)
				_, _ = f.Kube.CoordinationV1().Leases(lease.Namespace).Update(ctx, &l, metav1.UpdateOptions{})
			}
		}
		time.Sleep(30 * time.Millisecond)
	}
}

// FaultString renders a fault plan.
func FaultString(faults []Fault) string {
	var b strings.Builder
	for _, f := range faults {
		fmt.Fprintf(&b, "\n    +%s %s", f.At, f.What)
	}
	return b.String()
}

// describe renders what the cluster says about a pool's nodes and slots,
// for a seed that did not settle.
func (f *Fleet) describe(ctx context.Context, p *Pool) string {
	var b strings.Builder
	for _, n := range p.Nodes {
		node, err := f.Kube.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			fmt.Fprintf(&b, "\n    node %s: %v", n.Name, err)
			continue
		}
		ready := false
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				ready = true
			}
		}
		fmt.Fprintf(&b, "\n    node %s: ready=%v unschedulable=%v bootID=%s down=%v staging=%v", n.Name, ready, node.Spec.Unschedulable,
			node.Status.NodeInfo.BootID, n.Down(), n.Staging())
	}
	list, err := f.Kube.CoordinationV1().Leases(lease.Namespace).List(ctx, metav1.ListOptions{LabelSelector: lease.LabelPool + "=" + p.Name})
	if err == nil {
		for _, l := range list.Items {
			holder, renewed := "", ""
			if l.Spec.HolderIdentity != nil {
				holder = *l.Spec.HolderIdentity
			}
			if l.Spec.RenewTime != nil {
				renewed = time.Since(l.Spec.RenewTime.Time).Round(time.Second).String() + " ago"
			}
			fmt.Fprintf(&b, "\n    lease %s rv=%s holder=%q phase=%q failure=%q renewed %s", l.Name, l.ResourceVersion, holder,
				l.Annotations[lease.AnnotationPhase], l.Annotations[lease.AnnotationFailure], renewed)
		}
	}
	return b.String()
}
