package plan

import (
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	"github.com/bootc-fleet/bootc-fleet/api/text"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/health"
)

// The health gate after a reboot, the quarantine of a target that failed
// it, and the rollback grant (docs/design.md, amendments 24 and 25).

// DefaultHealthTimeout is spec.health.timeout for an object the API server
// did not default.
const DefaultHealthTimeout = 10 * time.Minute

// gateRecheck is how often a node waiting on its gate is looked at again:
// a query's result changes with no object to watch.
const gateRecheck = 15 * time.Second

// gated: grant g's node passes the pool's health gate before its slot is
// released: the pool names at least one check. A rollback grant's never
// does: the image it goes back to is the one the node ran before.
func (p *planner) gated(g lease.Grant) bool {
	h := p.in.Pool.Spec.Health
	return h != nil && (h.Host != nil || h.Workloads != nil || h.Metrics != nil) && !g.Rollback
}

func (p *planner) healthTimeout() time.Duration {
	if h := p.in.Pool.Spec.Health; h != nil && h.Timeout != nil && h.Timeout.Duration >= 30*time.Second && h.Timeout.Duration <= 24*time.Hour {
		return h.Timeout.Duration
	}
	return DefaultHealthTimeout
}

// gatePassed: the controller's verdict for the holder of s says every
// check passed, its metrics answer taken since the holder was found back
// (an earlier answer, e.g. from before the reboot, says nothing about the
// new boot). Absent: not evaluated yet, not passed.
func (p *planner) gatePassed(s Slot) bool {
	v, ok := p.in.Health[s.Grant.Holder]
	return ok && v.Passed() && !p.metricsStale(s, v)
}

// metricsStale: v's metrics answer was taken before the holder of s was
// found back.
func (p *planner) metricsStale(s Slot, v health.Verdict) bool {
	return !v.MetricsAt.IsZero() && v.MetricsAt.Before(p.gateStart(s))
}

// gateStart is when the gate's clock started for slot s: when the holder
// was first found back (back-since, set in this pass at the latest); a
// holder that came back and fell over since is timed from phase Reboot,
// never later than it came back.
func (p *planner) gateStart(s Slot) time.Time {
	if a := p.after[s.Name]; a != nil && !a.BackSince.IsZero() {
		return a.BackSince
	}
	if !s.BackSince.IsZero() {
		return s.BackSince
	}
	if s.CameBack {
		return rebootSince(s)
	}
	return p.in.Now
}

// gateTimer waits for the gate of a holder back on its image, or fails it
// health.timeout after it was found back (Verifying -> Failed).
func (p *planner) gateTimer(h heldSlot) {
	deadline := p.gateStart(h.Slot).Add(p.healthTimeout())
	if p.in.Now.Before(deadline) {
		p.requeueAt(deadline)
		p.requeueAt(p.in.Now.Add(gateRecheck))
		return
	}
	p.gateFailed(h)
}

// nodeHealth is a BootcNode's spec.health: the pool's required units, for a
// node with a desired image.
func (p *planner) nodeHealth(desired string) *fleetv1.NodeHealthSpec {
	h := p.in.Pool.Spec.Health
	if desired == "" || h == nil || h.Host == nil || len(h.Host.RequiredUnits) == 0 {
		return nil
	}
	units := h.Host.RequiredUnits
	if len(units) > fleetv1.MaxRequiredUnits {
		units = units[:fleetv1.MaxRequiredUnits]
	}
	return &fleetv1.NodeHealthSpec{RequiredUnits: append([]string(nil), units...)}
}

// gateFailure is the first check that did not pass; with no verdict, the
// first check the pool configures, not reported.
func (p *planner) gateFailure(node string) health.Result {
	if r, ok := p.in.Health[node].FirstFailure(); ok && validReason(r.Reason) {
		r.Message = text.Truncate(r.Message, 1024)
		return r
	}
	spec := p.in.Pool.Spec.Health
	r := health.Result{Message: "not evaluated before health.timeout"}
	switch {
	case spec == nil || spec.Host != nil:
		r.Check, r.Reason = health.CheckHost, fleetv1.ReasonHostNotReported
	case spec.Workloads != nil:
		r.Check, r.Reason = health.CheckWorkloads, fleetv1.ReasonWorkloadsNotReady
	default:
		r.Check, r.Reason = health.CheckMetrics, fleetv1.ReasonMetricsQueryFailed
	}
	return r
}

