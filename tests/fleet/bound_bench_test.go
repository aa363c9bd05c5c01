package fleet

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/agent"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/plan"
	"github.com/bootc-fleet/bootc-fleet/internal/sim"
	"github.com/bootc-fleet/bootc-fleet/internal/sim/invariant"
	"github.com/bootc-fleet/bootc-fleet/tests/envtest"
)

// The shape of BenchmarkRolloutBound: every node stages at once (maxStaging
// = N), a stage takes S, a reboot keeps a node down R, no pods.
const (
	boundStage  = 2 * time.Second
	boundReboot = 3 * time.Second
)

// BenchmarkRolloutBound rolls an image over N nodes with maxUnavailable
// N/10 against a real API server and the real coordinator binary (a child
// process at its production defaults), and prints what users feel next to
// the lower bound LB = S + ceil(N/M)·R, on two clocks: from the pool's
// creation (the pool is created on an image its nodes do not run: the clock
// a user starts when they apply a new pool) to every node booted on it and
// every reboot slot released; then, once the pool settled (BootcNodes and
// slots exist, every agent reported), from an image change on it to the
// same. For each it prints the breakdown of each reboot slot's cycle
// (median and p95 of each hop, and the overhead: the cycle less R), the API
// requests per node update by verb and resource from the API server's own
// metrics (the product's writes apart from the harness's, the light
// agents' own counted as they leave), the coordinator's CPU seconds and
// peak RSS, and the test process's (light agents and harness).
//
// Sizes: BENCH_NODES, a comma-separated list (default "100"; 1000 and 5000
// are for a quiet machine). Agents: BENCH_AGENTS, "real", "light" or both
// (default "real,light" at 100 nodes, "light" above: in-process real agents
// at 1,000+ would make the harness the load; see LightAgent). Runs:
// BENCH_RUNS (default 1), each on a new API server; after them, one table
// per size and agents with every run's figures and their median. Clocks:
// BENCH_CLOCKS, "created", "changed" or both (the default). Each
// combination is a sub-benchmark, so -bench 'RolloutBound/N=100/agents=real'
// picks one.
func BenchmarkRolloutBound(b *testing.B) {
	if ok, why := envtest.Available(); !ok {
		if os.Getenv("BOOTC_FLEET_REQUIRE_ENVTEST") == "1" {
			b.Fatal(why)
		}
		b.Skip(why)
	}
	sizes := []int{100}
	if v := os.Getenv("BENCH_NODES"); v != "" {
		sizes = nil
		for _, s := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil || n <= 0 {
				b.Fatalf("BENCH_NODES=%q: %q is not a node count", v, s)
			}
			sizes = append(sizes, n)
		}
	}
	runs := 1
	if v := os.Getenv("BENCH_RUNS"); v != "" {
		r, err := strconv.Atoi(v)
		if err != nil || r < 1 || r > 50 {
			b.Fatalf("BENCH_RUNS=%q: want a count from 1 to 50", v)
		}
		runs = r
	}
	bin, err := sim.BuildProcBinaries(context.Background(), filepath.Join(b.TempDir(), "bin"))
	if err != nil {
		b.Fatal(err)
	}
	for _, n := range sizes {
		kinds := []string{"real", "light"}
		if n >= 1000 {
			kinds = []string{"light"}
		}
		if v := os.Getenv("BENCH_AGENTS"); v != "" {
			kinds = strings.Split(v, ",")
		}
		for _, kind := range kinds {
			b.Run(fmt.Sprintf("N=%d/agents=%s", n, kind), func(b *testing.B) {
				// One op is all the runs, timed: with the timer stopped,
				// b.Loop saw microseconds per op and ran it again and again
				// under make bench's -benchtime 1s. A run takes a minute, so
				// it runs once at any -benchtime up to that.
				for b.Loop() {
					var table boundTable
					for i := range runs {
						fmt.Fprintf(os.Stderr, "rollout bound: N=%d agents=%s, run %d of %d\n", n, kind, i+1, runs)
						table.add(rolloutBound(b, n, max(1, n/10), kind == "light", bin.Coordinator))
					}
					fmt.Fprint(os.Stderr, table.String(fmt.Sprintf("N=%d M=%d S=%s R=%s, %s agents", n, max(1, n/10), boundStage, boundReboot, kind)))
					table.report(b)
				}
			})
		}
	}
}

