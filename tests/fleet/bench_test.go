package fleet

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/bootc-fleet/bootc-fleet/internal/agent"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/controller"
	"github.com/bootc-fleet/bootc-fleet/internal/sim"
	"github.com/bootc-fleet/bootc-fleet/internal/sim/invariant"
)

// BenchmarkFleetRollout rolls an image out to FLEET_NODES (default 1000)
// in-process nodes (the real agent code and API client, bootc and host in
// memory) with maxUnavailable 10% and maxStaging 20%, against a real API
// server and the real coordinator. It reports the rollout's wall time,
// nodes updated per minute, and the heap each simulated node costs; the
// invariants are checked on the whole run.
func BenchmarkFleetRollout(b *testing.B) {
	n := 1000
	if v, err := strconv.Atoi(os.Getenv("FLEET_NODES")); err == nil && v > 0 {
		n = v
	}
	for b.Loop() {
		b.StopTimer()
		// Periodic work at production intervals: the chaos tests compress
		// report and lease intervals so expiries happen within a test, which
		// at 1,000 nodes makes the harness, not the product, the load.
		f := Start(b, Options{
			Coordinator: func(o *controller.Options) {
				o.LeaseDuration, o.RequeueInterval = controller.DefaultLeaseDuration, controller.DefaultRequeueInterval
			},
			Agent: func(c *agent.Config) { c.ReportInterval, c.PollInterval = 5*time.Minute, time.Minute },
		})
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		opts := PoolOptions{Nodes: n, MaxUnavailable: max(1, n/10), MaxStaging: max(1, n/5), HaltAfter: 1, RebootTimeout: 5 * time.Minute}
		opts.Behaviour = func(int) NodeBehaviour {
			return NodeBehaviour{BootTime: 200 * time.Millisecond, StageTime: 100 * time.Millisecond, StaleAfterReboot: 300 * time.Millisecond}
		}
		setup := time.Now()
		p := f.AddPool("scale", opts)
		fmt.Fprintf(os.Stderr, "fleet rollout: %d nodes and their agents set up in %s\n", n, time.Since(setup).Round(time.Second))
		runtime.GC()
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		v2 := p.Push("v2")
		reqsBefore, _ := f.APIRequests(context.Background())
		b.StartTimer()
		start := time.Now()
		p.Create("v2", opts)
		stopProgress := progress(p, v2, start, 30*time.Second)
		converged := sim.WaitFor(context.Background(), 30*time.Minute, func() bool { ok, _ := p.Converged(v2); return ok })
		stopProgress()
		if !converged {
			_, waiting := p.Converged(v2)
			b.Fatalf("%d nodes did not converge; waiting for %.200s", n, waiting)
		}
		took := time.Since(start)
		b.StopTimer()
		if v := p.Check(v2, invariant.Pool{MaxUnavailable: opts.MaxUnavailable, MaxStaging: opts.MaxStaging, HaltAfter: 1}); len(v) > 0 {
			b.Fatalf("%d violations, first: %s", len(v), v[0])
		}
		b.ReportMetric(float64(n), "nodes")
		b.ReportMetric(took.Seconds(), "rollout_s")
		b.ReportMetric(float64(n)/took.Minutes(), "nodes/min")
		b.ReportMetric(float64(after.HeapInuse-before.HeapInuse)/float64(n)/1024, "heap_KiB/node")
		fmt.Fprintf(os.Stderr, "fleet rollout: %d nodes in %s\n", n, took.Round(time.Second))
		if rec, conf, err := CoordinatorCounts(); err == nil {
			fmt.Fprintf(os.Stderr, "fleet rollout: %d pool reconciles, %d cut short by a write conflict\n", rec, conf)
		}
		if reqs, err := f.APIRequests(context.Background()); err != nil {
			b.Log(err)
		} else {
			fmt.Fprintf(os.Stderr, "fleet rollout: API requests, setup included: %s\n", FormatRequests(reqs, 10))
			fmt.Fprintf(os.Stderr, "fleet rollout: during the rollout, %s\n", PerNode(Since(reqsBefore, reqs), n))
		}
		f.Stop()
		b.StartTimer() // b.Loop must find the timer running
	}
}

// samplePeak reads pid's usage every interval until the returned function
// is called, which returns the highest value of what it saw.
func samplePeak(pid int, every time.Duration, what func(ProcUsage) int64) (stop func() int64) {
	done := make(chan struct{})
	result := make(chan int64, 1)
	go func() {
		var peak int64
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			if u, err := ReadProcUsage(pid); err == nil {
				peak = max(peak, what(u))
			}
			select {
			case <-done:
				result <- peak
				return
			case <-t.C:
			}
		}
	}()
	return func() int64 { close(done); return <-result }
}

// progress prints, every interval until stopped, how many of the pool's
// machines boot target, so a long run shows its pace as it goes.
func progress(p *Pool, target string, start time.Time, every time.Duration) (stop func()) {
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			on := 0
			for _, n := range p.Nodes {
				if st := n.Machine.State(); st.Booted != nil && st.Booted.Image == target {
					on++
				}
			}
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			fmt.Fprintf(os.Stderr, "fleet rollout: %s: %d/%d nodes booted on the target, heap %d MiB\n",
				time.Since(start).Round(time.Second), on, len(p.Nodes), ms.HeapInuse>>20)
		}
	}()
	return func() { close(done) }
}
