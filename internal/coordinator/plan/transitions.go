package plan

// Transition is one phase change the planner makes to a slot: a change
// (its Op and Why) that takes the slot From one phase To another, as the
// Lease it writes reads back (ApplyToLease, then ParseSlot and PhaseOf, a
// stage slot's phase with its holder's report: WithFinished). A change that
// keeps the phase (a cordon, a back-since record while Failed) is listed
// too, From and To equal; OpReport names the phase changes a holder's
// report makes with no write (Staging <-> Finished, amendment 31).
type Transition struct {
	From SlotPhase
	Op   Op
	Why  string
	To   SlotPhase
}

// Transitions are every phase change the handlers of slots.go (and grant,
// trackBack) make, and only those: the package's tests fail on a change
// their world carries out that is not one (the property test among them),
// and on an edge here that no test makes (main_test.go); a test checks the
// state diagram in docs/coordinator.md has exactly these edges.
var Transitions = transitions(
	// grant.go: a free slot goes to the first eligible node.
	edges(PhaseFree, OpGrant, PhaseStaging, WhyEligible),
	edges(PhaseFree, OpGrant, PhaseDraining, WhyEligible),
	// onMalformed.
	edges(PhaseMalformed, OpReset, PhaseFree, WhyMalformed),
	// onStaging, and holderOf for every phase (the holder's Node deleted,
	// or out of the pool).
	edges(PhaseStaging, OpRelease, PhaseFree, WhyStaged, WhyExpired, WhyNodeDeleted),
	edges(PhaseStaging, OpRevoke, PhaseFree, WhyImageChanged, WhyReleasedByAgent, WhyStageTimedOut, WhyLeftPool, WhyQuarantined),
	// The holder's report, not a write, moves a stage grant between
	// Staging and Finished (StageFinished): it staged the image locked,
	// booted it, or rebooted; its staged deployment went in the grant's
	// boot. A finished slot is handed on by a grant (grant.go), released
	// only beyond a shrunk maxStaging (onFinished) or when its holder left
	// (holderOf), as a Staging one.
	edges(PhaseStaging, OpReport, PhaseFinished, WhyStaged, WhyBooted, WhyRebooted),
	edges(PhaseFinished, OpReport, PhaseStaging, WhyStageGone),
	edges(PhaseFinished, OpGrant, PhaseStaging, WhyEligible),
	edges(PhaseFinished, OpRelease, PhaseFree, WhySurplus),
	edges(PhaseFinished, OpRevoke, PhaseFree, WhyLeftPool),
	// onDraining and drain.
	edges(PhaseDraining, OpCordon, PhaseDraining, WhyCordon),
	edges(PhaseDraining, OpAdvance, PhaseRebooting, WhyDrained),
	edges(PhaseDraining, OpRelease, PhaseFree, WhyNodeDeleted),
	edges(PhaseDraining, OpRevoke, PhaseFree, WhyImageChanged, WhyBootChanged, WhyStagedUnverified, WhyLeftPool, WhyQuarantined),
	// The coordinator writes failure and back-since only in phase Reboot;
	// a Draining grant someone else annotated so keeps them through the
	// advance, which the Lease then reads as.
	edges(PhaseDraining, OpAdvance, PhaseFailed, WhyDrained),
	edges(PhaseDraining, OpAdvance, PhaseVerifying, WhyDrained),
	// onRebooting: endReboot, rebootTimer, trackBack.
	edges(PhaseRebooting, OpMarkBack, PhaseVerifying, WhyBackOnImage),
	edges(PhaseRebooting, OpMarkFailed, PhaseFailed, WhyRebootTimeout),
	edges(PhaseRebooting, OpRelease, PhaseFree, WhyVerified, WhyNodeDeleted, WhyRolledBack, WhyRolledBackByHost),
	edges(PhaseRebooting, OpMarkFailed, PhaseFailed, WhyRollbackFailed),
	edges(PhaseRebooting, OpRevoke, PhaseFree, WhyBootChanged, WhyStagedUnverified, WhyLeftPool),
	// onVerifying: a holder that came back and fell over keeps the
	// came-back record (Verifying); a back-since record without it (a grant
	// from before that annotation) goes back to Rebooting, and its timer
	// still runs.
	edges(PhaseVerifying, OpMarkBack, PhaseVerifying, WhyBackOnImage, WhyNotBackAnyMore),
	edges(PhaseVerifying, OpMarkBack, PhaseRebooting, WhyNotBackAnyMore),
	edges(PhaseVerifying, OpMarkFailed, PhaseFailed, WhyRebootTimeout, WhyHealthCheckFailed),
	edges(PhaseVerifying, OpRelease, PhaseFree, WhyVerified, WhyNodeDeleted, WhyRolledBack),
	edges(PhaseVerifying, OpRevoke, PhaseFree, WhyBootChanged, WhyStagedUnverified, WhyLeftPool),
	// onFailed: the failure stays until the slot is freed, but for a
	// failed gate with onFailure Rollback: the slot is re-issued to the
	// node as a rollback grant (gate.go).
	edges(PhaseFailed, OpGrant, PhaseDraining, WhyRollback),
	edges(PhaseFailed, OpMarkBack, PhaseFailed, WhyBackOnImage, WhyNotBackAnyMore),
	edges(PhaseFailed, OpRelease, PhaseFree, WhyVerified, WhyNodeDeleted),
	edges(PhaseFailed, OpRevoke, PhaseFree, WhyBootChanged, WhyStagedUnverified, WhyLeftPool),
)

func edges(from SlotPhase, op Op, to SlotPhase, whys ...string) []Transition {
	out := make([]Transition, 0, len(whys))
	for _, why := range whys {
		out = append(out, Transition{From: from, Op: op, Why: why, To: to})
	}
	return out
}

func transitions(groups ...[]Transition) []Transition {
	var out []Transition
	for _, g := range groups {
		out = append(out, g...)
	}
	return out
}

// Allowed reports whether t is in Transitions.
func (t Transition) Allowed() bool {
	for _, x := range Transitions {
		if x == t {
			return true
		}
	}
	return false
}
