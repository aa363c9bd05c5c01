package plan

import (
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// SlotPhase is where a slot is in its lifecycle: what its holder does under
// it, or that it has none. It is the slot's State refined by its grant
// (kind, the Lease's phase annotation, failure, back-since, came-back), worked
// out in one place (PhaseOf) and read by the planner's handlers (slots.go),
// the BootcNode's rollout state (explain.go) and the kubectl plugin. The
// state diagram in docs/coordinator.md uses these names; transitions.go lists
// its edges.
type SlotPhase string

const (
	// PhaseFree means nobody holds the slot; it may be granted.
	PhaseFree SlotPhase = "Free"
	// PhaseStaging is a stage grant; its holder downloads and stages the image
	// locked (download-only).
	PhaseStaging SlotPhase = fleetv1.RolloutStaging
	// PhaseDraining is a reboot grant in the Lease's phase Draining; the
	// coordinator cordons and drains the holder, no reboot yet.
	PhaseDraining SlotPhase = fleetv1.RolloutDraining
	// PhaseRebooting is a reboot grant in the Lease's phase Reboot; the holder
	// may reboot once, and the slot is released once it is verified back.
	PhaseRebooting SlotPhase = fleetv1.RolloutRebooting
	// PhaseVerifying is a reboot grant in phase Reboot whose holder was found
	// back on the image (back-since, or came-back under this grant): the
	// slot is released once it has stayed back for minReadySeconds.
	PhaseVerifying SlotPhase = fleetv1.RolloutVerifying
	// PhaseFailed is a reboot grant in phase Reboot marked failed (its holder
	// did not come back within rebootTimeout); it stays held.
	PhaseFailed SlotPhase = fleetv1.RolloutFailed
	// PhaseMalformed means the Lease is not a valid grant nor a clean free slot;
	// the coordinator resets it to free.
	PhaseMalformed SlotPhase = "Malformed"
)

// SlotPhases lists every phase, in lifecycle order.
var SlotPhases = []SlotPhase{PhaseFree, PhaseStaging, PhaseDraining, PhaseRebooting, PhaseVerifying, PhaseFailed, PhaseMalformed}

// PhaseOf derives the phase of a parsed slot. A failure or back-since
// record counts only where the coordinator writes it (a reboot grant in
// phase Reboot): a stage grant is Staging and a reboot grant in phase
// Draining is Draining whatever else its Lease carries.
func PhaseOf(s Slot) SlotPhase {
	switch {
	case s.State == SlotFree:
		return PhaseFree
	case s.State != SlotHeld:
		return PhaseMalformed
	case s.Kind == lease.KindStage:
		return PhaseStaging
	case s.Grant.Phase != lease.PhaseReboot:
		return PhaseDraining
	case s.Grant.Failure != "":
		return PhaseFailed
	case !s.BackSince.IsZero() || s.CameBack:
		return PhaseVerifying
	default:
		return PhaseRebooting
	}
}

// withPhase returns s with its Phase derived from the rest of it.
func withPhase(s Slot) Slot {
	s.Phase = PhaseOf(s)
	return s
}

// WithPhases derives the Phase of every slot again (ParseSlot sets it as
// the Lease is read): the planner and the plugin take their slots in
// through it, so a phase given in a hand-built Input is never trusted.
func WithPhases(slots []Slot) []Slot {
	out := make([]Slot, len(slots))
	for i, s := range slots {
		out[i] = withPhase(s)
	}
	return out
}

// afterDrain: a reboot grant in the Lease's phase Reboot (the holder may
// have rebooted), in any of the phases that follow Draining.
func (ph SlotPhase) afterDrain() bool {
	return ph == PhaseRebooting || ph == PhaseVerifying || ph == PhaseFailed
}

// Grant reports whether the phase is a valid grant's (neither free nor malformed).
func (ph SlotPhase) Grant() bool { return ph != PhaseFree && ph != PhaseMalformed }