// validReason: a failure reason the grant's annotation and the
// quarantine's schema take (CamelCase, at most 64 characters).
func validReason(r string) bool {
	if r == "" || len(r) > 64 || r[0] < 'A' || r[0] > 'Z' {
		return false
	}
	for _, c := range r {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		default:
			return false
		}
	}
	return true
}

// gateFailed marks the grant failed with the check's reason, quarantines
// the target and says what onFailure does next.
func (p *planner) gateFailed(h heldSlot) {
	s, n, g := h.Slot, h.n, h.Grant
	r := p.gateFailure(n.Name)
	p.change(s, SlotChange{Op: OpMarkFailed, Failure: r.Reason, Why: WhyHealthCheckFailed})
	// A node the next pass rolls back is no failure that halts the pool:
	// counting it in this pass would say Halted, "not rolled back", for
	// the one pass before its rollback grant.
	if _, ok := p.rollbackFor(h); !ok {
		p.failedSlot[g.Holder] = r.Reason
	}
	next := haltedGateFailure(s.Name)
	if p.onFailure() == fleetv1.OnFailureRollback {
		if _, ok := p.rollbackImage(h); ok {
			next = "it is rolled back to its previous image under a rollback grant"
		} else {
			next = "its agent reports no rollback deployment, so it cannot be rolled back: the slot stays held and the pool halts"
		}
	}
	p.nodeEvent(n.Name, "Warning", fleetv1.EventHealthCheckFailed, "node %s failed its health gate on %s within %s: check %s, %s: %s; %s",
		n.Name, g.Image, p.healthTimeout(), r.Check, r.Reason, orUnknown(r.Message), next)
	p.quarantineFor(n.Name, g.Image, r.Reason, fmt.Sprintf("check %s: %s", r.Check, r.Message))
}

func (p *planner) onFailure() fleetv1.FailurePolicy {
	if p.in.Pool.Spec.Rollout.OnFailure == fleetv1.OnFailureHalt {
		return fleetv1.OnFailureHalt
	}
	return fleetv1.OnFailureRollback
}

// healthFailure: a grant's failure is its node's gate (or the host's own
// fall back), so its target is quarantined and onFailure applies.
func healthFailure(reason string) bool {
	switch reason {
	case fleetv1.ReasonHostNotReported, fleetv1.ReasonHostNotRunning, fleetv1.ReasonHostUnitFailed,
		fleetv1.ReasonHostUnitInactive, fleetv1.ReasonHostBootIncomplete, fleetv1.ReasonWorkloadsNotReady,
		fleetv1.ReasonMetricsFiring, fleetv1.ReasonMetricsQueryFailed:
		return true
	}
	return false
}

// startQuarantine is the pool's quarantine as read, while spec.image is
// the one it was written for; a new spec.image clears it.
func (p *planner) startQuarantine() {
	q := p.in.Pool.Status.Quarantine
	if q == nil {
		return
	}
	if q.SpecImage != p.in.Pool.Spec.Image {
		p.event("Normal", fleetv1.EventImageChanged, "spec.image changed from %s to %s: the quarantine of %s is lifted", q.SpecImage, p.in.Pool.Spec.Image, q.Digest)
		return
	}
	c := *q
	p.quarantine = &c
}

// quarantined: the pool's target is quarantined (no stage or reboot grant
// for it).
func (p *planner) quarantined() bool { return p.quarantine != nil }

// quarantineFor quarantines the pool's target after node failed on img, if
// img is still node's target and nothing is quarantined yet.
func (p *planner) quarantineFor(node string, img imageref.Pinned, reason, msg string) {
	if p.quarantine != nil || p.target.Digest == "" || !p.isTarget(node, img) {
		return
	}
	p.quarantine = &fleetv1.Quarantine{
		SpecImage: p.in.Pool.Spec.Image, Digest: p.target.String(), Node: node,
		Reason: reason, Message: text.Truncate(msg, 1024), Since: metav1.NewTime(p.in.Now).Rfc3339Copy(),
	}
	p.event("Warning", fleetv1.EventImageQuarantined, "quarantined %s (spec.image %s): node %s failed on it (%s); no node of the pool stages or reboots into it until spec.image names another image",
		p.target, p.in.Pool.Spec.Image, node, reason)
}

