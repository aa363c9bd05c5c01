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
// the lower bound LB = S + ceil(N/M)·R: the makespan of a rollout on an
// existing pool (the pool's image change to every node booted on the
// target and every reboot slot released; the pool is created first on the
// image its nodes run, and settles: BootcNodes and slots exist, every agent
// reported), the
// breakdown of each reboot slot's cycle (median and p95 of each hop), the
// API requests per node update from the API server's own metrics (the
// product's writes apart from the harness's), and the coordinator's CPU
// seconds and peak RSS.
//
// Sizes: BENCH_NODES, a comma-separated list (default "100"; 1000 and 5000
// are for a quiet machine). Agents: BENCH_AGENTS, "real", "light" or both
// (default "real,light" at 100 nodes, "light" above: in-process real agents
// at 1,000+ would make the harness the load; see LightAgent). Each
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
				// One op is one whole run, timed: with the timer stopped,
				// b.Loop saw microseconds per op and ran it again and again
				// under make bench's -benchtime 1s. A run takes a minute, so
				// it runs once at any -benchtime up to that.
				for b.Loop() {
					rolloutBound(b, n, max(1, n/10), kind == "light", bin.Coordinator)
				}
			})
		}
	}
}

func rolloutBound(b *testing.B, n, m int, light bool, coordinator string) {
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
	v1, v2 := p.Repo+"@"+p.Nodes[0].Machine.State().Booted.Digest, p.Push("v2")
	ctx := context.Background()
	if err := f.WaitCoordinatorWorking(2 * time.Minute); err != nil {
		b.Fatal(err)
	}
	setup = time.Now()
	p.Create("v1", opts)
	// Every 2 s, not waitFor's 100 ms: each look lists every BootcNode and
	// slot, megabytes at 5,000 nodes.
	for deadline := time.Now().Add(30 * time.Minute); !settled(ctx, f, p, v1, min(n, plan.MaxSlots)+min(m, plan.MaxSlots)); time.Sleep(2 * time.Second) {
		if time.Now().After(deadline) {
			b.Fatalf("the pool on v1 did not settle")
		}
	}
	fmt.Fprintf(os.Stderr, "rollout bound: pool created on v1, settled in %s\n", time.Since(setup).Round(time.Second))
	pid := f.CoordinatorPID()
	use0, err := ReadProcUsage(pid)
	if err != nil {
		b.Fatal(err)
	}
	reqs0, err := f.APIRequests(ctx)
	if err != nil {
		b.Fatal(err)
	}
	gets0, puts0, lists0 := sim.HarnessRequests()
	sctx, stopStatus := context.WithCancel(ctx)
	defer stopStatus()
	status, err := f.WatchStatus(sctx, v2)
	if err != nil {
		b.Fatal(err)
	}
	created := time.Now()
	if err := p.SetImage("v2"); err != nil {
		b.Fatal(err)
	}
	stop := progress(p, v2, created, 30*time.Second)
	peakAnon := samplePeak(pid, time.Second, func(u ProcUsage) int64 { return u.RSSAnon })
	done := sim.WaitFor(ctx, 30*time.Minute, func() bool {
		ok, _ := p.Converged(v2)
		return ok && rebootSlotsFree(ctx, f, p.Name)
	})
	stop()
	wall := time.Since(created)
	if !done {
		_, waiting := p.Converged(v2)
		b.Fatalf("%d nodes did not converge; waiting for %.300s", n, waiting)
	}
	use1, err := ReadProcUsage(pid)
	if err != nil {
		b.Fatal(err)
	}
	anon := max(peakAnon(), use1.RSSAnon)
	reqs1, err := f.APIRequests(ctx)
	if err != nil {
		b.Fatal(err)
	}
	gets, puts, lists := sim.HarnessRequests()
	gets, puts, lists = gets-gets0, puts-puts0, lists-lists0
	t := ExtractTiming(p.Events(), p.Name, created)
	lb := LowerBound(boundStage, boundReboot, n, m)
	kind := "real agents (in-process)"
	if light {
		kind = "light agents"
	}
	var w strings.Builder
	fmt.Fprintf(&w, "rollout bound: N=%d M=%d S=%s R=%s, %s, coordinator binary at production defaults\n", n, m, boundStage, boundReboot, kind)
	fmt.Fprintf(&w, "  makespan %s, LB %s, makespan/LB %.3f (waited %s until every slot was seen free)\n",
		ms(t.Makespan()), lb, t.Makespan().Seconds()/lb.Seconds(), ms(wall))
	w.WriteString(status.Report(created, "desired", string(fleetv1.PhaseWaiting), string(fleetv1.PhaseStaging), string(fleetv1.PhaseStaged)))
	w.WriteString(t.Report(12))
	delta := Since(reqs0, reqs1)
	fmt.Fprintf(&w, "  API requests per node update (API server metrics, everything): %s\n", PerNode(delta, n))
	writes := int64(0)
	for _, c := range delta {
		switch strings.SplitN(c.What, " ", 2)[0] {
		case "POST", "PUT", "PATCH", "DELETE", "APPLY":
			writes += c.Count
		}
	}
	// The harness's kubelets write nodes/status (NotReady, Ready) and the
	// test itself changed the pool's image; everything else written is the
	// product's.
	product := writes - puts - 1
	fmt.Fprintf(&w, "  writes by the product per node update: %.2f (all writes %.2f, minus the harness's kubelets' %.2f nodes/status PUTs and the pool's image change)\n",
		float64(product)/float64(n), float64(writes)/float64(n), float64(puts)/float64(n))
	fmt.Fprintf(&w, "  harness reads per node update: %.2f GET nodes (kubelets), %.2f LIST pods (the pod-deletion loop, every 50 ms)\n",
		float64(gets)/float64(n), float64(lists)/float64(n))
	fmt.Fprintf(&w, "  coordinator: %.2f CPU s during the rollout (%.2f s since start), peak RSS %.1f MiB, RSS at the end %.1f MiB (%.1f anonymous, %.1f file pages); peak anonymous RSS %.1f MiB (sampled every second)\n",
		(use1.CPU - use0.CPU).Seconds(), use1.CPU.Seconds(), float64(use1.PeakRSS)/(1<<20), float64(use1.RSS)/(1<<20),
		float64(use1.RSSAnon)/(1<<20), float64(use1.RSSFile)/(1<<20), float64(anon)/(1<<20))
	fmt.Fprint(os.Stderr, w.String())
	if v := p.Check(v2, invariant.Pool{MaxUnavailable: m, MaxStaging: n, HaltAfter: 1}); len(v) > 0 {
		b.Fatalf("%d violations, first: %s", len(v), v[0])
	}
	b.ReportMetric(float64(anon)/(1<<20), "coord_peak_anon_MiB")
	b.ReportMetric(t.Makespan().Seconds(), "makespan_s")
	b.ReportMetric(t.Makespan().Seconds()/lb.Seconds(), "makespan/LB")
	b.ReportMetric(float64(product)/float64(n), "writes/node")
	b.ReportMetric((use1.CPU - use0.CPU).Seconds(), "coord_cpu_s")
	b.ReportMetric(float64(use1.PeakRSS)/(1<<20), "coord_peak_MiB")
}

// settled: the pool's slots exist (slots of them), none is held, and every
// node's BootcNode asks for img, which it booted, and its agent reported
// Idle.
func settled(ctx context.Context, f *Fleet, p *Pool, img string, slots int) bool {
	ls, err := f.Kube.CoordinationV1().Leases(lease.Namespace).List(ctx, metav1.ListOptions{LabelSelector: lease.LabelPool + "=" + p.Name})
	if err != nil || len(ls.Items) != slots {
		return false
	}
	for _, l := range ls.Items {
		if l.Labels[lease.LabelHolder] != "" {
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
