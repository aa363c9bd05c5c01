package decide

import "testing"

// BenchmarkDecide is one decision with a staged image and a valid reboot
// grant: the agent's most involved path.
func BenchmarkDecide(b *testing.B) {
	o := withStaged(base(), dep(base().Desired.Image))
	o.Grants = []HeldGrant{rebootGrant(base().Desired.Image)}
	if a := Decide(o); a.Kind != ApplyAndReboot {
		b.Fatalf("benchmark observation decides %v, want ApplyAndReboot", a.Kind)
	}
	b.ReportAllocs()
	for b.Loop() {
		Decide(o)
	}
}
