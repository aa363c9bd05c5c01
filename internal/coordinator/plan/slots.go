package plan

import (
	"fmt"
	"time"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	"github.com/bootc-fleet/bootc-fleet/api/text"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// Held slots: what happens to each slot in this pass, one handler per
// phase (phase.go). transitions.go lists every phase change they make.

// heldSlot is a held slot with what its handlers ask of its holder, found
// once.
type heldSlot struct {
	Slot
	// n is the holder's Node, in the pool; st its agent's fresh status (nil
	// when not read in the Node's current boot).
	n  Node
	st *fleetv1.BootcNodeStatus
	// uncordon: the cordon is ours (a reboot grant), so a release or revoke
	// lifts it.
	uncordon bool
}

// held decides what happens to one slot as it is now: the handler of its
// phase, once the cases every grant shares (holder deleted, left the pool)
// are settled.
func (p *planner) held(s Slot) {
	switch s.Phase {
	case PhaseFree:
		return
	case PhaseMalformed:
		p.onMalformed(s)
		return
	}
	h, ok := p.holderOf(s)
	if !ok {
		return
	}
	switch s.Phase {
	case PhaseStaging:
		p.onStaging(h)
	case PhaseFinished:
		p.onFinished(h)
	case PhaseDraining:
		p.onDraining(h)
	case PhaseRebooting:
		p.onRebooting(h)
	case PhaseVerifying:
		p.onVerifying(h)
	case PhaseFailed:
		p.onFailed(h)
	}
}

// onMalformed rewrites a malformed slot as free (Malformed -> Free).
func (p *planner) onMalformed(s Slot) {
	p.event("Warning", fleetv1.EventSlotMalformed, "slot Lease %s/%s was not a valid grant (%s); reset it to free", lease.Namespace, s.Name, s.Problem)
	p.change(s, SlotChange{Op: OpReset, Why: WhyMalformed})
	if s.Kind == lease.KindReboot && s.Holder != "" {
		p.out.StopDrains = append(p.out.StopDrains, s.Holder)
	}
}

// holderOf records a held slot's failure and settles the cases of every
// phase: the holder's Node deleted, or out of the pool. ok is false when
// that settled the slot.
func (p *planner) holderOf(s Slot) (h heldSlot, ok bool) {
	g := s.Grant
	n, exists := p.nodes[g.Holder]
	reboot := s.Kind == lease.KindReboot
	// Ours when the grant records it: the controller writes the record
	// right after its own cordon call. The Node's cordoned-for mark counts
	// only while that answer is pending (we stopped between the call and
	// the record): the grant was written before the call, the mark names
	// this very grant, and once the call's answer is recorded no mark
	// counts, so a copied mark never outweighs a record (amendments 21, 23).
	uncordon := reboot && exists && cordonIsOurs(s, n)
	if g.Failure != "" {
		p.failedSlot[g.Holder] = g.Failure
	}
	switch {
	case !exists && s.Phase.afterDrain() && p.in.Now.Before(rebootSince(s).Add(p.b.RebootTimeout)):
		// The Node object is gone, but the machine may be down in its
		// reboot and come back under the same name: the slot stays held
		// until it is back (then it is verified as usual) or rebootTimeout
		// passed, so deleting a Node cannot let two nodes be down at once.
		p.requeueAt(rebootSince(s).Add(p.b.RebootTimeout))
		p.goneHolders = append(p.goneHolders, g.Holder)
		return heldSlot{}, false
	case !exists:
		p.stopDrain(s)
		p.change(s, SlotChange{Op: OpRelease, Why: WhyNodeDeleted})
		p.nodeEvent(g.Holder, "Normal", fleetv1.EventGrantReleased, "released %s slot %s: node %s was deleted%s", s.Kind, s.Name, g.Holder, goneFor(s.Phase.afterDrain(), p.b.RebootTimeout))
		delete(p.failedSlot, g.Holder)
		return heldSlot{}, false
	case !n.InPool:
		p.stopDrain(s)
		p.change(s, SlotChange{Op: OpRevoke, Why: WhyLeftPool, Uncordon: uncordon})
		p.nodeEvent(g.Holder, "Normal", fleetv1.EventGrantRevoked, "revoked %s slot %s: node %s left the pool%s", s.Kind, s.Name, g.Holder, restored(uncordon))
		delete(p.failedSlot, g.Holder)
		return heldSlot{}, false
	}
	return heldSlot{Slot: s, n: n, st: p.fresh(n), uncordon: uncordon}, true
}

// stopDrain stops the drain of a reboot slot's holder.
func (p *planner) stopDrain(s Slot) {
	if s.Kind == lease.KindReboot {
		p.out.StopDrains = append(p.out.StopDrains, s.Grant.Holder)
	}
}

// onRebooting: a reboot grant in phase Reboot, its holder not found back yet.
// Released once verified back; otherwise marked failed at rebootTimeout.
// renewTime is when the coordinator advanced the grant to Reboot; no agent
// writes a Lease, so nothing a node does extends it. The timer runs from
// when this coordinator first saw that, on its own clock (rebootSince).
func (p *planner) onRebooting(h heldSlot) {
	if p.endReboot(h) {
		return
	}
	p.rebootTimer(h)
}

// onVerifying: the holder was found back under this grant. Released once back
// for minReadySeconds. It came back, so the reboot is done: a blip since
// restarts only the minReadySeconds clock (trackBack), and rebootTimeout no
// longer judges it (amendment 21); only a back-since record without the
// came-back one (a grant from before that annotation) keeps the timer.
func (p *planner) onVerifying(h heldSlot) {
	if p.endReboot(h) {
		return
	}
	// A gated holder that came back and fell over keeps its gate's clock.
	if p.gated(h.Grant) && (h.CameBack || !h.BackSince.IsZero()) {
		p.gateTimer(h)
		return
	}
	if h.CameBack {
		return
	}
	p.rebootTimer(h)
}

// onFailed: the holder did not come back within rebootTimeout. The slot stays
// held (the node really is unavailable) until it is back, verified, or the
// grant is revoked; no timer runs any more.
//
// A grant failed by its health gate is re-issued as a rollback grant with
// onFailure Rollback (afterGateFailure); a failed rollback grant stays held:
// nothing reboots its node again (amendment 25).
func (p *planner) onFailed(h heldSlot) {
	switch {
	case h.Grant.Rollback:
	case healthFailure(h.Grant.Failure):
		p.afterGateFailure(h)
	default:
		p.endReboot(h)
	}
}

// rebootTimer marks the grant failed once rebootTimeout passed since phase
// Reboot (Rebooting -> Failed), or asks to be woken then.
func (p *planner) rebootTimer(h heldSlot) {
	n, g := h.n, h.Grant
	deadline := rebootSince(h.Slot).Add(p.b.RebootTimeout)
	if p.in.Now.Before(deadline) {
		p.requeueAt(deadline)
		return
	}
	if g.Rollback {
		p.rollbackFailed(h, fmt.Sprintf("not back Ready on it in a new boot within rebootTimeout (%s): %s", p.b.RebootTimeout, p.whyNotBack(n, h.st, g)))
		return
	}
	p.change(h.Slot, SlotChange{Op: OpMarkFailed, Failure: fleetv1.ReasonRebootTimeout, Why: WhyRebootTimeout})
	p.failedSlot[g.Holder] = fleetv1.ReasonRebootTimeout
	p.nodeEvent(n.Name, "Warning", fleetv1.EventRebootTimeout, "node %s did not come back Ready on %s in a new boot within %s (%s); slot %s stays held: repair the node (the slot is released once it is back on the image), delete the Node if it is gone, or uncordon it and delete the Lease",
		n.Name, g.Image, p.b.RebootTimeout, p.whyNotBack(n, h.st, g), h.Name)
}

// endReboot settles a reboot grant in phase Reboot that ends in this pass,
// in any of its phases: keeps the back-since record, releases the slot of a
// holder verified back for minReadySeconds, and revokes a grant its agent
// provably did not and will not use. done is false when the grant goes on.
func (p *planner) endReboot(h heldSlot) (done bool) {
	s, n, st, g := h.Slot, h.n, h.st, h.Grant
	back, soft := p.verifiedBack(n, st, g)
	p.trackBack(s, n, back)
	switch {
	case back && p.gated(g) && !p.gatePassed(s):
		// Back, its gate not passed yet (amendment 24); a grant failed
		// already (rebootTimeout) waits for it without a timer.
		if g.Failure == "" {
			p.gateTimer(h)
		}
	case back && !p.readyLongEnough(s):
		// Back, but not for minReadySeconds yet (pacing.go).
	case back:
		p.releaseVerified(h, soft)
	case s.Phase == PhaseRebooting && backOnOther(n, st, g) && !unusedInEarlierBoot(n, st, g):
		if g.Rollback {
			p.rollbackFailed(h, "it came back on "+st.Booted.Digest)
		} else {
			p.rolledBackByHost(h)
		}
	case unusedInEarlierBoot(n, st, g):
		// The node went down some other way (power loss, a person)
		// before its agent used the grant, and is back: no reboot into
		// the image will come under it, and the locked stage is gone.
		// Up and Ready, it holds no budget; it is staged again.
		p.change(s, SlotChange{Op: OpRevoke, Why: WhyBootChanged, Uncordon: h.uncordon})
		p.nodeEvent(n.Name, "Warning", fleetv1.EventGrantRevoked, "revoked reboot slot %s: node %s came back in another boot (%s) without its agent having used the grant (%s); it will be staged and granted again%s",
			s.Name, n.Name, bootChange(n, st, g), fleetv1.ReasonRebootGrantUnused, restored(h.uncordon))
		delete(p.failedSlot, g.Holder)
	case p.unverifiedAndUnused(n, st, g):
		// requireSignedImages was turned on after the stage, and the
		// agent proves it will not use this grant (amendment 21): it
		// waits for a stage grant the coordinator gives no slot holder.
		// Revoke it, so the node is staged again, verified, and granted
		// again, instead of timing out as a reboot that never came back.
		p.change(s, SlotChange{Op: OpRevoke, Why: WhyStagedUnverified, Uncordon: h.uncordon})
		p.nodeEvent(n.Name, "Warning", fleetv1.EventStagedNotVerified, "revoked reboot slot %s of node %s in phase Reboot: its staged %s was not verified by the container signature policy (signature %q) and the pool now requires signed images; its agent reports, acting on that spec, that it waits with the stage locked and never rebooted under the grant, so it will be staged again with enforcement and granted again%s",
			s.Name, n.Name, g.Image, orUnknown(string(st.Staged.Signature)), restored(h.uncordon))
		delete(p.failedSlot, g.Holder)
	default:
		return false
	}
	return true
}

// releaseVerified releases the reboot slot of a holder verified back on its
// image, for minReadySeconds (-> Free, Verified).
func (p *planner) releaseVerified(h heldSlot, soft bool) {
	s, n, g := h.Slot, h.n, h.Grant
	how := "in a new boot"
	if soft {
		how = fmt.Sprintf("after a soft reboot (boot ID unchanged, soft-reboot count %d, granted at %d)", softCount(h.st), g.SoftRebootCount)
	}
	if g.Rollback {
		p.change(s, SlotChange{Op: OpRelease, Why: WhyRolledBack, Uncordon: h.uncordon})
		p.nodeEvent(n.Name, "Normal", fleetv1.EventRolledBack, "node %s is Ready, rolled back to %s %s; released reboot slot %s%s", n.Name, g.Image, how, s.Name, restored(h.uncordon))
		delete(p.failedSlot, g.Holder)
		return
	}
	p.change(s, SlotChange{Op: OpRelease, Why: WhyVerified, Uncordon: h.uncordon})
	p.nodeEvent(n.Name, "Normal", fleetv1.EventNodeUpdated, "node %s is Ready, booted on %s %s; released reboot slot %s%s", n.Name, g.Image, how, s.Name, restored(h.uncordon))
	if !h.uncordon && n.Unschedulable && n.CordonedFor == lease.CordonMark(g.ID) {
		p.nodeEvent(n.Name, "Warning", fleetv1.EventCordonLeft, "node %s stays cordoned: it carries the mark %s=%s of slot %s, but the grant does not record that the coordinator's own cordon call made the cordon (the coordinator stopped between the two, or someone else wrote the mark); uncordon it if nobody else cordoned it",
			n.Name, lease.NodeAnnotationCordonedFor, n.CordonedFor, s.Name)
	}
	delete(p.failedSlot, g.Holder)
}

// onDraining: a reboot grant before its reboot. Revoked when it is no longer
// wanted (its image is no longer the target, the node rebooted outside it,
// its stage is not verified as now required); otherwise the node is
// cordoned, drained, and the grant advanced to phase Reboot.
func (p *planner) onDraining(h heldSlot) {
	s, n, st, g := h.Slot, h.n, h.st, h.Grant
	revoke := func(why string) {
		p.stopDrain(s)
		p.change(s, SlotChange{Op: OpRevoke, Why: why, Uncordon: h.uncordon})
	}
	switch {
	case g.Rollback && (n.BootID != g.BootID || (st != nil && softCount(st) != g.SoftRebootCount)):
		revoke(WhyBootChanged)
		p.nodeEvent(n.Name, "Warning", fleetv1.EventGrantRevoked, "revoked rollback grant %s: node %s rebooted outside it (%s)%s", s.Name, n.Name, bootChange(n, st, g), restored(h.uncordon))
	case g.Rollback:
		p.drain(h)
	case p.quarantined():
		revoke(WhyQuarantined)
		p.nodeEvent(n.Name, "Normal", fleetv1.EventGrantRevoked, "revoked reboot slot %s of node %s before its reboot: %s is quarantined%s", s.Name, n.Name, g.Image, restored(h.uncordon))
	case p.target.Digest != "" && !p.isTarget(n.Name, g.Image):
		revoke(WhyImageChanged)
		p.nodeEvent(n.Name, "Normal", fleetv1.EventGrantRevoked, "revoked reboot slot %s of node %s before its reboot: %s%s", s.Name, n.Name, p.changedTarget(n.Name), restored(h.uncordon))
	case n.BootID != g.BootID || (st != nil && softCount(st) != g.SoftRebootCount):
		revoke(WhyBootChanged)
		p.nodeEvent(n.Name, "Warning", fleetv1.EventGrantRevoked, "revoked reboot slot %s: node %s rebooted outside the grant (%s)%s", s.Name, n.Name, bootChange(n, st, g), restored(h.uncordon))
	case st != nil && onDigest(st.Staged, g.Image.Digest) && !p.stagedForReboot(st, g.Image):
		// requireSignedImages was turned on after the stage: the node is
		// staged again, verified, before it may reboot.
		revoke(WhyStagedUnverified)
		p.nodeEvent(n.Name, "Warning", fleetv1.EventGrantRevoked, "revoked reboot slot %s of node %s before its reboot: its staged %s was fetched without enforcing the signature policy (signature %q) and the pool requires signed images; it will be staged again%s",
			s.Name, n.Name, g.Image, orUnknown(string(st.Staged.Signature)), restored(h.uncordon))
	default:
		p.drain(h)
	}
}

// drain cordons the holder of a Draining grant, starts or retries its
// drain, and advances the grant once the drain of this very grant is done
// (Draining -> Rebooting, Drained).
func (p *planner) drain(h heldSlot) {
	s, n, g := h.Slot, h.n, h.Grant
	d, hasDrain := p.in.Drains[n.Name]
	hasDrain = hasDrain && d.Grant == g.ID
	switch {
	case !n.Unschedulable:
		p.change(s, SlotChange{Op: OpCordon, Why: WhyCordon, DrainTimeout: p.b.DrainTimeout})
	case hasDrain && d.State == DrainDone && p.gateFailing && !g.Rollback:
		// A gate fails in this pass: its target may be quarantined, so
		// no update grant advances into a reboot now.
	case hasDrain && d.State == DrainDone:
		// The advance keeps the grant's record of whose cordon it is.
		p.change(s, SlotChange{Op: OpAdvance, Why: WhyDrained, CordonedByUs: cordonIsOurs(s, n)})
		p.nodeEvent(n.Name, "Normal", fleetv1.EventDrained, "node %s drained; slot %s moves to phase Reboot", n.Name, s.Name)
	case hasDrain && d.State == DrainRunning:
		if d.Message != "" {
			p.drainMsgs = append(p.drainMsgs, fmt.Sprintf("%s: %s", n.Name, d.Message))
		}
	default:
		if hasDrain && d.State == DrainFailed {
			p.drainMsgs = append(p.drainMsgs, fmt.Sprintf("%s: %s", n.Name, d.Message))
			p.nodeEvent(n.Name, "Warning", fleetv1.EventDrainFailed, "drain of node %s did not finish within %s (attempt %d): %s; retrying, the node will not reboot until it drains",
				n.Name, p.b.DrainTimeout, d.Attempts, d.Message)
		}
		p.out.StartDrains = append(p.out.StartDrains, DrainStart{Node: n.Name, Grant: g.ID, Timeout: p.b.DrainTimeout})
	}
}

// onFinished: a stage grant its holder is done with (amendment 31). No
// write: nobody works under it, so nothing expires or revokes it (an image
// change, a quarantine, a reboot), and the next stage grant hands it on in
// one write (grant). One beyond a shrunk maxStaging is released, so the
// free slot can be deleted.
func (p *planner) onFinished(h heldSlot) {
	if h.Index >= p.b.MaxStaging {
		p.change(h.Slot, SlotChange{Op: OpRelease, Why: WhySurplus})
	}
}

// onStaging: a stage grant its holder is not done with (a finished one is
// onFinished). Released once its holder staged the image without locking
// it and no longer reports Staging (its stage returned; it may not lock it
// then); revoked when it is no longer wanted, its agent let go of it, or it
// outlived stageTimeout; released when its holder went quiet for a lease
// duration.
func (p *planner) onStaging(h heldSlot) {
	s, n, st, g := h.Slot, h.n, h.st, h.Grant
	claim, claimed := claimOf(st, g.ID)
	switch {
	case st != nil && st.Phase != fleetv1.PhaseStaging && p.stagedForReboot(st, g.Image):
		p.change(s, SlotChange{Op: OpRelease, Why: WhyStaged})
		p.nodeEvent(n.Name, "Normal", fleetv1.EventStaged, "node %s staged %s (not locked); released stage slot %s", n.Name, g.Image, s.Name)
	case p.quarantined():
		p.change(s, SlotChange{Op: OpRevoke, Why: WhyQuarantined})
		p.nodeEvent(n.Name, "Normal", fleetv1.EventGrantRevoked, "revoked stage slot %s of node %s: the pool's target %s is quarantined", s.Name, n.Name, p.quarantine.Digest)
	case p.target.Digest != "" && !p.isTarget(n.Name, g.Image):
		p.change(s, SlotChange{Op: OpRevoke, Why: WhyImageChanged})
		p.nodeEvent(n.Name, "Normal", fleetv1.EventGrantRevoked, "revoked stage slot %s of node %s: its image %s is no longer the node's target (%s)", s.Name, n.Name, g.Image, p.changedTarget(n.Name))
	case claimed && claim.Released != "":
		p.change(s, SlotChange{Op: OpRevoke, Why: WhyReleasedByAgent})
		p.nodeEvent(n.Name, "Warning", fleetv1.EventGrantRevoked, "node %s let go of stage slot %s (%s: %s); the slot goes to the next node and %s waits at the back of the queue",
			n.Name, s.Name, claim.Released, text.Truncate(st.Message, 300), n.Name)
	case !p.in.Now.Before(p.stageDeadline(g)):
		// The agent cancels its stage stageTimeout after starting it and
		// lets go of the grant (amendment 19); this is the bound for an
		// agent that does not. The node keeps its share of maxStaging while
		// it still reports Staging (amendment 7), so the budget holds.
		p.change(s, SlotChange{Op: OpRevoke, Why: WhyStageTimedOut})
		p.nodeEvent(n.Name, "Warning", fleetv1.EventGrantRevoked, "revoked stage slot %s of node %s (%s): held longer than stageTimeout %s plus a lease duration (%s) since this coordinator saw the grant; the slot goes to the next node",
			s.Name, n.Name, fleetv1.ReasonStageTimedOut, p.b.StageTimeout, p.in.LeaseDuration)
	default:
		p.requeueAt(p.stageDeadline(g))
		p.stageAlive(h, claimed)
	}
}

// stageAlive releases a stage grant whose holder the coordinator saw no
// report of listing it for a lease duration (Staging -> Free, Expired), or
// asks to be woken then. Alive from the grant (the coordinator's own write),
// from when it saw the holder's BootcNode ask for the grant's image, or from
// the last heartbeat that listed it, as the coordinator saw it.
func (p *planner) stageAlive(h heldSlot, claimed bool) {
	n, g := h.n, h.Grant
	// A grant given with the node's new target (amendment 29) is its
	// agent's to list only once its BootcNode asks for that image, and any
	// grant only once the BootcNode names its slot, for the agent watches
	// only the slots named there (amendment 39): until this coordinator's
	// own patch shows, nothing is late, and from then the lease duration
	// runs from when this coordinator first saw it. stageDeadline still
	// bounds the grant.
	bn := p.bns[n.Name]
	if bn == nil || bn.Spec.DesiredImage != g.Image.String() || !namesSlot(bn, h.Name) {
		return
	}
	alive := g.Acquired
	for _, seen := range []time.Time{p.in.Heartbeats[n.Name].SpecSeen, p.in.Heartbeats[n.Name].SlotsSeen} {
		if seen.After(alive) {
			alive = seen
		}
	}
	if hb := p.in.Heartbeats[n.Name].Seen; claimed && hb.After(alive) {
		alive = hb
	}
	if !p.in.Now.Before(alive.Add(g.Duration)) {
		p.change(h.Slot, SlotChange{Op: OpRelease, Why: WhyExpired})
		p.nodeEvent(n.Name, "Warning", fleetv1.EventGrantReleased, "stage slot %s of node %s expired: no report of its agent listing the grant seen for %s (since %s); released it",
			h.Name, n.Name, g.Duration, alive.UTC().Format(time.RFC3339))
		return
	}
	p.requeueAt(alive.Add(g.Duration))
}

// stageDeadline is when a stage grant is revoked however alive its holder
// is: stageTimeout plus one lease duration after this coordinator first saw
// the grant, on its own clock (amendments 8 and 19). The lease duration is
// the margin for the agent, whose own bound starts later (once it saw the
// grant, had it heartbeated and confirmed it) and runs on another clock, to
// cancel and report first; a grant it let go of is revoked at once anyway.
func (p *planner) stageDeadline(g lease.Grant) time.Time {
	seen, ok := p.in.GrantsSeen[g.ID]
	if !ok || seen.After(p.in.Now) {
		seen = p.in.Now
	}
	return seen.Add(p.b.StageTimeout + p.in.LeaseDuration)
}

// claimOf finds grant id in the agent's fresh status.
func claimOf(st *fleetv1.BootcNodeStatus, id lease.ID) (fleetv1.GrantInUse, bool) {
	if st == nil {
		return fleetv1.GrantInUse{}, false
	}
	return lease.FindClaim(st.Grants, id)
}

func goneFor(wasRebooting bool, d time.Duration) string {
	if wasRebooting {
		return fmt.Sprintf(" and did not come back within rebootTimeout (%s)", d)
	}
	return ""
}

func restored(uncordon bool) string {
	if uncordon {
		return "; uncordoned it"
	}
	return ""
}

// bootChange says how the node's boot differs from the one g was issued in.
func bootChange(n Node, st *fleetv1.BootcNodeStatus, g lease.Grant) string {
	if n.BootID != g.BootID {
		return fmt.Sprintf("kubelet boot ID %s, granted in %s", n.BootID, g.BootID)
	}
	return fmt.Sprintf("same boot ID, soft-reboot count %d, granted at %d", softCount(st), g.SoftRebootCount)
}

func (p *planner) whyNotBack(n Node, st *fleetv1.BootcNodeStatus, g lease.Grant) string {
	switch {
	case p.in.Pool.Spec.RequireSignedImages && inGrantsBoot(n, st, g) && onDigest(st.Staged, g.Image.Digest) && !st.Staged.Verified():
		return fmt.Sprintf("it never rebooted: its staged image was not verified by the container signature policy (signature %q) and the pool requires signed images; its agent has not yet reported, acting on that spec, that it waits with the stage locked (phase %s), so the grant could not be revoked safely",
			orUnknown(string(st.Staged.Signature)), st.Phase)
	case !n.Ready:
		return "the Node is not Ready"
	case n.BootID == g.BootID && !softRebootedSince(n, st, g):
		return "the kubelet still reports the boot the grant was issued in, and its agent reports no soft reboot since"
	case st == nil:
		return "its agent has not reported from the new boot"
	case n.BootID == g.BootID && onDigest(st.Booted, g.Image.Digest):
		return "its report from after the soft reboot was not seen since the grant's phase Reboot"
	case st.Booted == nil:
		return "its agent reports no booted image"
	default:
		msg := "it booted " + st.Booted.Digest
		if st.Reason != "" {
			msg += ", agent reason " + st.Reason
		}
		return msg
	}
}

// inGrantsBoot: the agent's fresh report is from the very boot the grant
// was issued in (no reboot, full or soft, since).
func inGrantsBoot(n Node, st *fleetv1.BootcNodeStatus, g lease.Grant) bool {
	return st != nil && n.BootID == g.BootID && softCount(st) == g.SoftRebootCount
}

// unverifiedAndUnused: a reboot grant in phase Reboot that its agent
// provably did not and will not use, because signed images are now
// required and its stage is not verified (amendment 21). All of: the pool
// and the node's BootcNode require signed images; the agent's report acts
// on that BootcNode's generation; it is from the grant's boot (no reboot
// happened); the grant's digest is staged, still locked (download-only,
// so no unlock happened) and not verified; and the agent reports Waiting
// (an agent with a reboot record, or about to use the grant, reports
// Rebooting). An agent acting on such a spec never unlocks or reboots into
// an unverified stage (decide: rule 1 drops the record, rule 4 is skipped),
// and only this coordinator writes the spec.
func (p *planner) unverifiedAndUnused(n Node, st *fleetv1.BootcNodeStatus, g lease.Grant) bool {
	bn := p.bns[n.Name]
	return p.in.Pool.Spec.RequireSignedImages && bn != nil && bn.Spec.RequireSignedImages &&
		inGrantsBoot(n, st, g) && st.ObservedGeneration == bn.Generation &&
		onDigest(st.Staged, g.Image.Digest) && st.Staged.DownloadOnly && !st.Staged.Verified() &&
		st.Phase == fleetv1.PhaseWaiting
}

// rebootSince is when the reboot timeout of slot s starts: this
// coordinator's first sight of the grant in phase Reboot, or, if the
// controller did not say, the grant's renewTime.
func rebootSince(s Slot) time.Time {
	if !s.RebootSince.IsZero() {
		return s.RebootSince
	}
	return s.Grant.Renewed
}

// cordonIsOurs: the reboot grant of s records that its cordon call made the
// cordon, or that answer is still pending and the Node is cordoned with the
// grant's own mark (written in the cordon's own update), amendment 23.
func cordonIsOurs(s Slot, n Node) bool {
	if s.CordonedByUs {
		return true
	}
	return s.CordonPending && n.Unschedulable && n.CordonedFor == lease.CordonMark(s.Grant.ID)
}
