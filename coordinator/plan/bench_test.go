package plan

import (
	"fmt"
	"testing"
)

// BenchmarkPlan is one planning pass over a pool mid-rollout, for pools of
// 100 and 1000 nodes (maxUnavailable 10%, maxStaging 20%).
func BenchmarkPlan(b *testing.B) {
	for _, n := range []int{100, 1000, 5000} {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			w := newWorld(n, n/10, n/5)
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
