package fleet

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/health"
	"github.com/bootc-fleet/bootc-fleet/internal/sim"
	"github.com/bootc-fleet/bootc-fleet/internal/sim/invariant"
)

// Scenarios of a bad image (docs/design.md, amendments 24-26): an image that
// boots but fails the host check (PushBad) is caught by the health gate,
// rolled back under a rollback grant and quarantined, and costs at most one
// wave: the canaries, else the first wave, else the zone it fails in.

// gateTimeout is spec.health.timeout of these pools: the schema's least.
const gateTimeout = 30 * time.Second

// badImagePool is the pool of these scenarios: the host check on, onFailure
// Rollback (the default), the canaries as given (nil: none).
func badImagePool(nodes, maxUnavailable int, seed int64, canary *fleetv1.CanarySpec, labels func(int) map[string]string) PoolOptions {
	r := rand.New(rand.NewPCG(uint64(seed), 0xbad))
	boot := time.Duration(300+r.IntN(500)) * time.Millisecond
	stage := time.Duration(100+r.IntN(400)) * time.Millisecond
	gen := generationFor(seed)
	return PoolOptions{
		Nodes: nodes, MaxUnavailable: maxUnavailable, MaxStaging: nodes, HaltAfter: 1, RebootTimeout: time.Minute,
		Behaviour: func(int) NodeBehaviour {
			return NodeBehaviour{BootTime: boot, StageTime: stage, StaleAfterReboot: boot / 2, Generation: gen}
		},
		Labels: labels,
		Mutate: func(p *fleetv1.BootcNodePool) {
			p.Spec.Health = &fleetv1.HealthSpec{Timeout: &metav1.Duration{Duration: gateTimeout}, Host: &fleetv1.HostHealthCheck{}}
			p.Spec.Rollout.Canary = canary
		},
	}
}

func canaries(n int32) *fleetv1.CanarySpec {
	return &fleetv1.CanarySpec{Nodes: ptr.To(intstr.FromInt32(n)), Soak: &metav1.Duration{}}
}

// BadImageCanary is scenario (a): a bad image with one canary (5 nodes,
// maxUnavailable 2; odd seeds in two zones, even seeds without zones). The
// canary alone reboots into it, fails its host check, is rolled back under
// a rollback grant and the image is quarantined: the canary rebooted
// exactly twice, once under each grant, back on the old digest; no other
// node rebooted or got a reboot grant for the bad digest; the pool is
// Degraded (ImageFailedHealthCheck) and an Event names the node and the
// check. Then a good image rolls the whole pool, one reboot each, and the
// quarantine and Degraded are lifted (amendment 25: a new spec.image clears
// the quarantine). I1-I5 hold over the whole run.
func BadImageCanary(ctx context.Context, f *Fleet, seed int64) Result {
	start := time.Now()
	name := fmt.Sprintf("canary%04d", seed)
	res := Result{Seed: seed, Pool: name}
	var labels func(int) map[string]string
	if seed%2 == 1 {
		labels = func(i int) map[string]string { return map[string]string{fleetv1.LabelZone: []string{"a", "b"}[i%2]} }
	}
	opts := badImagePool(5, 2, seed, canaries(1), labels)
	p := f.AddPool(name, opts)
	hist := watchSlots(ctx, f, p)
	old := p.Nodes[0].Machine.State().Booted.Image
	bad := p.PushBad("v2")
	good := p.Push("v3")
	p.Create("v2", opts)

	canary, ok := p.awaitRolledBack(ctx, hist, old, 1, &res)
	if !ok {
		res.Duration = time.Since(start)
		return res
	}
	res.Problems = append(res.Problems, p.judgeRolledBack(ctx, hist, bad, old, canary, 0)...)
	if c := p.Status().Canary; c == nil || !slices.Equal(c.Nodes, canary) {
		res.Problems = append(res.Problems, fmt.Sprintf("status.canary %+v: the node that went first, %v, is not the canary", c, canary))
	}
	before := p.Reboots()

	if err := p.SetImage("v3"); err != nil {
		res.Problems = append(res.Problems, "changing the image: "+err.Error())
	}
	if !sim.WaitFor(ctx, 120*time.Second, func() bool { ok, _ := p.Converged(good); return ok }) {
		_, waiting := p.Converged(good)
		res.Problems = append(res.Problems, fmt.Sprintf("did not converge on the good image %s; waiting for %s; pool %+v", good, waiting, p.Status()))
	}
	sim.WaitFor(ctx, 10*time.Second, func() bool { return p.Status().Rebooting == 0 })
	res.Reboots = p.Reboots()
	for _, n := range p.NodeNames() {
		if got := res.Reboots[n] - before[n]; got != 1 {
			res.Problems = append(res.Problems, fmt.Sprintf("node %s rebooted %d times for the good image, want 1", n, got))
		}
	}
	if st := p.Status(); st.Quarantine != nil || !hasCondition(st, fleetv1.PoolDegraded, metav1.ConditionFalse, "") {
		res.Problems = append(res.Problems, fmt.Sprintf("a new spec.image lifts the quarantine and Degraded: quarantine %+v, conditions %+v", st.Quarantine, st.Conditions))
	}
	res.Problems = append(res.Problems, rebootsMatchGrants(p, res.Reboots)...)
	res.Problems = append(res.Problems, hist.rebootsUnderGrants(p)...)
	res.Violations = p.Check(good, invariant.Pool{MaxUnavailable: opts.MaxUnavailable, MaxStaging: opts.MaxStaging, HaltAfter: opts.HaltAfter})
	res.Duration = time.Since(start)
	if !res.Failed() {
		p.Remove()
	}
	return res
}

