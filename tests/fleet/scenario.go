package fleet

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/sim"
	"github.com/bootc-fleet/bootc-fleet/internal/sim/invariant"
	"github.com/bootc-fleet/bootc-fleet/internal/sim/testbootc"
)

// Result is the outcome of one scenario run.
type Result struct {
	Seed       int64
	Pool       string
	Violations []invariant.Violation
	Problems   []string // anything else that failed (timeouts, reboot counts)
	Reboots    map[string]int
	Duration   time.Duration
	// FirstReconcile is how long the pool waited for the coordinator's
	// first status write (0: not measured).
	FirstReconcile time.Duration
	// Notes are findings worth printing even when the seed passed.
	Notes []string
}

// Failed reports whether anything went wrong.
func (r Result) Failed() bool { return len(r.Violations) > 0 || len(r.Problems) > 0 }

func (r Result) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d (pool %s, %s): %d violations, %d problems", r.Seed, r.Pool, r.Duration.Round(time.Millisecond), len(r.Violations), len(r.Problems))
	for _, p := range r.Problems {
		fmt.Fprintf(&b, "\n  problem: %s", p)
	}
	for _, v := range r.Violations {
		fmt.Fprintf(&b, "\n  %s", v)
	}
	return b.String()
}

// ImageChangeMidRollout is the scenario bootc-fleet exists for: the pool's
// image changes while one node is mid-stage and another is mid-reboot, and
// every reboot is followed by a window of stale bootc status. Every node
// must end on the new image with exactly one reboot per reboot grant, none
// ungated, and I1-I5 must hold. The seed fixes the fleet's shape and timings.
func ImageChangeMidRollout(ctx context.Context, f *Fleet, seed int64) Result {
	start := time.Now()
	r := rand.New(rand.NewPCG(uint64(seed), 0x5eed))
	name := fmt.Sprintf("s%04d", seed)
	nodes := 3 + r.IntN(3)
	opts := PoolOptions{
		Nodes:          nodes,
		MaxUnavailable: 1 + r.IntN(2),
		// At most nodes-2 stage slots: when the first nodes are staged
		// and one reboots, others are still waiting to stage, so a stage
		// and a reboot overlap for seconds.
		MaxStaging:    1 + r.IntN(nodes-2),
		HaltAfter:     1,
		RebootTimeout: time.Minute,
	}
	stale := time.Duration(r.IntN(1500)) * time.Millisecond
	boot := time.Duration(2000+r.IntN(1000)) * time.Millisecond
	stage := time.Duration(2500+r.IntN(1000)) * time.Millisecond
	// Odd seeds run a bootc with `switch --download-only`, even seeds one
	// without it (stage = switch, then upgrade --download-only).
	gen := generationFor(seed)
	opts.Behaviour = func(i int) NodeBehaviour {
		b := NodeBehaviour{BootTime: boot, StaleAfterReboot: stale, StageTime: stage, Generation: gen}
		// The nodes that stage in the second round (their slot is handed on
		// in the pass that grants the first reboot) download for longer, so
		// their stage spans the first node's drain and reboot even when a
		// loaded machine slows the reboot down.
		if i >= opts.MaxStaging {
			b.StageTime = stage + boot + 3*time.Second
		}
		return b
	}
	res := Result{Seed: seed, Pool: name}
	p := f.AddPool(name, opts)
	p.Push("v2")
	v3 := p.Push("v3")
	p.Create("v2", opts)

	midStage := func() (string, bool) {
		for _, n := range p.Nodes {
			if n.Staging() {
				return n.Name, true
			}
		}
		return "", false
	}
	midReboot := func() (string, bool) {
		for _, n := range p.Nodes {
			if n.Down() {
				return n.Name, true
			}
		}
		return "", false
	}
	if !sim.WaitFor(ctx, 60*time.Second, func() bool {
		_, s := midStage()
		_, b := midReboot()
		return s && b
	}) {
		res.Problems = append(res.Problems, "never saw one node mid-stage while another was mid-reboot")
	}
	if err := p.SetImage("v3"); err != nil {
		res.Problems = append(res.Problems, "changing the image: "+err.Error())
	}
	if !sim.WaitFor(ctx, 90*time.Second, func() bool {
		if p.Status().TargetImage != v3 {
			return false
		}
		ok, _ := p.Converged(v3)
		return ok
	}) {
		_, waiting := p.Converged(v3)
		res.Problems = append(res.Problems, fmt.Sprintf("did not converge on %s within 90s; waiting for %s; pool status %+v", v3, waiting, p.Status()))
	}
	// Let the last release land, then judge the whole run.
	sim.WaitFor(ctx, 10*time.Second, func() bool { return p.Status().Rebooting == 0 })
	res.Violations = p.Check(v3, invariant.Pool{MaxUnavailable: opts.MaxUnavailable, MaxStaging: opts.MaxStaging, HaltAfter: opts.HaltAfter})
	res.Reboots = p.Reboots()
	res.Problems = append(res.Problems, rebootsMatchGrants(p, res.Reboots)...)
	res.Duration = time.Since(start)
	if !res.Failed() {
		p.Remove()
	}
	return res
}

