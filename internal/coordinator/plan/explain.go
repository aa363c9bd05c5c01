package plan

import (
	"fmt"
	"sort"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	"github.com/bootc-fleet/bootc-fleet/api/text"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// explain is the coordinator's view of node name once this plan's changes
// are made: a state word and why, for the BootcNode's rollout annotations
// (amendment 15). Nothing in it changes with the clock or a queue position,
// so it is rewritten when the node moves or its cause changes, not on every
// pass; `kubectl bootc-fleet explain` adds the live part (holders, how long,
// place in the queue). settingTarget says this plan writes the node's
// target as its desired image: the state is then what it is once that is
// written, in the same patch (amendment 29), not "being set".
func (p *planner) explain(name string, holds map[string][]*Slot, settingTarget bool) (state, reason string) {
	n := p.nodes[name]
	st := p.fresh(n)
	tgt, hasTarget := p.targetOf(name)
	for _, s := range holds[name] {
		if s.Phase.Grant() {
			return p.explainSlot(name, s)
		}
	}
	switch {
	case n.Held:
		why := "held out of the rollout by the Node annotation " + fleetv1.AnnotationHold
		if n.HoldReason != "" {
			why += " (" + text.Truncate(n.HoldReason, 100) + ")"
		}
		return fleetv1.RolloutHeld, why + "; remove it to let the node update"
	case p.noImage[name] != nil:
		return fleetv1.RolloutNoImage, text.Truncate(p.noImage[name].Reason+": "+p.noImage[name].Message, fleetv1.MaxRolloutReason)
	case p.target.Digest == "":
		return fleetv1.RolloutBlocked, "the pool's image has not resolved to a digest yet"
	case st != nil && hasTarget && onDigest(st.Booted, tgt.Digest):
		return fleetv1.RolloutUpdated, "runs " + shortImage(tgt.String())
	case p.quarantined():
		q := p.quarantine
		return fleetv1.RolloutBlocked, text.Truncate(fmt.Sprintf("the pool's target %s is quarantined: node %s failed on it (%s); nothing is staged or rebooted into it until spec.image names another image (%s)",
			shortImage(q.Digest), q.Node, q.Reason, text.Truncate(orUnknown(q.Message), 256)), fleetv1.MaxRolloutReason)
	case p.in.ResolveError != "":
		return fleetv1.RolloutBlocked, text.Truncate("no new grants while spec.image does not resolve: "+p.in.ResolveError, fleetv1.MaxRolloutReason)
	case p.signatureRejected(name):
		return fleetv1.RolloutFailed, text.Truncate("the host's signature policy rejected the image: "+st.Message, fleetv1.MaxRolloutReason)
	case st == nil:
		return fleetv1.RolloutUnknown, "no report from its agent in the node's current boot yet"
	case st.Phase == fleetv1.PhaseDegraded:
		return fleetv1.RolloutDegraded, text.Truncate(fmt.Sprintf("its agent reports %s: %s", orUnknown(st.Reason), st.Message), fleetv1.MaxRolloutReason)
	case !p.desiredIsTarget(name) && !settingTarget:
		return fleetv1.RolloutUnknown, "its desired image is being set"
	case p.stagedForReboot(st, tgt) && st.Staged.DownloadOnly:
		return p.waitingForReboot(n)
	case p.staging.counted[name]:
		return fleetv1.RolloutStaging, "its agent reports Staging without a stage grant; counted against maxStaging until it reports that it stopped (amendment 7), for at most stageTimeout plus a lease duration"
	case p.staging.lapsed[name]:
		return fleetv1.RolloutBlocked, "its agent has reported Staging without a stage grant for longer than stageTimeout plus a lease duration; no longer counted against maxStaging, and no stage slot while it reports so (amendment 20)"
	default:
		return p.waitingForStage(st)
	}
}

// explainSlot is the rollout state and reason of a node holding slot s:
// the slot's phase is the node's state.
func (p *planner) explainSlot(name string, s *Slot) (state, reason string) {
	g := s.Grant
	img := shortImage(g.Image.String())
	if g.Rollback {
		return p.explainRollback(s)
	}
	switch s.Phase {
	case PhaseStaging:
		return string(PhaseStaging), fmt.Sprintf("downloading and staging %s under stage slot %s", img, s.Name)
	case PhaseFailed:
		if healthFailure(g.Failure) {
			return string(PhaseFailed), p.explainGateFailure(s)
		}
		return string(PhaseFailed), fmt.Sprintf("did not come back Ready on %s in a new boot within rebootTimeout (%s); reboot slot %s stays held until it does, or the Node is deleted",
			img, p.b.RebootTimeout, s.Name)
	case PhaseDraining:
		// A retry keeps the last failure's words, so a drain that keeps
		// failing reads the same on every attempt (and is not rewritten).
		if d, ok := p.in.Drains[name]; ok && d.Grant == g.ID && d.Message != "" && d.State != DrainDone {
			return string(PhaseDraining), text.Truncate("drain blocked, retrying: "+d.Message, fleetv1.MaxRolloutReason)
		}
		return string(PhaseDraining), fmt.Sprintf("cordoned and draining for reboot slot %s", s.Name)
	case PhaseVerifying:
		if p.gated(g) {
			return string(PhaseVerifying), p.explainGate(s)
		}
		if !s.BackSince.IsZero() {
			return string(PhaseVerifying), fmt.Sprintf("back on %s; the slot is released once it has stayed Ready for %s (minReadySeconds)", img, p.minReady())
		}
		return string(PhaseVerifying), fmt.Sprintf("came back on %s but is not back now; reboot slot %s is released once it has stayed back, Ready, for %s (minReadySeconds)", img, s.Name, p.minReady())
	default:
		return string(PhaseRebooting), fmt.Sprintf("rebooting into %s under reboot slot %s", img, s.Name)
	}
}

// explainRollback: a node under a rollback grant (amendment 25).
func (p *planner) explainRollback(s *Slot) (state, reason string) {
	img := shortImage(s.Grant.Image.String())
	switch s.Phase {
	case PhaseDraining:
		return string(PhaseDraining), fmt.Sprintf("failed its health gate; cordoned and draining for rollback grant %s, to roll back to %s", s.Name, img)
	case PhaseVerifying:
		return string(PhaseVerifying), fmt.Sprintf("rolled back to %s; rollback grant %s is released once it has stayed Ready for %s (minReadySeconds)", img, s.Name, p.minReady())
	case PhaseFailed:
		return string(PhaseFailed), fmt.Sprintf("%s: did not come back on %s after its rollback; reboot slot %s stays held and the pool halts: repair the node by hand (boot it into a working image), then uncordon it and delete Lease %s/%s", orUnknown(s.Grant.Failure), img, s.Name, lease.Namespace, s.Name)
	default:
		return string(PhaseRebooting), fmt.Sprintf("failed its health gate; rolling back to %s under rollback grant %s", img, s.Name)
	}
}

// explainGate: a node back on its image, waiting on its health gate.
func (p *planner) explainGate(s *Slot) string {
	img := shortImage(s.Grant.Image.String())
	if p.gatePassed(*s) {
		return fmt.Sprintf("back on %s, health gate passed; the slot is released once it has stayed Ready for %s (minReadySeconds)", img, p.minReady())
	}
	if v, ok := p.in.Health[s.Grant.Holder]; ok && v.Passed() {
		return fmt.Sprintf("back on %s; waiting for its health gate (at most %s): check Metrics: the next answer of the query, one taken since the node came back", img, p.healthTimeout())
	}
	r := p.gateFailure(s.Grant.Holder)
	return text.Truncate(fmt.Sprintf("back on %s; waiting for its health gate (at most %s): check %s: %s: %s", img, p.healthTimeout(), r.Check, r.Reason, orUnknown(r.Message)), fleetv1.MaxRolloutReason)
}

// explainGateFailure: a node whose grant failed its health gate.
func (p *planner) explainGateFailure(s *Slot) string {
	img := shortImage(s.Grant.Image.String())
	next := haltedGateFailure(s.Name)
	if p.onFailure() == fleetv1.OnFailureRollback {
		next = "it is rolled back under a rollback grant once its agent reports a rollback deployment (none reported: the slot stays held and the pool halts)"
	}
	return fmt.Sprintf("failed its health gate on %s (%s); %s", img, s.Grant.Failure, next)
}

// haltedGateFailure says what happens to a node that failed its gate under
// onFailure Halt, and what the operator does.
func haltedGateFailure(slot string) string {
	return fmt.Sprintf("onFailure is Halt: it stays cordoned on the image and holds reboot slot %s; roll it back (bootc rollback, then reboot) or repair it by hand, then uncordon it and delete Lease %s/%s", slot, lease.Namespace, slot)
}

func (p *planner) waitingForReboot(n Node) (string, string) {
	const s = fleetv1.RolloutWaitingForRebootSlot
	switch {
	case p.in.MetricsError != "":
		return fleetv1.RolloutBlocked, text.Truncate("staged; the pool's metrics query failed ("+p.in.MetricsError+"): no new reboot grants", fleetv1.MaxRolloutReason)
	case p.in.MetricsBlocked[n.Name] != "":
		return fleetv1.RolloutBlocked, text.Truncate("staged; the metrics query returns series for it: "+p.in.MetricsBlocked[n.Name], fleetv1.MaxRolloutReason)
	case p.b.Paused:
		return fleetv1.RolloutBlocked, "staged; the rollout is paused (spec.rollout.paused)"
	case p.halted():
		return fleetv1.RolloutBlocked, fmt.Sprintf("staged; the rollout is halted: %d failure(s) reached haltAfterFailures %d", p.failures(), p.b.HaltAfterFailures)
	case p.win.err != nil || (p.win.configured && !p.win.open):
		return fleetv1.RolloutBlocked, "staged; " + p.win.describe()
	case !n.Ready:
		return s, "staged; the node is NotReady, and is granted a reboot slot once it is Ready"
	}
	if pause := p.pauseBetweenBatches(); pause > 0 {
		if held := p.countAfter(lease.KindReboot); held > 0 {
			return s, fmt.Sprintf("staged; waiting for the current batch (%d node(s) rebooting) to finish, then %s (pauseBetweenBatches)", held, pause)
		}
		if last := p.lastRebootRelease(); !last.IsZero() && p.in.Now.Before(last.Add(pause)) {
			return s, fmt.Sprintf("staged; pausing between batches until %s", last.Add(pause).UTC().Format("2006-01-02T15:04:05Z"))
		}
	}
	return s, fmt.Sprintf("staged; waiting for a reboot slot: maxUnavailable %d, counting nodes rebooting and those NotReady or cordoned by others", p.b.MaxUnavailable)
}

func (p *planner) waitingForStage(st *fleetv1.BootcNodeStatus) (string, string) {
	const s = fleetv1.RolloutWaitingForStageSlot
	switch {
	case p.b.Paused:
		return fleetv1.RolloutBlocked, "the rollout is paused (spec.rollout.paused)"
	case !p.stageGrantsAllowed():
		return fleetv1.RolloutBlocked, p.win.describe() + " (stageOnlyInWindow)"
	case LastStageFailed(st.Reason):
		return s, text.Truncate("its last stage failed; it waits behind the other nodes for a stage slot: "+st.Message, fleetv1.MaxRolloutReason)
	}
	msg := fmt.Sprintf("waiting for a stage slot: maxStaging %d", p.b.MaxStaging)
	if c := p.staging.counted; len(c) > 0 {
		names := make([]string, 0, len(c))
		for n := range c {
			names = append(names, n)
		}
		sort.Strings(names)
		msg += fmt.Sprintf(", counting %s, staging without a stage grant", joinMax(names, 5))
	}
	if l := p.staging.lapsedNames(); len(l) > 0 {
		msg += fmt.Sprintf("; %s reports Staging without a grant beyond stageTimeout and is not counted", joinMax(l, 5))
	}
	return s, text.Truncate(msg, fleetv1.MaxRolloutReason)
}

// shortImage keeps repository and a short digest: enough to tell images apart.
func shortImage(ref string) string {
	for i := len(ref) - 1; i >= 0; i-- {
		if ref[i] == '@' {
			return ref[:i+1] + text.ShortDigest(ref[i+1:])
		}
	}
	return ref
}
