package fleet

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/sim"
	"github.com/bootc-fleet/bootc-fleet/internal/sim/invariant"
)

// KindBadImage is the chaos tally's name for an image pushed bad.
const KindBadImage FaultKind = "bad image"

// badMode is how a chaos seed uses a bad image.
type badMode int

const (
	noBadImage  badMode = iota
	badMidway           // a mid-rollout change (not the last) is pushed bad; the last tag is good
	badAtTheEnd         // after the campaign converged, the pool moves to an image pushed bad
)

// chaosBad is a seed's health gate and bad image, drawn from a stream of
// its own so every older draw of the seed stays as it was.
type chaosBad struct {
	gated  bool // spec.health.host
	mode   badMode
	halt   bool  // onFailure Halt (badAtTheEnd only), else Rollback
	canary int32 // canary.nodes; 0: no canaries
	soak   time.Duration
	midway int          // badMidway: the bad one is tags[midway % (len(tags)-1)], never the last
	breaks map[int]bool // badMidway: the nodes it breaks (nil: all)
	// crashRollback: badAtTheEnd, the nodes whose agent dies once between
	// `bootc rollback` and the reboot into it.
	crashRollback map[int]bool
	crashAt       time.Duration
	crashOn       int // badAtTheEnd: the node whose agent crashes crashAt after the change
}

// drawBad draws it: half the seeds gate on the host; of those, a third
// change midway to an image bad on some or all nodes and a third (with no
// node that never returns: a halted pool rolls out nothing more) end on a
// bad target, which one in four of them halts on instead of rolling back.
// Half the gated seeds have canaries.
func drawBad(seed int64, nodes int, dead bool) chaosBad {
	r := rand.New(rand.NewPCG(uint64(seed), 0xbad1))
	var b chaosBad
	if r.IntN(2) != 0 {
		return b
	}
	b.gated = true
	switch r.IntN(3) {
	case 1:
		b.mode, b.midway = badMidway, r.IntN(3)
		if r.IntN(2) == 0 {
			b.breaks = map[int]bool{}
			for i := 0; i < nodes; i++ {
				b.breaks[i] = r.IntN(2) == 0
			}
		}
	case 2:
		if !dead {
			b.mode, b.halt = badAtTheEnd, r.IntN(4) == 0
			b.crashAt, b.crashOn = time.Duration(r.IntN(45000))*time.Millisecond, r.IntN(nodes)
			b.crashRollback = map[int]bool{}
			for i := 0; i < nodes; i++ {
				b.crashRollback[i] = r.IntN(2) == 0
			}
		}
	}
	if r.IntN(2) == 0 {
		b.canary = 1 + int32(r.IntN(2))
		b.soak = time.Duration(r.IntN(3)) * time.Second
	}
	return b
}

// String says what the seed does, for its fault list.
func (b chaosBad) String() string {
	s := "the pool gates on the host (health.host, timeout 30s)"
	if b.canary > 0 {
		s += fmt.Sprintf(", %d canaries soaking %s", b.canary, b.soak)
	}
	switch b.mode {
	case badMidway:
		on := "every node"
		if b.breaks != nil {
			on = fmt.Sprintf("nodes %v", b.breaks)
		}
		s += fmt.Sprintf("; tag %d of the campaign (never the last) is pushed bad for %s", b.midway+1, on)
	case badAtTheEnd:
		policy := "Rollback"
		if b.halt {
			policy = "Halt"
		}
		s += fmt.Sprintf("; after converging, the pool moves to an image pushed bad (onFailure %s); node %d's agent crashes %s after; agents of nodes %v crash once before a rollback reboot",
			policy, b.crashOn, b.crashAt, b.crashRollback)
	}
	return s
}

// mutate sets the pool's health gate, failure policy and canaries.
func (b chaosBad) mutate(bnp *fleetv1.BootcNodePool) {
	if !b.gated {
		return
	}
	bnp.Spec.Health = &fleetv1.HealthSpec{Timeout: &metav1.Duration{Duration: rollbackGateTimeout}, Host: &fleetv1.HostHealthCheck{}}
	bnp.Spec.Rollout.OnFailure = fleetv1.OnFailureRollback
	if b.halt {
		bnp.Spec.Rollout.OnFailure = fleetv1.OnFailureHalt
	}
	n := intstr.FromInt32(b.canary)
	bnp.Spec.Rollout.Canary = &fleetv1.CanarySpec{Nodes: &n, Soak: &metav1.Duration{Duration: b.soak}}
}