// NodeNeverReturns runs a rollout in which one node does not come back from
// its reboot. The coordinator must mark the grant RebootTimeout, halt the
// pool (haltAfter 1) and grant no further reboots; the other nodes keep
// their old image or finish what they were granted. I1-I5 hold with that
// node unhealthy.
func NodeNeverReturns(ctx context.Context, f *Fleet, seed int64) Result {
	start := time.Now()
	name := fmt.Sprintf("dead%04d", seed)
	opts := PoolOptions{Nodes: 4, MaxUnavailable: 1, MaxStaging: 4, HaltAfter: 1, RebootTimeout: 3 * time.Second}
	opts.Behaviour = func(int) NodeBehaviour {
		return NodeBehaviour{BootTime: 300 * time.Millisecond, StageTime: 100 * time.Millisecond, StaleAfterReboot: 500 * time.Millisecond}
	}
	res := Result{Seed: seed, Pool: name}
	p := f.AddPool(name, opts)
	v2 := p.Push("v2")
	// Whichever node reboots first never comes back.
	for _, n := range p.Nodes {
		n.SetBehaviour(NodeBehaviour{BootTime: 300 * time.Millisecond, StageTime: 100 * time.Millisecond, NeverReturn: true})
	}
	p.Create("v2", opts)
	var dead *SimNode
	if !sim.WaitFor(ctx, 60*time.Second, func() bool {
		for _, n := range p.Nodes {
			if n.Dead() {
				dead = n
				return true
			}
		}
		return false
	}) {
		res.Problems = append(res.Problems, "no node rebooted")
		return res
	}
	for _, n := range p.Nodes {
		if n != dead {
			n.SetBehaviour(NodeBehaviour{BootTime: 300 * time.Millisecond, StageTime: 100 * time.Millisecond})
		}
	}
	if !sim.WaitFor(ctx, 60*time.Second, p.Halted) {
		res.Problems = append(res.Problems, fmt.Sprintf("pool not Halted after %s never returned: %+v", dead.Name, p.Status()))
	}
	// Halted means no new reboot grants: nothing else reboots from now on.
	before := len(p.Reboots())
	time.Sleep(3 * time.Second)
	if after := p.Reboots(); len(after) != before || after[dead.Name] != 1 {
		res.Problems = append(res.Problems, fmt.Sprintf("reboots after the halt: %v", after))
	}
	st := p.Status()
	if st.Failures < 1 || st.Degraded < 1 {
		res.Problems = append(res.Problems, fmt.Sprintf("pool status does not count the failure: %+v", st))
	}
	// The healthy nodes did not reboot, so they are still on v1: judge them
	// against the image they run, and the dead one as unhealthy.
	fin := p.Final(v2)
	for n, fn := range fin.Nodes {
		if n != dead.Name {
			fn.Healthy = false // not converged by design: the pool halted
			fin.Nodes[n] = fn
		}
	}
	res.Violations = invariant.Check(p.Events(), map[string]invariant.Pool{name: {MaxUnavailable: 1, MaxStaging: 4, HaltAfter: 1}}, fin)
	res.Reboots = p.Reboots()
	res.Duration = time.Since(start)
	return res
}

