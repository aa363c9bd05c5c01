package plan

import (
	"testing"
	"time"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
)

func TestPhaseOf(t *testing.T) {
	back := t0.Add(time.Minute)
	held := func(k lease.Kind, ph lease.Phase, failure string) Slot {
		return Slot{Kind: k, State: SlotHeld, Holder: "n", Grant: lease.Grant{Kind: k, Holder: "n", Phase: ph, Failure: failure}}
	}
	with := func(s Slot, f func(*Slot)) Slot { f(&s); return s }
	for _, c := range []struct {
		name string
		slot Slot
		want SlotPhase
	}{
		{"a free slot is Free", Slot{Kind: lease.KindReboot, State: SlotFree}, PhaseFree},
		{"a free slot with a release record is Free", Slot{Kind: lease.KindReboot, State: SlotFree, ReleasedAt: back}, PhaseFree},
		{"a malformed slot is Malformed, held or not", Slot{Kind: lease.KindStage, State: SlotMalformed, Holder: "n"}, PhaseMalformed},
		{"a stage grant is Staging", held(lease.KindStage, "", ""), PhaseStaging},
		{"a stage grant is Staging whatever else its Lease carries", with(held(lease.KindStage, "", "RebootTimeout"), func(s *Slot) { s.BackSince, s.CameBack = back, true }), PhaseStaging},
		{"a reboot grant in phase Draining is Draining", held(lease.KindReboot, lease.PhaseDraining, ""), PhaseDraining},
		{"a failure on a Draining grant does not make it Failed", held(lease.KindReboot, lease.PhaseDraining, "RebootTimeout"), PhaseDraining},
		{"a back-since on a Draining grant does not make it Verifying", with(held(lease.KindReboot, lease.PhaseDraining, ""), func(s *Slot) { s.BackSince = back }), PhaseDraining},
		{"a reboot grant in phase Reboot is Rebooting", held(lease.KindReboot, lease.PhaseReboot, ""), PhaseRebooting},
		{"found back: Verifying", with(held(lease.KindReboot, lease.PhaseReboot, ""), func(s *Slot) { s.BackSince, s.CameBack = back, true }), PhaseVerifying},
		{"came back and fell over since: still Verifying", with(held(lease.KindReboot, lease.PhaseReboot, ""), func(s *Slot) { s.CameBack = true }), PhaseVerifying},
		{"back-since without came-back (an older grant): Verifying", with(held(lease.KindReboot, lease.PhaseReboot, ""), func(s *Slot) { s.BackSince = back }), PhaseVerifying},
		{"marked failed: Failed", held(lease.KindReboot, lease.PhaseReboot, "RebootTimeout"), PhaseFailed},
		{"marked failed and back since: Failed until released", with(held(lease.KindReboot, lease.PhaseReboot, "RebootTimeout"), func(s *Slot) { s.BackSince, s.CameBack = back, true }), PhaseFailed},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := PhaseOf(c.slot); got != c.want {
				t.Fatalf("PhaseOf(%+v) = %s, want %s", c.slot, got, c.want)
			}
		})
	}
}

// TestPlanDerivesThePhase: the planner never trusts a phase it is given.
func TestPlanDerivesThePhase(t *testing.T) {
	s := Slot{Name: "x", Kind: lease.KindReboot, State: SlotFree, Phase: PhaseFailed}
	if got := WithPhases([]Slot{s})[0].Phase; got != PhaseFree {
		t.Fatalf("WithPhases kept %s for a free slot", got)
	}
}
