package plan

import (
	"fmt"
	"testing"
)

// BenchmarkPlan is one planning pass over a pool mid-rollout, for pools of
// 100 to 5,000 nodes (maxUnavailable 10%, maxStaging 20% or every node, which
// plan.MaxSlots caps at 1,000).
func BenchmarkPlan(b *testing.B) {
	// maxStaging n/5, and n: the shape of BenchmarkRolloutBound (tests/fleet),
	// every node staging at once.
	for _, c := range []struct{ n, maxStaging int }{{100, 20}, {1000, 200}, {5000, 1000}, {1000, 1000}, {5000, 5000}} {
		n := c.n
		b.Run(fmt.Sprintf("nodes=%d/maxStaging=%d", n, c.maxStaging), func(b *testing.B) {
			w := newWorld(n, n/10, c.maxStaging)
			for i := 0; i < 3; i++ { // a few steps in: grants held, drains running
				w.step()
			}
			in := w.input()
			b.ReportAllocs()
			for b.Loop() {
				Plan(in)
			}
		})
	}
}
