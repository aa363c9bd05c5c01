package plan

import (
	"math"

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
	// PhaseFinished is a stage grant its holder is done with (StageFinished:
	// it staged the image, booted it, or rebooted since the grant): nobody
	// works under it. It is released lazily (amendment 31): it does not
	// count against maxStaging, no heartbeat keeps it, and the next stage
	// grant hands it on in one write; with nobody waiting it stays held.
	PhaseFinished SlotPhase = "Finished"
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
var SlotPhases = []SlotPhase{PhaseFree, PhaseStaging, PhaseFinished, PhaseDraining, PhaseRebooting, PhaseVerifying, PhaseFailed, PhaseMalformed}

// PhaseOf derives the phase of a parsed slot. A failure or back-since
// record counts only where the coordinator writes it (a reboot grant in
// phase Reboot): a stage grant is Staging, or Finished when its holder's
// report says so (Slot.Finished, WithFinished), and a reboot grant in phase
// Draining is Draining whatever else its Lease carries.
func PhaseOf(s Slot) SlotPhase {
	switch {
	case s.State == SlotFree:
		return PhaseFree
	case s.State != SlotHeld:
		return PhaseMalformed
	case s.Kind == lease.KindStage && s.Finished:
		return PhaseFinished
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
// the Lease is read), Finished left as given: the plugin takes its slots in
// through WithFinished, the planner through its own holders' reports, so a
// phase given in a hand-built Input is never trusted.
func WithPhases(slots []Slot) []Slot {
	out := make([]Slot, len(slots))
	for i, s := range slots {
		out[i] = withPhase(s)
	}
	return out
}

// WithFinished derives the Phase of every slot from its Lease and, for a
// stage grant, from its holder's report: holder returns the holder's Node
// and its agent's status as read in the Node's current boot (nil when the
// report is of another boot or absent), ok false when the Node does not
// exist. requireSigned is the pool's spec.requireSignedImages.
func WithFinished(slots []Slot, holder func(name string) (n Node, st *fleetv1.BootcNodeStatus, ok bool), requireSigned bool) []Slot {
	out := make([]Slot, len(slots))
	for i, s := range slots {
		s.Finished = false
		if s.State == SlotHeld && s.Kind == lease.KindStage {
			if n, st, ok := holder(s.Grant.Holder); ok {
				s.Finished = StageFinished(s.Grant, n, st, requireSigned)
			}
		}
		out[i] = withPhase(s)
	}
	return out
}

// StageFinished reports whether the holder of stage grant g is done with it,
// from its Node n and its agent's report st read in n's current boot (nil:
// none): n is in another boot than the grant's (the kubelet's boot ID, or
// the agent's soft-reboot count), where the grant is void for its agent
// (I5); or st shows the grant's image booted; or st, in the grant's boot,
// shows it staged and locked (download-only), verified when requireSigned,
// and its phase is no longer Staging.
// The agent lists no such grant and never stages under it while it stays
// so (decide.StageFinished); its slot is handed on lazily (amendment 31).
func StageFinished(g lease.Grant, n Node, st *fleetv1.BootcNodeStatus, requireSigned bool) bool {
	if g.Kind != lease.KindStage || g.Holder != n.Name {
		return false
	}
	if n.BootID != g.BootID || (st != nil && softCount(st) != g.SoftRebootCount) {
		return true
	}
	if st == nil {
		return false
	}
	if onDigest(st.Booted, g.Image.Digest) {
		return true
	}
	// Staged and locked, and the agent no longer reports Staging (bootc can
	// show the stage before its process returns; the agent reports Staging
	// until it does).
	return onDigest(st.Staged, g.Image.Digest) && st.Staged.DownloadOnly && (!requireSigned || st.Staged.Verified()) && st.Phase != fleetv1.PhaseStaging
}

// afterDrain: a reboot grant in the Lease's phase Reboot (the holder may
// have rebooted), in any of the phases that follow Draining.
func (ph SlotPhase) afterDrain() bool {
	return ph == PhaseRebooting || ph == PhaseVerifying || ph == PhaseFailed
}

// Grant reports whether the phase is a valid grant's (neither free nor malformed).
func (ph SlotPhase) Grant() bool { return ph != PhaseFree && ph != PhaseMalformed }

// InputSlots are in's slots with their phases as the planner finds them, a
// stage slot's from its holder's report in in (WithFinished): for the
// controller's metrics, which must not count a finished slot as held.
func InputSlots(in Input) []Slot {
	nodes := make(map[string]Node, len(in.Nodes))
	for _, n := range in.Nodes {
		nodes[n.Name] = n
	}
	bns := make(map[string]*fleetv1.BootcNode, len(in.BootcNodes))
	for i := range in.BootcNodes {
		bns[in.BootcNodes[i].Name] = &in.BootcNodes[i]
	}
	return WithFinished(in.Slots, func(name string) (Node, *fleetv1.BootcNodeStatus, bool) {
		n, ok := nodes[name]
		if !ok {
			return Node{}, nil, false
		}
		bn := bns[name]
		if bn == nil || in.Pool == nil || bn.Spec.Pool != in.Pool.Name || !lease.ValidBootID(n.BootID) || bn.Status.BootID != n.BootID ||
			bn.Status.SoftRebootCount < 0 || bn.Status.SoftRebootCount > math.MaxUint32 {
			return n, nil, true
		}
		return n, &bn.Status, true
	}, in.Pool != nil && in.Pool.Spec.RequireSignedImages)
}
