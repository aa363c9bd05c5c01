package lease

import (
	"testing"
	"time"
)

// BenchmarkParseAndAllows is the agent's per-iteration cost of reading one
// grant and checking it.
func BenchmarkParseAndAllows(b *testing.B) {
	l := heldLease(KindReboot, PhaseReboot)
	c := Check{Node: nodeA, Action: ActionReboot, Image: img, BootID: boot1, Now: t0.Add(time.Second), LastHeartbeat: t0}
	b.ReportAllocs()
	for b.Loop() {
		g, err := Parse(l)
		if err != nil {
			b.Fatal(err)
		}
		if err := g.Allows(c); err != nil {
			b.Fatal(err)
		}
	}
}
