package fleet

import (
	"context"
	"fmt"
	"math"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/sim"
	"github.com/bootc-fleet/bootc-fleet/internal/sim/invariant"
)

// boundRun is one run of BenchmarkRolloutBound: its fleet and pool.
type boundRun struct {
	b     *testing.B
	f     *Fleet
	p     *Pool
	n, m  int
	light bool
}

// boundPhase is what one rollout of a run measured.
type boundPhase struct {
	ran                      bool // false: a clock BENCH_CLOCKS left out
	makespan, lb, firstGrant time.Duration
	timing                   Timing
	// Per node update: every request the API server served, the product's
	// writes, and the light agents' own requests (0 with real agents).
	requests, writes, agentReads, agentWrites float64
	coordCPU, selfCPU                         time.Duration
	apiCPU                                    float64 // the API server's CPU seconds
	coordPeakAnon                             int64
}

// phase starts a rollout to target with start, waits until every node
// booted it and every reboot slot is free, prints what it measured under
// name and returns it.
func (r *boundRun) phase(ctx context.Context, name, target string, start func() error) boundPhase {
	b, f, p, n := r.b, r.f, r.p, r.n
	pid := f.CoordinatorPID()
	use0, self0 := usage(b, pid), usage(b, os.Getpid())
	// Read before the requests are, so this read is not one of the run's.
	closed0, err := f.TerminatedWatchers(ctx)
	if err != nil {
		b.Fatal(err)
	}
	reqs0, err := f.APIRequests(ctx)
	if err != nil {
		b.Fatal(err)
	}
	api0, err := f.APIServerCPU(ctx)
	if err != nil {
		b.Fatal(err)
	}
	statusWrites0, lists0 := sim.HarnessRequests()
	reads0, writes0 := LightAgentRequests()
	sctx, stopStatus := context.WithCancel(ctx)
	defer stopStatus()
	status, err := f.WatchStatus(sctx, target)
	if err != nil {
		b.Fatal(err)
	}
	began := time.Now()
	if err := start(); err != nil {
		b.Fatal(err)
	}
	stop := progress(p, target, began, 30*time.Second)
	peakAnon := samplePeak(pid, time.Second, func(u ProcUsage) int64 { return u.RSSAnon })
	done := sim.WaitFor(ctx, 30*time.Minute, func() bool {
		ok, _ := p.Converged(target)
		return ok && rebootSlotsFree(ctx, f, p.Name)
	})
	stop()
	wall := time.Since(began)
	if !done {
		_, waiting := p.Converged(target)
		b.Fatalf("%s: %d nodes did not converge; waiting for %.300s", name, n, waiting)
	}
	use1, self1 := usage(b, pid), usage(b, os.Getpid())
	reqs1, err := f.APIRequests(ctx)
	if err != nil {
		b.Fatal(err)
	}
	api1, err := f.APIServerCPU(ctx)
	if err != nil {
		b.Fatal(err)
	}
	closed1, err := f.TerminatedWatchers(ctx)
	if err != nil {
		b.Fatal(err)
	}
	statusWrites1, lists1 := sim.HarnessRequests()
	reads1, writes1 := LightAgentRequests()
	statusWrites, lists := statusWrites1-statusWrites0, lists1-lists0
	t := ExtractTiming(eventsSince(p.Events(), began), p.Name, began)
	ph := boundPhase{ran: true,
		makespan: t.Makespan(), lb: LowerBound(boundStage, boundReboot, n, r.m), firstGrant: t.FirstGrant.Sub(began), timing: t,
		agentReads: float64(reads1-reads0) / float64(n), agentWrites: float64(writes1-writes0) / float64(n),
		coordCPU: use1.CPU - use0.CPU, selfCPU: self1.CPU - self0.CPU, coordPeakAnon: max(peakAnon(), use1.RSSAnon),
		apiCPU: api1 - api0,
	}
	delta := Since(reqs0, reqs1)
	all, writes := int64(0), int64(0)
	for _, c := range delta {
		all += c.Count
		switch strings.SplitN(c.What, " ", 2)[0] {
		case "POST", "PUT", "PATCH", "DELETE", "APPLY":
			writes += c.Count
		}
	}
	// The harness's kubelets patch nodes/status (NotReady, Ready) and the
	// test itself created the pool or changed its image; everything else
	// written is the product's (the light agents standing in for agents).
	product := writes - statusWrites - 1
	ph.requests, ph.writes = float64(all)/float64(n), float64(product)/float64(n)

	kind := "real agents (in-process)"
	if r.light {
		kind = "light agents"
	}
	var w strings.Builder
	fmt.Fprintf(&w, "rollout bound %s: N=%d M=%d S=%s R=%s, %s, coordinator binary at production defaults\n", name, n, r.m, boundStage, boundReboot, kind)
	fmt.Fprintf(&w, "  makespan %s, LB %s, makespan/LB %.3f (waited %s until every slot was seen free)\n",
		ms(ph.makespan), ph.lb, ph.makespan.Seconds()/ph.lb.Seconds(), ms(wall))
	w.WriteString(status.Report(began, "desired", string(fleetv1.PhaseWaiting), string(fleetv1.PhaseStaging), string(fleetv1.PhaseStaged)))
	w.WriteString(strings.Replace(t.Report(12), "image change→", "start→", 1))
	oh := t.Overhead(boundReboot)
	fmt.Fprintf(&w, "  per-wave overhead (slot cycle less R) median %s p95 %s (n=%d)\n", ms(Quantile(oh, 0.5)), ms(Quantile(oh, 0.95)), len(oh))
	w.WriteString(t.LastSlotReport(boundReboot))
	fmt.Fprintf(&w, "  API requests per node update (API server metrics, everything): %s\n", PerNode(delta, n))
	for res, n := range closed1 {
		if d := n - closed0[res]; d > 0 {
			fmt.Fprintf(&w, "  watches of %s the API server closed as unresponsive: %.0f\n", res, d)
		}
	}
	fmt.Fprintf(&w, "  writes by the product per node update: %.2f (all writes %.2f, minus the harness's kubelets' %.2f nodes/status PATCHes and the pool's creation or image change)\n",
		ph.writes, float64(writes)/float64(n), float64(statusWrites)/float64(n))
	if r.light {
		fmt.Fprintf(&w, "  light agents' own requests per node update (counted as they leave): %.2f reads, %.2f writes\n", ph.agentReads, ph.agentWrites)
	}
	fmt.Fprintf(&w, "  harness reads per node update: %.2f LIST pods (the kubelets' pod watch; a kubelet reads its Node from its own cache)\n",
		float64(lists)/float64(n))
	fmt.Fprintf(&w, "  coordinator: %.2f CPU s during the rollout (%.2f s since start), peak RSS %.1f MiB, RSS at the end %.1f MiB (%.1f anonymous, %.1f file pages); peak anonymous RSS %.1f MiB (sampled every second)\n",
		ph.coordCPU.Seconds(), use1.CPU.Seconds(), mib(use1.PeakRSS), mib(use1.RSS), mib(use1.RSSAnon), mib(use1.RSSFile), mib(ph.coordPeakAnon))
	fmt.Fprintf(&w, "  API server: %.2f CPU s during the rollout, %.1f ms per node update\n", ph.apiCPU, 1000*ph.apiCPU/float64(n))
	fmt.Fprintf(&w, "  test process (%s, simulated kubelets and machines, recorder, registry): %.2f CPU s during the rollout, peak RSS %.1f MiB\n",
		kind, ph.selfCPU.Seconds(), mib(self1.PeakRSS))
	fmt.Fprint(os.Stderr, w.String())
	return ph
}