// rolloutBound runs once: a pool created on an image its nodes do not run,
// then, settled, changed to another (BENCH_CLOCKS may leave either out).
func rolloutBound(b *testing.B, n, m int, light bool, coordinator string) []boundFigure {
	f := Start(b, Options{
		CoordinatorBinary: coordinator,
		LightAgents:       light,
		// No outages here, and a direct connection per node keeps 5,000
		// nodes under the sandbox's open-file limit.
		DirectAPI: true,
		// The agent's production intervals: zero is its default.
		Agent: func(c *agent.Config) {
			c.PollInterval, c.SettleTimeout, c.RebootTimeout, c.RereadInterval = 0, 0, 0, 0
			c.ReportInterval, c.StageRetry, c.CommandTimeout = 0, 0, 0
		},
	})
	defer f.Stop()
	opts := PoolOptions{Nodes: n, MaxUnavailable: m, MaxStaging: n, HaltAfter: 1}
	opts.Behaviour = func(int) NodeBehaviour { return NodeBehaviour{BootTime: boundReboot, StageTime: boundStage} }
	setup := time.Now()
	p := f.AddPool("bench", opts)
	fmt.Fprintf(os.Stderr, "rollout bound: %d nodes set up in %s\n", n, time.Since(setup).Round(time.Second))
	v2, v3 := p.Push("v2"), p.Push("v3")
	ctx := context.Background()
	if err := f.WaitCoordinatorWorking(2 * time.Minute); err != nil {
		b.Fatal(err)
	}
	r := boundRun{b: b, f: f, p: p, n: n, m: m, light: light}
	// BENCH_CLOCKS picks the clocks (default both); without the creation
	// clock the pool is created, untimed, on the image its nodes run.
	clocks := os.Getenv("BENCH_CLOCKS")
	timeCreation, timeChange := clocks == "" || strings.Contains(clocks, "created"), clocks == "" || strings.Contains(clocks, "changed")
	if !timeCreation && !timeChange {
		b.Fatalf("BENCH_CLOCKS=%q: want created, changed or both", clocks)
	}
	var created, changed boundPhase
	settledOn, tag := v2, "v2"
	if timeCreation {
		created = r.phase(ctx, "from the pool's creation", v2, func() error { p.Create("v2", opts); return nil })
	} else {
		settledOn, tag = p.Repo+"@"+p.Nodes[0].Machine.State().Booted.Digest, "v1"
		p.Create("v1", opts)
	}
	if timeChange {
		setup = time.Now()
		// Every 2 s, not waitFor's 100 ms: each look lists every BootcNode
		// and slot, megabytes at 5,000 nodes.
		for deadline := time.Now().Add(30 * time.Minute); !settled(ctx, f, p, settledOn, min(n, plan.MaxSlots)+min(m, plan.MaxSlots)); time.Sleep(2 * time.Second) {
			if time.Now().After(deadline) {
				b.Fatalf("the pool on %s did not settle", tag)
			}
		}
		fmt.Fprintf(os.Stderr, "rollout bound: pool settled on %s in %s\n", tag, time.Since(setup).Round(time.Second))
		changed = r.phase(ctx, "from the image change on a settled pool", v3, func() error { return p.SetImage("v3") })
	}
	final := v3
	if !timeChange {
		final = v2
	}
	if v := p.Check(final, invariant.Pool{MaxUnavailable: m, MaxStaging: n, HaltAfter: 1}); len(v) > 0 {
		b.Fatalf("%d violations, first: %s", len(v), v[0])
	}
	return r.figures(created, changed)
}

// settled: the pool's slots exist (slots of them), none is held but stage
// slots their holders are done with (kept until the next stage grant hands
// them on, amendment 31), and every node's BootcNode asks for img, which it
// booted, and its agent reported Idle.
func settled(ctx context.Context, f *Fleet, p *Pool, img string, slots int) bool {
	ls, err := f.Kube.CoordinationV1().Leases(lease.Namespace).List(ctx, metav1.ListOptions{LabelSelector: lease.LabelPool + "=" + p.Name})
	if err != nil || len(ls.Items) != slots {
		return false
	}
	for i := range ls.Items {
		if l := &ls.Items[i]; l.Labels[lease.LabelHolder] != "" && !finishedStage(ctx, f, p.Name, l) {
			return false
		}
	}
	var bns fleetv1.BootcNodeList
	if err := f.Env.Client.List(ctx, &bns); err != nil {
		return false
	}
	idle := 0
	for _, bn := range bns.Items {
		st := bn.Status
		if bn.Spec.Pool == p.Name && bn.Spec.DesiredImage == img && st.Phase == fleetv1.PhaseIdle && st.Booted != nil && img == p.Repo+"@"+st.Booted.Digest {
			idle++
		}
	}
	return idle == len(p.Nodes)
}

// rebootSlotsFree: no reboot slot Lease of the pool has a holder.
func rebootSlotsFree(ctx context.Context, f *Fleet, pool string) bool {
	ls, err := f.Kube.CoordinationV1().Leases(lease.Namespace).List(ctx, metav1.ListOptions{
		LabelSelector: lease.LabelPool + "=" + pool + "," + lease.LabelSlot + "=" + string(lease.KindReboot)})
	if err != nil || len(ls.Items) == 0 {
		return false
	}
	for _, l := range ls.Items {
		if l.Labels[lease.LabelHolder] != "" {
			return false
		}
	}
	return true
}
