package decide

import (
	"errors"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// The rollback (docs/design.md, amendment 25): under a rollback grant, the
// agent runs `bootc rollback`, which queues the rollback deployment for the
// next boot, and reboots into it. The grant's image must be the rollback
// deployment as bootc reports it in this boot: a grant for any other image
// rolls nothing back.

// rollbackGrant returns the rollback grant this node holds, if any (one
// reboot slot per node: at most one).
func rollbackGrant(o Observation) (HeldGrant, bool) {
	for _, g := range o.Grants {
		if g.Kind == lease.KindReboot && g.Rollback && g.Holder == o.Node && !spent(o, g.ID) {
			return g, true
		}
	}
	return HeldGrant{}, false
}

// rollback is the rule for a rollback grant without a record: roll back
// when the grant allows it and names bootc's rollback deployment. A node
// already booted on the grant's image has nothing to roll back (the host
// fell back by itself, or the rollback is done): the other rules apply.
func rollback(o Observation) (Action, bool) {
	g, ok := rollbackGrant(o)
	if !ok || o.Status.Booted.Is(g.Image) {
		return Action{}, false
	}
	img := g.Image
	if !o.Status.Rollback.Is(img) {
		return cancelOr(o, Action{Kind: Nothing, Phase: fleetv1.PhaseDegraded, Reason: fleetv1.ReasonRollbackImageMismatch,
			Message: "rollback grant " + g.ID.String() + " is for " + short(img) + ", but bootc's rollback deployment is " +
				describe(o.Status.Rollback) + "; not rolling back"}), true
	}
	if o.InFlight != nil {
		return cancel(o, "a rollback is granted"), true
	}
	soft := o.Policy == fleetv1.RebootPolicyAllowSoftReboot && o.Status.Rollback.SoftRebootCapable && o.SoftRebootSupported && o.Bootc.SoftReboot
	how := "reboot"
	if soft {
		how = "soft reboot"
	}
	err := g.Allows(check(o, g, lease.ActionRollback, img))
	if err == nil {
		return Action{Kind: Rollback, WriteRecord: true, Phase: fleetv1.PhaseRebooting, Reason: fleetv1.ReasonRollingBack,
			Image: img, Grant: g.ID, Soft: soft, Message: "rolling back to " + short(img) + " (" + how + ") under " + g.ID.String()}, true
	}
	if _, ok := awaitingFirstHeartbeat(o, lease.ActionRollback, img); ok {
		return Action{Kind: Nothing, Phase: fleetv1.PhaseRebooting, Reason: fleetv1.ReasonRollingBack,
			Message: "rolling back to " + short(img) + " (" + how + ") under " + g.ID.String()}, true
	}
	return Action{Kind: Nothing, Phase: fleetv1.PhaseWaiting, Reason: fleetv1.ReasonRollingBack,
		Message: "rollback grant " + g.ID.String() + " for " + short(img) + " does not allow a rollback yet: " + err.Error()}, true
}

// rollbackPending is rule 1 for a rollback recorded in this boot: the
// reboot has not happened yet. Run the sequence again under the same grant
// while it is valid; `bootc rollback` is not run twice (a second one would
// take the queued rollback back), the re-read sees it queued.
func rollbackPending(o Observation) Action {
	r := o.Record
	if _, ok := RollbackIs(o.Status, o.Boot, r.Image); !ok {
		return Action{Kind: ClearRecord, Phase: fleetv1.PhaseDegraded, Reason: fleetv1.ReasonRollbackImageMismatch,
			Message: "rollback to " + short(r.Image) + " recorded, but bootc's rollback deployment is " + describe(o.Status.Rollback) + "; dropped the record, not rebooting"}
	}
	g, err := grantFor(o, r.Grant, lease.ActionRollback, r.Image)
	switch {
	case err == nil:
		if o.RebootIssued {
			return Action{Kind: Nothing, Phase: fleetv1.PhaseRebooting, Reason: fleetv1.ReasonRollingBack,
				Message: "rolling back to " + short(r.Image) + "; waiting for the host to go down"}
		}
		return Action{Kind: Rollback, Phase: fleetv1.PhaseRebooting, Reason: fleetv1.ReasonRollingBack,
			Image: r.Image, Grant: g.ID, Soft: r.Soft,
			Message: "rolling back to " + short(r.Image) + " under " + g.ID.String() + " (recorded in this boot, not yet rebooted)"}
	case errors.Is(err, lease.ErrExpired):
		return Action{Kind: RereadLater, Phase: fleetv1.PhaseRebooting, Reason: fleetv1.ReasonRenewingGrant,
			Message: "rollback to " + short(r.Image) + " recorded; reporting " + r.Grant.String() + " to the API server before rebooting"}
	}
	a := Action{Kind: ClearRecord, Phase: fleetv1.PhaseWaiting, Reason: fleetv1.ReasonWaitingForRebootGrant,
		Message: "rollback grant " + r.Grant.String() + " was revoked before the reboot (" + err.Error() + "); dropped the record"}
	if o.Status.RollbackQueued {
		a.Phase, a.Reason = fleetv1.PhaseDegraded, fleetv1.ReasonRollbackQueuedWithoutGrant
		a.Message = "rollback grant " + r.Grant.String() + " was revoked after `bootc rollback` queued " + short(r.Image) + "; any reboot will boot it"
	}
	return a
}

// RollbackIs is the rule the rollback and its sequence check: a status read
// in boot, without error, shows img as bootc's rollback deployment. It
// returns that deployment as read.
func RollbackIs(st Status, boot BootIdentity, img imageref.Pinned) (*Deployment, bool) {
	if st.Unavailable != "" || !boot.Known() || st.ReadIn != boot || !st.Rollback.Is(img) {
		return nil, false
	}
	return st.Rollback, true
}

// rollbackReread checks a status re-read in the rollback sequence. Before
// `bootc rollback` it leads to the rollback's confirm, or, when bootc
// already queued the rollback (an agent that stopped after it), straight to
// the reboot's confirm; after it, to the reboot's confirm once bootc shows
// the rollback queued.
func (s State) rollbackReread(e Effect, a Action, r Result) (State, []Effect) {
	rb, ok := RollbackIs(r.Status, e.Boot, e.Image)
	if !ok || (e.Step == StepAfterRollback && !r.Status.RollbackQueued) {
		note := "bootc's rollback deployment is not the granted image, queued; not rebooting (" + e.Step + "): rollback " +
			describe(r.Status.Rollback) + ", boot " + r.Status.ReadIn.String()
		if r.Status.Unavailable != "" {
			note += ", status: " + r.Status.Unavailable
		}
		if r.Status.RollbackQueued && !r.Status.Rollback.Is(e.Image) {
			return s.stop(true, note) // leave the record: the next round reports the queued mismatch
		}
		s.Note = note
		return s.await(Effect{Kind: EffectClearRecord, Grant: idOnly(a.Grant), Image: e.Image, Step: e.Step}, a)
	}
	g, held := s.Held(a.Grant)
	if !held {
		return s.stop(true, "grant "+a.Grant.String()+" is no longer held")
	}
	if e.Step == StepBeforeRollback && !r.Status.RollbackQueued {
		return s.await(Effect{Kind: EffectConfirmRollback, Grant: g, Image: e.Image, Boot: e.Boot, Step: StepRollback, Soft: a.Soft}, a)
	}
	soft, why := SoftAfterRollback(a, rb)
	step := StepReboot
	if soft {
		step = StepSoftReboot
	}
	s, effs := s.await(Effect{Kind: EffectConfirmReboot, Grant: g, Image: e.Image, Boot: e.Boot, Step: step, Soft: soft, Why: why}, a)
	s.Pending.Soft, s.Pending.Why = soft, why
	return s, effs
}

// SoftAfterRollback says how to reboot once bootc queued the rollback for
// action a: soft only if a asked for it and bootc still says the rollback
// deployment is soft-reboot capable (`bootc rollback --soft-reboot=auto`
// prepares the soft reboot exactly then: crates/lib/src/cli.rs,
// rollback_ostree, handle_soft_reboot on status.rollback).
func SoftAfterRollback(a Action, rb *Deployment) (soft bool, why string) {
	switch {
	case !a.Soft:
		return false, "a full reboot was decided"
	case rb == nil || !rb.SoftRebootCapable:
		return false, "bootc no longer says the rollback deployment is soft-reboot capable, so it prepared no soft reboot"
	}
	return true, "bootc prepared the soft reboot into the rollback deployment"
}