// rollbackImage is the image the failed grant's node rolls back to: its
// status.rollback as its agent reports it in the node's current boot.
func (p *planner) rollbackImage(h heldSlot) (imageref.Pinned, bool) {
	st := h.st
	if st == nil || st.Rollback == nil || !imageref.IsDigest(st.Rollback.Digest) || st.Rollback.Digest == h.Grant.Image.Digest {
		return imageref.Pinned{}, false
	}
	if pin, err := imageref.ParsePinned(st.Rollback.Image); err == nil && pin.Digest == st.Rollback.Digest {
		return pin, true
	}
	if repo, err := imageref.Repository(st.Rollback.Image); err == nil {
		if pin, err := imageref.PinnedFromDigest(repo, st.Rollback.Digest); err == nil {
			return pin, true
		}
	}
	pin, err := imageref.PinnedFromDigest(h.Grant.Image.Repository, st.Rollback.Digest)
	return pin, err == nil
}

// rollbackFor is the image a failed grant's node is rolled back to, when
// it is: onFailure is Rollback, and the node is Ready and reports a
// rollback deployment in its current boot.
func (p *planner) rollbackFor(h heldSlot) (imageref.Pinned, bool) {
	if p.onFailure() != fleetv1.OnFailureRollback || !h.n.Ready || h.st == nil {
		return imageref.Pinned{}, false
	}
	return p.rollbackImage(h)
}

// afterGateFailure: an update grant marked failed by its gate. With
// onFailure Rollback, its slot is re-issued to the node as a rollback grant
// (Failed -> Draining, Rollback); otherwise it stays held.
func (p *planner) afterGateFailure(h heldSlot) {
	s, n, g := h.Slot, h.n, h.Grant
	p.quarantineFor(n.Name, g.Image, g.Failure, "check failed: "+g.Failure)
	img, ok := p.rollbackFor(h)
	if !ok {
		return
	}
	c := SlotChange{Op: OpGrant, Node: n.Name, Image: img, BootID: n.BootID, SoftRebootCount: softCount(h.st),
		DrainTimeout: p.b.DrainTimeout, Rollback: true, Cordon: g.Cordon, Why: WhyRollback}
	p.change(s, c)
	a := p.after[s.Name]
	*a = Slot{Name: s.Name, Kind: s.Kind, Index: s.Index, State: SlotHeld, Holder: n.Name,
		CordonedByUs: g.Cordon == lease.CordonOurs, CordonPending: g.Cordon == lease.CordonPending,
		Grant: lease.Grant{Pool: p.pool, Kind: s.Kind, Holder: n.Name, Image: img, BootID: n.BootID,
			SoftRebootCount: c.SoftRebootCount, Phase: lease.PhaseDraining, Rollback: true, Cordon: g.Cordon}}
	a.Phase = PhaseOf(*a)
	delete(p.failedSlot, g.Holder)
	p.nodeEvent(n.Name, "Warning", fleetv1.EventRollbackGranted, "node %s failed its health gate on %s (%s): slot %s is re-issued to it as a rollback grant to %s; it stays cordoned, is drained, rolls back and reboots",
		n.Name, g.Image, g.Failure, s.Name, img)
}

// unrolledBack names the pool's nodes whose failure halts it whatever
// haltAfterFailures says (amendment 25): a failed rollback, or, with
// onFailure Rollback, a failed gate that is not rolled back (its node
// reports no rollback deployment, or is not Ready).
func (p *planner) unrolledBack() []string {
	var out []string
	for _, name := range p.members {
		switch f := p.failedSlot[name]; {
		case f == fleetv1.ReasonRollbackFailed, healthFailure(f) && p.onFailure() == fleetv1.OnFailureRollback:
			out = append(out, fmt.Sprintf("%s (%s)", name, f))
		}
	}
	return out
}

// haltedGates names the pool's nodes that failed their health gate under
// onFailure Halt: held until an operator repairs them.
func (p *planner) haltedGates() []string {
	if p.onFailure() != fleetv1.OnFailureHalt {
		return nil
	}
	var out []string
	for _, name := range p.members {
		if healthFailure(p.failedSlot[name]) {
			out = append(out, name)
		}
	}
	return out
}