// BadImageFirstWave is scenario (b): a bad image without canaries (5 nodes,
// maxUnavailable 2, no zones). The first wave (two nodes) reboots into it
// and fails the gate; both are rolled back under rollback grants, the image
// is quarantined, the pool Degraded, and no node outside that wave reboots
// or gets a reboot grant for it. Every node ends on the old image.
func BadImageFirstWave(ctx context.Context, f *Fleet, seed int64) Result {
	start := time.Now()
	name := fmt.Sprintf("wave%04d", seed)
	res := Result{Seed: seed, Pool: name}
	opts := badImagePool(5, 2, seed, nil, nil)
	p := f.AddPool(name, opts)
	hist := watchSlots(ctx, f, p)
	old := p.Nodes[0].Machine.State().Booted.Image
	bad := p.PushBad("v2")
	p.Create("v2", opts)

	wave, ok := p.awaitRolledBack(ctx, hist, old, opts.MaxUnavailable, &res)
	if !ok {
		res.Duration = time.Since(start)
		return res
	}
	res.Problems = append(res.Problems, p.judgeRolledBack(ctx, hist, bad, old, wave, 0)...)
	res.Reboots = p.Reboots()
	res.Problems = append(res.Problems, hist.rebootsUnderGrants(p)...)
	res.Violations = p.Check(old, invariant.Pool{MaxUnavailable: opts.MaxUnavailable, MaxStaging: opts.MaxStaging, HaltAfter: opts.HaltAfter})
	res.Duration = time.Since(start)
	if !res.Failed() {
		p.Remove()
	}
	return res
}