// push pushes tags[i], bad when the seed says so.
func (b chaosBad) push(p *Pool, tags []string, i int) string {
	if b.mode != badMidway || i != b.midway%(len(tags)-1) {
		return p.Push(tags[i])
	}
	if b.breaks == nil {
		return p.PushBad(tags[i])
	}
	names := map[string]bool{}
	for k, on := range b.breaks {
		if on {
			names[p.Nodes[k].Name] = true
		}
	}
	return p.PushBadOn(tags[i], func(node string) bool { return names[node] })
}

// badEnd is the end of a badAtTheEnd seed: the pool, converged on good,
// moves to an image pushed bad ("vbad"); the first node to boot it fails
// its gate, the image is quarantined, and that node is rolled back to good
// (or, with Halt, stays held and the pool halts). It waits for that and
// returns the final state to judge (every node on good but, with Halt, the
// failed one, judged as a failure) and what went wrong.
func (b chaosBad) badEnd(ctx context.Context, f *Fleet, p *Pool, good string, note func(FaultKind, string, ...any)) (invariant.Final, []string) {
	bad := p.PushBad("vbad")
	if err := p.SetImage("vbad"); err != nil {
		return p.Final(good), []string{"changing the image to vbad: " + err.Error()}
	}
	note(KindBadImage, "image changed to vbad, pushed bad (%s)", bad)
	crash := time.AfterFunc(b.crashAt, func() {
		note(KindAgentCrash, "node %d's agent crashes and restarts (during the bad image's rollout)", b.crashOn)
		n := p.Nodes[b.crashOn]
		n.CrashAgent()
		time.Sleep(300 * time.Millisecond)
		if !n.Down() {
			n.StartAgent(f.ctx)
		}
	})
	defer crash.Stop()
	failed := func() string {
		if q := p.Status().Quarantine; q != nil && q.Digest == bad {
			return q.Node
		}
		return ""
	}
	done := func() bool {
		node := failed()
		if node == "" {
			return false
		}
		if b.halt {
			return p.Halted()
		}
		ok, _ := p.Converged(good)
		return ok && p.Status().Rebooting == 0
	}
	// The gate fails health.timeout after its node came back, as the
	// coordinator sees it: a restarted coordinator times it from its own
	// first sight of back-since (amendment 21: up to one timer longer,
	// never shorter), and the seeds sharing this fleet restart it now and
	// then, each restart hitting every pool. So the bound leaves room for
	// several restarts, not only for one gate and one rollback.
	const bound = 6 * time.Minute
	var problems []string
	if !sim.WaitFor(ctx, bound, done) {
		_, waiting := p.Converged(good)
		problems = append(problems, fmt.Sprintf("the bad image %s was not caught and undone within %s (failed node %q, halted %v, waiting for %s); pool %+v",
			bad, bound, failed(), p.Halted(), waiting, p.Status()), "cluster state: "+f.describe(ctx, p))
	}
	fin := p.Final(good)
	for name, fn := range fin.Nodes {
		if b.halt && fn.Booted == bad {
			// Failed its gate and held: a failure haltAfterFailures
			// counts. With maxUnavailable 2 a second node's reboot into
			// the bad image may have been under way: it fails too.
			fn.Healthy = false
			fin.Nodes[name] = fn
		}
	}
	return fin, problems
}

// summary says what a gated seed's bad image did ("" when nothing was
// quarantined nor rolled back), so a campaign shows how many seeds took
// the rollback path.
func (b chaosBad) summary(evs []invariant.Event) string {
	quarantines, runs, reboots := 0, 0, 0
	for _, e := range evs {
		switch {
		case e.Kind == invariant.Quarantine:
			quarantines++
		case e.Kind == invariant.RollbackRun:
			runs++
		case e.Kind == invariant.Reboot && e.Rollback:
			reboots++
		}
	}
	if !b.gated || quarantines+runs+reboots == 0 {
		return ""
	}
	return fmt.Sprintf("bad image: %d quarantined, %d runs of bootc rollback, %d reboots into a rollback", quarantines, runs, reboots)
}