// gatesFailing: a holder's gate fails in this pass (its timeout passed and
// its verdict does not pass), found before the slots are settled, so no
// Draining update grant advances into a reboot in the pass its target is
// quarantined.
func (p *planner) gatesFailing(slots []Slot) bool {
	for _, s := range slots {
		if s.Phase == PhaseVerifying && p.gated(s.Grant) && !p.gatePassed(s) &&
			!p.in.Now.Before(p.gateStart(s).Add(p.healthTimeout())) {
			return true
		}
	}
	return false
}

// backOnOther: the holder of g is back, Ready, after a full reboot (a new
// kubelet boot ID; a boot counter falls back only in the boot loader, and
// a soft reboot that restarted the old root is not a verdict on the image:
// rebootTimeout judges it), booted on an image other than the grant's, and
// bootc lists the grant's image as its rollback deployment: the boot loader
// chose the other deployment of the pair (boot counting fell back, or a
// rollback ran). A node booted elsewhere for another reason is left to
// rebootTimeout, as before. While the agent says its bootc status has not
// settled in the new boot (settling), the booted deployment it reports is
// no verdict yet.
func backOnOther(n Node, st *fleetv1.BootcNodeStatus, g lease.Grant) bool {
	return n.Ready && st != nil && !settling(st) && st.Booted != nil && imageref.IsDigest(st.Booted.Digest) &&
		st.Booted.Digest != g.Image.Digest && n.BootID != g.BootID &&
		st.Rollback != nil && st.Rollback.Digest == g.Image.Digest
}

// settling: the agent reports, in a new boot, that bootc status does not
// show yet the image it rebooted into and that it reads it again until its
// settle timeout (agent rule 2, phase Rebooting, reason StatusSettling).
// Early in a boot bootc status can still describe the boot before: after a
// rollback's reboot, the failed image booted with the grant's image as its
// rollback deployment, which is what a rollback that did not take looks like.
func settling(st *fleetv1.BootcNodeStatus) bool {
	return st.Phase == fleetv1.PhaseRebooting && st.Reason == fleetv1.ReasonStatusSettling
}

// rolledBackByHost: an update grant's node came back on another image by
// itself (its boot counting fell back): the target is quarantined and the
// slot released as after a rollback, with no second rollback
// (-> Free, RolledBackByHost).
func (p *planner) rolledBackByHost(h heldSlot) {
	s, n, st, g := h.Slot, h.n, h.st, h.Grant
	p.change(s, SlotChange{Op: OpRelease, Why: WhyRolledBackByHost, Uncordon: h.uncordon})
	p.nodeEvent(n.Name, "Warning", fleetv1.EventHealthCheckFailed, "node %s came back in a new boot on %s, not on %s it was granted a reboot into (%s: its boot counting fell back); released reboot slot %s%s",
		n.Name, st.Booted.Digest, g.Image, fleetv1.ReasonRolledBackByHost, s.Name, restored(h.uncordon))
	p.quarantineFor(n.Name, g.Image, fleetv1.ReasonRolledBackByHost, fmt.Sprintf("node %s came back on %s by itself", n.Name, st.Booted.Digest))
	delete(p.failedSlot, g.Holder)
}

// rollbackFailed marks a rollback grant failed: its node did not come back
// on its previous image (Rebooting/Verifying -> Failed, RollbackFailed). It
// stays held and the pool halts; nothing reboots it again.
func (p *planner) rollbackFailed(h heldSlot, why string) {
	s, n, g := h.Slot, h.n, h.Grant
	p.change(s, SlotChange{Op: OpMarkFailed, Failure: fleetv1.ReasonRollbackFailed, Why: WhyRollbackFailed})
	p.failedSlot[g.Holder] = fleetv1.ReasonRollbackFailed
	p.nodeEvent(n.Name, "Warning", fleetv1.EventRollbackFailed, "node %s failed its rollback to %s (%s): %s; slot %s stays held and the pool halts: repair the node by hand (boot it into a working image), then uncordon it and delete Lease %s/%s",
		n.Name, g.Image, fleetv1.ReasonRollbackFailed, why, s.Name, lease.Namespace, s.Name)
}
