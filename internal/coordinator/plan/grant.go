package plan

import (
	"slices"
	"sort"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// New grants: which nodes may have a slot, in what order, within the budget
// and the pacing rules (pacing.go), and what counts as a failure.

// otherwiseUnavailable lists pool nodes that are NotReady or cordoned and
// hold no reboot slot: they count against maxUnavailable.
func (p *planner) otherwiseUnavailable(holds map[string][]*Slot) map[string]bool {
	out := map[string]bool{}
	for _, name := range p.members {
		n := p.nodes[name]
		if holdsKind(holds[name], lease.KindReboot) {
			continue
		}
		if !n.Ready || (n.Unschedulable && !p.uncordoned[name]) {
			out[name] = true
		}
	}
	return out
}

func holdsKind(ss []*Slot, k lease.Kind) bool {
	for _, s := range ss {
		if s.Kind == k {
			return true
		}
	}
	return false
}

// failures counts the pool's failed nodes: reboot slots held failed and
// targets refused under the signature policy.
func (p *planner) failures() int {
	if p.failuresKnown {
		return p.failureCount
	}
	return p.countFailures()
}

func (p *planner) countFailures() int {
	c := 0
	for name := range p.failedSlot {
		if n, ok := p.nodes[name]; ok && n.InPool {
			c++
		}
	}
	for _, name := range p.members {
		if p.failedSlot[name] == "" && p.signatureRejected(name) {
			c++
		}
	}
	return c
}

// signatureRejected: the node's agent reports that bootc refused its target
// under the host's signature policy (amendment 14). That is a failure of
// the rollout on this node, as a reboot that did not come back is; it ends
// when the target changes or the agent reports otherwise.
func (p *planner) signatureRejected(name string) bool {
	st := p.fresh(p.nodes[name])
	return st != nil && st.Phase == fleetv1.PhaseDegraded && st.Reason == fleetv1.ReasonSignatureRejected && p.desiredIsTarget(name)
}

// stagedForReboot: st shows img staged, verified as the pool asks. Under
// requireSignedImages a deployment bootc fetched without enforcing the
// signature policy is not staged for the rollout (amendment 14).
func (p *planner) stagedForReboot(st *fleetv1.BootcNodeStatus, img imageref.Pinned) bool {
	return st != nil && onDigest(st.Staged, img.Digest) && (!p.in.Pool.Spec.RequireSignedImages || st.Staged.Verified())
}

func (p *planner) halted() bool {
	return p.failures() >= p.b.HaltAfterFailures || len(p.unrolledBack()) > 0
}

// grant hands free slots to eligible nodes, in name order.
func (p *planner) grant(slots []Slot) {
	if p.target.Digest == "" || p.in.ResolveError != "" || p.b.Paused || p.quarantined() {
		return
	}
	// Free as the slots will be once this pass's changes are made: a slot
	// released or revoked above goes to the next node in this same pass,
	// not one reconcile later (its release is written first).
	free := map[lease.Kind][]Slot{}
	for _, k := range []lease.Kind{lease.KindStage, lease.KindReboot} {
		free[k] = make([]Slot, 0, min(p.budgetFor(k), len(slots))) // no regrowth on every pass
	}
	// A finished stage slot is handed on as a free one is (amendment 31),
	// and before one: the grant is one write either way, and a free slot
	// left free costs none later.
	var finished []Slot
	for _, in := range slots {
		switch s := *p.after[in.Name]; {
		case s.Index >= p.budgetFor(s.Kind):
		case s.State == SlotFree:
			free[s.Kind] = append(free[s.Kind], s)
		case s.Phase == PhaseFinished:
			finished = append(finished, s)
		}
	}
	free[lease.KindStage] = append(finished, free[lease.KindStage]...)
	holds := p.holdsAfter()
	stillStaging := p.staging.counted
	heldReboot, heldStage := p.countAfter(lease.KindReboot), p.countAfter(lease.KindStage)+len(stillStaging)
	granted := p.grantReboots(free, holds, heldReboot)

	for _, name := range p.stageQueue() {
		if len(free[lease.KindStage]) == 0 || heldStage >= p.b.MaxStaging || !p.stageGrantsAllowed() {
			break
		}
		n := p.nodes[name]
		st := p.fresh(n)
		tgt, ok := p.targetOf(name)
		if !ok || granted[name] || stillStaging[name] || p.staging.lapsed[name] || p.conflicted(n) || n.Held || len(holds[name]) > 0 || !n.Ready || st == nil || !p.desiredWillBeTarget(name) {
			continue
		}
		if st.Phase == fleetv1.PhaseDegraded || onDigest(st.Booted, tgt.Digest) || p.stagedForReboot(st, tgt) {
			continue
		}
		s := takeSlot(free, lease.KindStage, name)
		p.grantSlot(s, n, tgt, st)
		heldStage++
	}
}

// takeSlot takes the slot of kind k to grant to node: the finished stage
// slot it holds itself, if any, so a node's next stage does not leave its
// old grant behind; else the first.
func takeSlot(free map[lease.Kind][]Slot, k lease.Kind, node string) Slot {
	ss := free[k]
	i := slices.IndexFunc(ss, func(s Slot) bool { return s.Holder == node })
	if i < 0 {
		i = 0
	}
	s := ss[i]
	free[k] = slices.Delete(ss, i, i+1)
	return s
}

// grantReboots hands free reboot slots to nodes staged for their target,
// within maxUnavailable and the pacing rules, and returns whom it granted.
// Nodes already unavailable for other reasons go first, since moving one
// of them into a slot costs no extra budget.
func (p *planner) grantReboots(free map[lease.Kind][]Slot, holds map[string][]*Slot, heldReboot int) map[string]bool {
	other := p.otherwiseUnavailable(holds)
	var rebootable []string
	for _, name := range p.members {
		n := p.nodes[name]
		st := p.fresh(n)
		tgt, ok := p.targetOf(name)
		if !ok || p.conflicted(n) || n.Held || len(holds[name]) > 0 || !n.Ready || st == nil || !p.desiredIsTarget(name) {
			continue
		}
		if st.Phase == fleetv1.PhaseDegraded || onDigest(st.Booted, tgt.Digest) || p.in.MetricsBlocked[name] != "" {
			continue
		}
		// The waves (canary.go): canaries first and alone, then zone by zone.
		if ok, _ := p.rebootEligible(name); !ok {
			continue
		}
		if p.stagedForReboot(st, tgt) && st.Staged.DownloadOnly {
			rebootable = append(rebootable, name)
		}
	}
	rebootable = p.waveOrder(RebootOrder(rebootable, func(name string) bool { return other[name] }))
	granted := map[string]bool{}
	if (len(rebootable) > 0 && p.in.MetricsError != "") || len(p.in.MetricsBlocked) > 0 {
		p.requeueAt(p.in.Now.Add(gateRecheck)) // a query's result changes with no object to watch
	}
	if p.halted() || p.in.MetricsError != "" || !p.rebootGrantsAllowed(heldReboot) {
		return granted
	}
	for _, name := range rebootable {
		if len(free[lease.KindReboot]) == 0 {
			break
		}
		// A node already counted as unavailable moves into a slot without
		// raising the total, as long as the total is within budget.
		if used := heldReboot + len(other); used > p.b.MaxUnavailable || (!other[name] && used == p.b.MaxUnavailable) {
			continue
		}
		s := free[lease.KindReboot][0]
		free[lease.KindReboot] = free[lease.KindReboot][1:]
		n := p.nodes[name]
		tgt, _ := p.targetOf(name)
		p.grantSlot(s, n, tgt, p.fresh(n))
		heldReboot++
		delete(other, name)
		granted[name] = true
		p.nodeEvent(name, "Normal", fleetv1.EventRebootGranted, "granted reboot slot %s to node %s for %s: cordon and drain, then reboot", s.Name, name, tgt)
	}
	return granted
}

// ungrantedStaging are the nodes that hold no stage slot but report, in
// their current boot, a stage under way.
type ungrantedStaging struct {
	// counted take a share of maxStaging (amendment 7).
	counted map[string]bool
	// lapsed reported so for longer than stageTimeout plus a lease duration:
	// no share any more, and named on the pool (amendment 20).
	lapsed map[string]bool
}

// all names every node of both sets, sorted.
func (u ungrantedStaging) all() []string {
	var out []string
	for n := range u.counted {
		out = append(out, n)
	}
	for n := range u.lapsed {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// lapsedNames names the lapsed nodes, sorted.
func (u ungrantedStaging) lapsedNames() []string {
	var out []string
	for n := range u.lapsed {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// stagingWithoutSlot finds nodes that hold no stage slot but report, in
// their current boot, a stage under way: a revoked holder downloads until
// its agent sees the revoke and cancels. Until it reports that it stopped
// (or goes quiet for a lease duration, as an unrenewed grant would), its
// download counts against maxStaging, so its slot is not handed on early.
// The share lapses stageTimeout plus a lease duration after the
// coordinator first saw the node staging without a grant (amendment 20): an
// agent honouring amendment 19 cancels any stage within stageTimeout of
// starting it, so only a confused or hostile agent reports Staging that
// long without a grant, and it must not hold the pool's staging capacity.
func (p *planner) stagingWithoutSlot(holds map[string][]*Slot) ungrantedStaging {
	out := ungrantedStaging{counted: map[string]bool{}, lapsed: map[string]bool{}}
	for _, name := range p.members {
		st := p.fresh(p.nodes[name])
		seen := p.in.Heartbeats[name].Seen
		if st == nil || st.Phase != fleetv1.PhaseStaging || seen.IsZero() {
			continue
		}
		// Timed by when the coordinator saw the report, not by the node's clock.
		quiet := seen.Add(p.in.LeaseDuration)
		if !p.in.Now.Before(quiet) {
			continue
		}
		if holdsKind(holds[name], lease.KindStage) {
			continue
		}
		since, ok := p.in.UngrantedStagingSince[name]
		if !ok || since.After(p.in.Now) {
			since = p.in.Now
		}
		lapse := since.Add(p.b.StageTimeout + p.in.LeaseDuration)
		if !p.in.Now.Before(lapse) {
			out.lapsed[name] = true
			continue
		}
		out.counted[name] = true
		p.requeueAt(quiet)
		p.requeueAt(lapse)
	}
	return out
}

// desiredIsTarget: the node's BootcNode already asks for its target, so the
// agent finds a grant that matches what it was told to run.
func (p *planner) desiredIsTarget(name string) bool {
	bn := p.bns[name]
	tgt, ok := p.targetOf(name)
	return ok && bn != nil && bn.Spec.DesiredImage == tgt.String()
}

// desiredWillBeTarget: the node's BootcNode asks for its target once this
// pass's writes are made: it does already, or membership writes it so in
// this pass (the same rules: the pool's own BootcNode, a target for the
// node's platform, nothing quarantined). A stage grant may go out with that
// write (amendment 29): the agent uses a grant only for the image its
// BootcNode asks for, so until the patch lands the grant is not valid for it.
func (p *planner) desiredWillBeTarget(name string) bool {
	if p.desiredIsTarget(name) {
		return true
	}
	bn := p.bns[name]
	_, ok := p.targetOf(name)
	return ok && bn != nil && bn.Spec.Pool == p.pool && !p.quarantined()
}

// isTarget: img is node name's target.
func (p *planner) isTarget(name string, img imageref.Pinned) bool {
	tgt, ok := p.targetOf(name)
	return ok && tgt == img
}

// stageQueue is the order stage slots are offered in (StageOrder, then
// by wave: canaries first, then zone by zone).
func (p *planner) stageQueue() []string {
	return p.waveOrder(StageOrder(p.members, func(name string) bool {
		st := p.fresh(p.nodes[name])
		return st != nil && LastStageFailed(st.Reason)
	}))
}

// grantSlot grants s to n for img, recording n's boot: the kubelet's boot ID
// and the soft-reboot count its agent reported in that boot (callers grant
// only to nodes with a fresh status, so the two belong to the same boot).
func (p *planner) grantSlot(s Slot, n Node, img imageref.Pinned, st *fleetv1.BootcNodeStatus) {
	c := SlotChange{Op: OpGrant, Node: n.Name, Image: img, BootID: n.BootID, SoftRebootCount: softCount(st), Why: WhyEligible}
	if s.Kind == lease.KindReboot {
		c.DrainTimeout = p.b.DrainTimeout
	} else {
		c.StageTimeout = p.b.StageTimeout
	}
	p.change(s, c)
	a := p.after[s.Name]
	*a = Slot{Name: s.Name, Kind: s.Kind, Index: s.Index, State: SlotHeld, Holder: n.Name,
		Grant: lease.Grant{Pool: p.pool, Kind: s.Kind, Holder: n.Name, Image: img, BootID: n.BootID, SoftRebootCount: c.SoftRebootCount}}
	if s.Kind == lease.KindReboot {
		a.Grant.Phase = lease.PhaseDraining
	}
	a.Phase = PhaseOf(*a)
}
