package fleet

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/bootc-fleet/bootc-fleet/tests/fleet/invariant"
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
		f := Start(b, Options{})
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		opts := PoolOptions{Nodes: n, MaxUnavailable: max(1, n/10), MaxStaging: max(1, n/5), HaltAfter: 1, RebootTimeout: 5 * time.Minute}
		opts.Behaviour = func(int) NodeBehaviour {
			return NodeBehaviour{BootTime: 200 * time.Millisecond, StageTime: 100 * time.Millisecond, StaleAfterReboot: 300 * time.Millisecond}
		}
		p := f.AddPool("scale", opts)
		runtime.GC()
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		v2 := p.Push("v2")
		b.StartTimer()
		start := time.Now()
		p.Create("v2", opts)
		if !waitFor(context.Background(), 30*time.Minute, func() bool { ok, _ := p.Converged(v2); return ok }) {
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
		f.Stop()
	}
}