// CoordinatorRestart stops the coordinator in the middle of a rollout (as a
// crash would), waits, starts a new one, and checks the rollout resumes and
// converges without a double grant or any broken invariant.
func CoordinatorRestart(ctx context.Context, f *Fleet, seed int64) Result {
	start := time.Now()
	name := fmt.Sprintf("restart%04d", seed)
	res := Result{Seed: seed, Pool: name}
	p, v2 := startFiveNodeRollout(f, name, 300*time.Millisecond)
	if !sim.WaitFor(ctx, 60*time.Second, func() bool { return len(p.Reboots()) >= 2 }) {
		res.Problems = append(res.Problems, "rollout did not start")
	}
	f.RestartCoordinator(2 * time.Second)
	if !sim.WaitFor(ctx, 90*time.Second, func() bool { ok, _ := p.Converged(v2); return ok }) {
		_, waiting := p.Converged(v2)
		res.Problems = append(res.Problems, "did not converge after the restart; waiting for "+waiting)
	}
	judgeOneRebootEach(ctx, p, v2, invariant.Pool{MaxUnavailable: 2, MaxStaging: 2, HaltAfter: 1}, &res)
	res.Duration = time.Since(start)
	return res
}

// APIServerOutage cuts every agent's and the coordinator's connection to
// the API server twice during a rollout (5s each, new connections refused)
// and checks the rollout converges with one reboot per node and I1-I5.
func APIServerOutage(ctx context.Context, f *Fleet, seed int64) Result {
	start := time.Now()
	name := fmt.Sprintf("outage%04d", seed)
	res := Result{Seed: seed, Pool: name}
	p, v2 := startFiveNodeRollout(f, name, 500*time.Millisecond)
	if !sim.WaitFor(ctx, 60*time.Second, func() bool { return len(p.Reboots()) >= 1 }) {
		res.Problems = append(res.Problems, "rollout did not start")
	}
	f.API.Cut(5 * time.Second)
	time.Sleep(7 * time.Second)
	if !sim.WaitFor(ctx, 60*time.Second, func() bool { return len(p.Reboots()) >= 3 }) {
		res.Problems = append(res.Problems, "rollout did not resume after the first outage")
	}
	f.API.Cut(5 * time.Second)
	if !sim.WaitFor(ctx, 120*time.Second, func() bool { ok, _ := p.Converged(v2); return ok }) {
		_, waiting := p.Converged(v2)
		res.Problems = append(res.Problems, "did not converge after the outages; waiting for "+waiting)
	}
	judgeOneRebootEach(ctx, p, v2, invariant.Pool{MaxUnavailable: 2, MaxStaging: 2, HaltAfter: 1}, &res)
	res.Duration = time.Since(start)
	return res
}