// BadImageLastZone is scenario (c): six nodes in zones a, b and c (two
// each), one canary (in zone a, the first zone), maxUnavailable 2, and an
// image bad only on zone c's nodes (PushBadOn). Zones a and b roll onto it
// and stay; zone c, the last wave, fails its gate and is rolled back (its
// two nodes only), the image is quarantined and the pool Degraded. Zone
// order holds throughout: no reboot grant in a zone while a node of another
// zone holds a reboot slot, or a node of an earlier zone is not done.
func BadImageLastZone(ctx context.Context, f *Fleet, seed int64) Result {
	start := time.Now()
	name := fmt.Sprintf("zone%04d", seed)
	res := Result{Seed: seed, Pool: name}
	zoneOf := map[string]string{}
	labels := func(i int) map[string]string {
		z := []string{"a", "b", "c"}[i/2]
		zoneOf[fmt.Sprintf("%s-node-%02d", name, i)] = z
		return map[string]string{fleetv1.LabelZone: z}
	}
	opts := badImagePool(6, 2, seed, canaries(1), labels)
	p := f.AddPool(name, opts)
	hist := watchSlots(ctx, f, p)
	old := p.Nodes[0].Machine.State().Booted.Image
	bad := p.PushBadOn("v2", func(node string) bool { return zoneOf[node] == "c" })
	p.Create("v2", opts)

	wave, ok := p.awaitRolledBack(ctx, hist, old, 2, &res)
	if !ok {
		res.Duration = time.Since(start)
		return res
	}
	var zoneC []string
	for _, n := range p.NodeNames() {
		if zoneOf[n] == "c" {
			zoneC = append(zoneC, n)
		}
	}
	if !slices.Equal(wave, zoneC) {
		res.Problems = append(res.Problems, fmt.Sprintf("rolled back %v, want zone c's nodes %v", wave, zoneC))
	}
	res.Problems = append(res.Problems, p.judgeRolledBack(ctx, hist, bad, old, wave, 1)...)
	res.Problems = append(res.Problems, hist.zoneOrder(zoneOf, bad)...)
	if c := p.Status().Canary; c == nil || len(c.Nodes) != 1 || zoneOf[c.Nodes[0]] != "a" {
		res.Problems = append(res.Problems, fmt.Sprintf("status.canary %+v, want one node of zone a", c))
	}
	res.Reboots = p.Reboots()
	res.Problems = append(res.Problems, hist.rebootsUnderGrants(p)...)
	fin := p.Final(bad)
	for _, n := range zoneC {
		fn := fin.Nodes[n]
		fn.Target = old // rolled back: the image it ran before
		fin.Nodes[n] = fn
	}
	res.Violations = invariant.Check(p.Events(), map[string]invariant.Pool{name: {MaxUnavailable: opts.MaxUnavailable, MaxStaging: opts.MaxStaging, HaltAfter: opts.HaltAfter}}, fin)
	res.Duration = time.Since(start)
	if !res.Failed() {
		p.Remove()
	}
	return res
}

// awaitRolledBack waits until the pool quarantined its target and want
// nodes got a rollback grant to old, each back on old with that slot
// released, and returns those nodes, sorted.
func (p *Pool) awaitRolledBack(ctx context.Context, hist *slotHistory, old string, want int, res *Result) ([]string, bool) {
	var failed []string
	done := func() bool {
		st := p.Status()
		if st.Quarantine == nil || st.Rebooting > 0 {
			return false
		}
		failed = hist.holdersOf(old, true)
		if len(failed) != want {
			return false
		}
		for _, name := range failed {
			n := p.node(name)
			if n.Down() || n.Machine.State().Booted == nil || n.Machine.State().Booted.Image != old || !hist.rollbackReleased(name) {
				return false
			}
		}
		return true
	}
	if !sim.WaitFor(ctx, 3*gateTimeout+60*time.Second, done) {
		res.Problems = append(res.Problems, fmt.Sprintf("the bad image's wave was not rolled back and quarantined: rollback grants to %v (want %d); pool %+v; grants:\n%swarnings:\n%s",
			hist.holdersOf(old, true), want, p.Status(), hist, p.warnings(ctx)))
		res.Reboots = p.Reboots()
		return nil, false
	}
	return failed, true
}