// figures is the run's row of its table.
func (r *boundRun) figures(created, changed boundPhase) []boundFigure {
	coord, self := usage(r.b, r.f.CoordinatorPID()), usage(r.b, os.Getpid())
	out := []boundFigure{
		{"makespan/LB from the pool's creation", created.makespan.Seconds() / created.lb.Seconds(), "%.3f"},
		{"makespan/LB from the image change", changed.makespan.Seconds() / changed.lb.Seconds(), "%.3f"},
		{"makespan s from the pool's creation", created.makespan.Seconds(), "%.2f"},
		{"makespan s from the image change", changed.makespan.Seconds(), "%.2f"},
		{"LB s", LowerBound(boundStage, boundReboot, r.n, r.m).Seconds(), "%.2f"},
		{"creation→first reboot grant s", created.firstGrant.Seconds(), "%.2f"},
		{"image change→first reboot grant s", changed.firstGrant.Seconds(), "%.2f"},
	}
	for _, ph := range []struct {
		clock string
		p     boundPhase
	}{{"creation", created}, {"image change", changed}} {
		oh := ph.p.timing.Overhead(boundReboot)
		out = append(out,
			boundFigure{"per-wave overhead median ms (" + ph.clock + ")", msf(Quantile(oh, 0.5)), "%.0f"},
			boundFigure{"per-wave overhead p95 ms (" + ph.clock + ")", msf(Quantile(oh, 0.95)), "%.0f"})
	}
	hops := changed
	if !changed.ran {
		hops = created
	}
	for _, h := range HopOrder {
		ds := hops.timing.Hops[h]
		out = append(out, boundFigure{"  " + h + " median ms", msf(Quantile(ds, 0.5)), "%.0f"},
			boundFigure{"  " + h + " p95 ms", msf(Quantile(ds, 0.95)), "%.0f"})
	}
	for _, ph := range []struct {
		clock string
		p     boundPhase
	}{{"creation", created}, {"image change", changed}} {
		out = append(out,
			boundFigure{"requests per node update (" + ph.clock + ")", ph.p.requests, "%.2f"},
			boundFigure{"product writes per node update (" + ph.clock + ")", ph.p.writes, "%.2f"},
			boundFigure{"coordinator CPU s (" + ph.clock + ")", ph.p.coordCPU.Seconds(), "%.2f"},
			boundFigure{"API server CPU s (" + ph.clock + ")", ph.p.apiCPU, "%.2f"},
			boundFigure{"test process CPU s (" + ph.clock + ")", ph.p.selfCPU.Seconds(), "%.2f"})
		if r.light {
			out = append(out,
				boundFigure{"light agents' requests per node update (" + ph.clock + ")", ph.p.agentReads + ph.p.agentWrites, "%.2f"},
				boundFigure{"light agents' writes per node update (" + ph.clock + ")", ph.p.agentWrites, "%.2f"})
		}
	}
	for i := range out {
		if (!created.ran && strings.Contains(out[i].name, "creation")) || (!changed.ran && strings.Contains(out[i].name, "change")) {
			out[i].value = math.NaN()
		}
	}
	return append(out,
		boundFigure{"coordinator peak RSS MiB (whole run)", mib(coord.PeakRSS), "%.1f"},
		boundFigure{"coordinator peak anonymous RSS MiB (rollouts)", mib(max(created.coordPeakAnon, changed.coordPeakAnon)), "%.1f"},
		boundFigure{"test process peak RSS MiB (whole run)", mib(self.PeakRSS), "%.1f"})
}