// ClockSkew rolls out over five nodes whose clocks are wrong: each node's
// clock is off by -20 min, +1 day or -3 min, a different offset in each boot.
// Every coordinator timer runs on the coordinator's clock (design.md,
// amendment 8), so no stage grant may expire early or live on, the pool
// converges with one reboot per node, and I1-I5 hold.
func ClockSkew(ctx context.Context, f *Fleet, seed int64) Result {
	start := time.Now()
	name := fmt.Sprintf("skew%04d", seed)
	res := Result{Seed: seed, Pool: name}
	offsets := []time.Duration{-20 * time.Minute, 24 * time.Hour, -3 * time.Minute}
	opts := PoolOptions{Nodes: 5, MaxUnavailable: 1, MaxStaging: 2, HaltAfter: 1, RebootTimeout: time.Minute}
	opts.Behaviour = func(i int) NodeBehaviour {
		k := i % len(offsets)
		return NodeBehaviour{BootTime: 400 * time.Millisecond, StageTime: 1500 * time.Millisecond, StaleAfterReboot: 700 * time.Millisecond,
			ClockSkews: append(append([]time.Duration(nil), offsets[k:]...), offsets[:k]...)}
	}
	p := f.AddPool(name, opts)
	v2 := p.Push("v2")
	p.Create("v2", opts)
	if !sim.WaitFor(ctx, 120*time.Second, func() bool { ok, _ := p.Converged(v2); return ok }) {
		_, waiting := p.Converged(v2)
		res.Problems = append(res.Problems, fmt.Sprintf("did not converge with skewed node clocks; waiting for %s; pool %+v", waiting, p.Status()))
	}
	judgeOneRebootEach(ctx, p, v2, invariant.Pool{MaxUnavailable: 1, MaxStaging: 2, HaltAfter: 1}, &res)
	// Every agent was alive and reporting: no stage grant may have expired
	// (a node clock 20 minutes behind used to expire them at once).
	if evs, err := f.Kube.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name}); err != nil {
		res.Problems = append(res.Problems, "listing the pool's Events: "+err.Error())
	} else {
		for _, e := range evs.Items {
			if strings.Contains(e.Message, "expired") || e.Reason == fleetv1.EventRebootTimeout {
				res.Problems = append(res.Problems, fmt.Sprintf("a timer fired on a live node: %s %s", e.Reason, e.Message))
			}
		}
	}
	if p.Halted() {
		res.Problems = append(res.Problems, "the pool halted")
	}
	res.Duration = time.Since(start)
	if !res.Failed() {
		p.Remove()
	}
	return res
}

// startFiveNodeRollout creates a 5-node pool (maxUnavailable 2, maxStaging
// 2, stale status after each reboot) rolling out a fresh v2, and returns it
// with v2's repo@sha256.
func startFiveNodeRollout(f *Fleet, name string, stage time.Duration) (*Pool, string) {
	opts := PoolOptions{Nodes: 5, MaxUnavailable: 2, MaxStaging: 2, HaltAfter: 1, RebootTimeout: time.Minute}
	opts.Behaviour = func(int) NodeBehaviour {
		return NodeBehaviour{BootTime: 400 * time.Millisecond, StageTime: stage, StaleAfterReboot: 700 * time.Millisecond}
	}
	p := f.AddPool(name, opts)
	v2 := p.Push("v2")
	p.Create("v2", opts)
	return p, v2
}

// judgeOneRebootEach waits for the last release, checks I1-I5 and that
// every node rebooted exactly once (one image, one grant each).
func judgeOneRebootEach(ctx context.Context, p *Pool, target string, budget invariant.Pool, res *Result) {
	sim.WaitFor(ctx, 10*time.Second, func() bool { return p.Status().Rebooting == 0 })
	res.Violations = p.Check(target, budget)
	res.Reboots = p.Reboots()
	for _, n := range p.NodeNames() {
		if res.Reboots[n] != 1 {
			res.Problems = append(res.Problems, fmt.Sprintf("node %s rebooted %d times, want 1", n, res.Reboots[n]))
		}
	}
}

// generationFor alternates the bootc generations that can stage locked.
func generationFor(k int64) testbootc.Generation {
	if k%2 == 1 {
		return testbootc.GenSwitchDownloadOnly
	}
	return testbootc.Gen1_16
}

// rebootsMatchGrants: every node rebooted, exactly once per reboot grant
// that reached phase Reboot.
func rebootsMatchGrants(p *Pool, reboots map[string]int) []string {
	var out []string
	grants := p.RebootGrants()
	for _, n := range p.NodeNames() {
		if reboots[n] != grants[n] {
			out = append(out, fmt.Sprintf("node %s: %d reboots for %d reboot grants that reached phase Reboot", n, reboots[n], grants[n]))
		}
		if reboots[n] == 0 {
			out = append(out, fmt.Sprintf("node %s never rebooted", n))
		}
	}
	return out
}