// judgeRolledBack checks the end of a bad image's wave: each node of it
// rebooted exactly twice, under an update grant for bad then a rollback
// grant for old, and is booted on old; every other node rebooted others
// times (0: and got no reboot grant for bad), under update grants only;
// bad is quarantined, the pool Degraded with reason ImageFailedHealthCheck,
// and a HealthCheckFailed Event on each node of the wave names it, the host
// check and the unit.
func (p *Pool) judgeRolledBack(ctx context.Context, hist *slotHistory, bad, old string, wave []string, others int) []string {
	var out []string
	reboots := p.Reboots()
	for _, n := range p.NodeNames() {
		if !slices.Contains(wave, n) {
			if reboots[n] != others {
				out = append(out, fmt.Sprintf("node %s outside the failed wave rebooted %d times, want %d", n, reboots[n], others))
			}
			if others == 0 && slices.Contains(hist.holdersOf(bad, false), n) {
				out = append(out, fmt.Sprintf("node %s outside the failed wave got a reboot grant for %s", n, bad))
			}
			if len(hist.grantsOf(n, true)) > 0 {
				out = append(out, fmt.Sprintf("node %s outside the failed wave got a rollback grant", n))
			}
			continue
		}
		if reboots[n] != 2 {
			out = append(out, fmt.Sprintf("node %s of the failed wave rebooted %d times, want 2 (update, rollback)", n, reboots[n]))
		}
		gs := hist.grantsOf(n, false)
		if len(gs) != 2 || gs[0].Rollback || gs[0].Image != bad || !gs[1].Rollback || gs[1].Image != old {
			out = append(out, fmt.Sprintf("node %s: reboot grants %v, want an update grant for %s then a rollback grant for %s", n, gs, bad, old))
		}
		if st := p.node(n).Machine.State(); st.Booted == nil || st.Booted.Image != old {
			out = append(out, fmt.Sprintf("node %s is booted on %+v, want the old image %s", n, st.Booted, old))
		}
		out = append(out, p.gateEvent(ctx, n)...)
	}
	st := p.Status()
	if st.Quarantine == nil || st.Quarantine.Digest != bad || !slices.Contains(wave, st.Quarantine.Node) {
		out = append(out, fmt.Sprintf("status.quarantine %+v, want %s quarantined by a node of %v", st.Quarantine, bad, wave))
	}
	if !hasCondition(st, fleetv1.PoolDegraded, metav1.ConditionTrue, fleetv1.ReasonImageFailedHealthCheck) {
		out = append(out, fmt.Sprintf("pool not Degraded with reason %s: %+v", fleetv1.ReasonImageFailedHealthCheck, st.Conditions))
	}
	return out
}

// gateEvent: a HealthCheckFailed Event on node names it, the host check
// and the unit that failed.
func (p *Pool) gateEvent(ctx context.Context, node string) []string {
	evs, err := p.f.Kube.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + node})
	if err != nil {
		return []string{"listing the Events of " + node + ": " + err.Error()}
	}
	var seen []string
	for _, e := range evs.Items {
		if e.Reason != fleetv1.EventHealthCheckFailed {
			continue
		}
		if strings.Contains(e.Message, node) && strings.Contains(e.Message, "check "+string(health.CheckHost)) && strings.Contains(e.Message, BadImageUnit) {
			return nil
		}
		seen = append(seen, e.Message)
	}
	return []string{fmt.Sprintf("no %s Event on %s naming it, the host check and %s; seen %q", fleetv1.EventHealthCheckFailed, node, BadImageUnit, seen)}
}

// warnings lists the Warning Events about the pool's nodes, one a line.
func (p *Pool) warnings(ctx context.Context) string {
	evs, err := p.f.Kube.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "type=Warning"})
	if err != nil {
		return "  listing Events: " + err.Error()
	}
	var b strings.Builder
	for _, e := range evs.Items {
		if poolOfNode(e.InvolvedObject.Name) == p.Name && e.InvolvedObject.Kind == "Node" {
			fmt.Fprintf(&b, "  %s %s: %s\n", e.InvolvedObject.Name, e.Reason, e.Message)
		}
	}
	return b.String()
}

func (p *Pool) node(name string) *SimNode {
	for _, n := range p.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// hasCondition: st has the condition typ with status, and reason unless "".
func hasCondition(st fleetv1.BootcNodePoolStatus, typ string, status metav1.ConditionStatus, reason string) bool {
	c := findCond(st.Conditions, typ)
	return c != nil && c.Status == status && (reason == "" || c.Reason == reason)
}

func findCond(cs []metav1.Condition, typ string) *metav1.Condition {
	for i := range cs {
		if cs[i].Type == typ {
			return &cs[i]
		}
	}
	return nil
}

func sortedSet(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