// boundFigure is one figure of a run.
type boundFigure struct {
	name   string
	value  float64
	format string
}

// text renders v as f's figures are, "-" for none.
func (f boundFigure) text(v float64) string {
	if math.IsNaN(v) {
		return "-"
	}
	return fmt.Sprintf(f.format, v)
}

// boundTable collects the runs of one size and kind of agents.
type boundTable struct{ runs [][]boundFigure }

func (t *boundTable) add(run []boundFigure) { t.runs = append(t.runs, run) }

// median is the median of figure i over the runs.
func (t *boundTable) median(i int) float64 {
	vs := make([]float64, 0, len(t.runs))
	for _, r := range t.runs {
		if !math.IsNaN(r[i].value) {
			vs = append(vs, r[i].value)
		}
	}
	if len(vs) == 0 {
		return math.NaN()
	}
	sort.Float64s(vs)
	if len(vs)%2 == 1 {
		return vs[len(vs)/2]
	}
	return (vs[len(vs)/2-1] + vs[len(vs)/2]) / 2
}

// String renders the table: one row per figure, one column per run, then
// their median.
func (t *boundTable) String(title string) string {
	if len(t.runs) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "rollout bound table: %s, %d run(s)\n", title, len(t.runs))
	fmt.Fprintf(&b, "  %-58s", "figure")
	for i := range t.runs {
		fmt.Fprintf(&b, " %9s", fmt.Sprintf("run %d", i+1))
	}
	fmt.Fprintf(&b, " %9s\n", "median")
	for i, f := range t.runs[0] {
		fmt.Fprintf(&b, "  %-58s", f.name)
		for _, r := range t.runs {
			fmt.Fprintf(&b, " %9s", r[i].text(r[i].value))
		}
		fmt.Fprintf(&b, " %9s\n", f.text(t.median(i)))
	}
	return b.String()
}

// report gives the benchmark the medians of its headline figures.
func (t *boundTable) report(b *testing.B) {
	units := map[string]string{
		"makespan/LB from the pool's creation":                  "makespan/LB_created",
		"makespan/LB from the image change":                     "makespan/LB",
		"makespan s from the image change":                      "makespan_s",
		"requests per node update (image change)":               "requests/node",
		"product writes per node update (image change)":         "writes/node",
		"coordinator CPU s (image change)":                      "coord_cpu_s",
		"API server CPU s (image change)":                       "apiserver_cpu_s",
		"coordinator peak RSS MiB (whole run)":                  "coord_peak_MiB",
		"coordinator peak anonymous RSS MiB (rollouts)":         "coord_peak_anon_MiB",
		"light agents' requests per node update (image change)": "agent_requests/node",
	}
	if len(t.runs) == 0 {
		return
	}
	for i, f := range t.runs[0] {
		if u, ok := units[f.name]; ok && !math.IsNaN(t.median(i)) {
			b.ReportMetric(t.median(i), u)
		}
	}
}

// eventsSince is the events at or after t.
func eventsSince(events []invariant.Event, t time.Time) []invariant.Event {
	var out []invariant.Event
	for _, e := range events {
		if !e.At.Before(t) {
			out = append(out, e)
		}
	}
	return out
}

func usage(b *testing.B, pid int) ProcUsage {
	u, err := ReadProcUsage(pid)
	if err != nil {
		b.Fatal(err)
	}
	return u
}

func mib(bytes int64) float64     { return float64(bytes) / (1 << 20) }
func msf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
