package plan

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/coordinator/platform"
)

// Defaults of the pool's rollout fields, for objects the API server did not default.
const (
	DefaultDrainTimeout      = 10 * time.Minute
	DefaultRebootTimeout     = 15 * time.Minute
	DefaultHaltAfterFailures = 1
)

// Budget is a pool's resolved rollout bounds.
type Budget struct {
	MaxUnavailable    int
	MaxStaging        int
	DrainTimeout      time.Duration
	RebootTimeout     time.Duration
	HaltAfterFailures int
	Paused            bool
}

// ResolveBudget resolves the pool's rollout spec for a pool of size nodes:
// int or percent, percent rounded up, never below 1.
func ResolveBudget(spec fleetv1.RolloutSpec, size int) Budget {
	b := Budget{
		MaxUnavailable:    scaled(spec.MaxUnavailable, intstr.FromInt32(1), size),
		MaxStaging:        scaled(spec.MaxStaging, intstr.FromString("25%"), size),
		DrainTimeout:      DefaultDrainTimeout,
		RebootTimeout:     DefaultRebootTimeout,
		HaltAfterFailures: DefaultHaltAfterFailures,
		Paused:            spec.Paused,
	}
	if spec.DrainTimeout != nil && spec.DrainTimeout.Duration > 0 {
		b.DrainTimeout = spec.DrainTimeout.Duration
	}
	if spec.RebootTimeout != nil && spec.RebootTimeout.Duration > 0 {
		b.RebootTimeout = spec.RebootTimeout.Duration
	}
	if spec.HaltAfterFailures != nil && *spec.HaltAfterFailures >= 1 {
		b.HaltAfterFailures = int(*spec.HaltAfterFailures)
	}
	return b
}

// maxSlots bounds a budget, so a typo cannot create thousands of Leases (slot
// indexes are at most 4 digits).
const maxSlots = 1000

func scaled(v *intstr.IntOrString, def intstr.IntOrString, size int) int {
	n, err := intstr.GetScaledValueFromIntOrPercent(intstr.ValueOrDefault(v, def), size, true)
	if err != nil || n < 1 {
		return 1
	}
	return min(n, maxSlots)
}

// planner carries one Plan call.
type planner struct {
	in     Input
	pool   string
	b      Budget
	target imageref.Pinned // zero when never resolved
	out    Output

	nodes   map[string]Node
	members []string // InPool, sorted
	bns     map[string]*fleetv1.BootcNode
	// after: the slots as they will be once Changes are applied.
	after map[string]*Slot
	// uncordoned: nodes a change in this plan uncordons.
	uncordoned map[string]bool
	failedSlot map[string]string // node -> failure of its held reboot slot
	drainMsgs  []string
	// goneHolders hold a reboot slot in phase Reboot while their Node object
	// is deleted (waiting for the machine to come back).
	goneHolders []string
	// targets: each member's target (platforms.go); noImage: members the
	// target's index has no image for, and why.
	targets map[string]imageref.Pinned
	noImage map[string]*platform.Problem
	// win: the pool's maintenance windows now (pacing.go).
	win windowState
}

// Plan decides the changes for one pool. It is pure and deterministic: the
// same Input gives the same Output.
func Plan(in Input) Output {
	p := &planner{
		in:         in,
		pool:       in.Pool.Name,
		nodes:      map[string]Node{},
		bns:        map[string]*fleetv1.BootcNode{},
		after:      map[string]*Slot{},
		uncordoned: map[string]bool{},
		failedSlot: map[string]string{},
		targets:    map[string]imageref.Pinned{},
		noImage:    map[string]*platform.Problem{},
	}
	for _, n := range in.Nodes {
		p.nodes[n.Name] = n
		if n.InPool {
			p.members = append(p.members, n.Name)
		}
	}
	sort.Strings(p.members)
	for i := range in.BootcNodes {
		p.bns[in.BootcNodes[i].Name] = &in.BootcNodes[i]
	}
	if in.Target.Digest != "" {
		p.target = in.Target
	}
	p.b = ResolveBudget(in.Pool.Spec.Rollout, len(p.members))
	p.nodeTargets()
	p.win = evalWindows(in.Pool.Spec.Rollout.Windows, in.Now)

	slots := append([]Slot(nil), in.Slots...)
	sort.Slice(slots, func(i, j int) bool {
		if slots[i].Kind != slots[j].Kind {
			return slots[i].Kind < slots[j].Kind
		}
		return slots[i].Index < slots[j].Index
	})
	for i := range slots {
		s := slots[i]
		p.after[s.Name] = &s
	}

	p.ensureSlots(slots)
	for i := range slots {
		p.held(slots[i])
	}
	p.grant(slots)
	p.membership()
	p.status()
	return p.out
}

// conflicted: the node is matched by another pool too, or its name cannot be
// a label value; the pool acts on none of these.
func (p *planner) conflicted(n Node) bool {
	return len(n.OtherPools) > 0 || len(validation.IsValidLabelValue(n.Name)) > 0
}

func (p *planner) budgetFor(k lease.Kind) int {
	if k == lease.KindReboot {
		return p.b.MaxUnavailable
	}
	return p.b.MaxStaging
}

func (p *planner) ensureSlots(slots []Slot) {
	have := map[string]bool{}
	for _, s := range slots {
		have[s.Name] = true
		if s.Index >= p.budgetFor(s.Kind) && s.State == SlotFree {
			p.out.DeleteSlots = append(p.out.DeleteSlots, s.Name)
		}
	}
	for _, k := range []lease.Kind{lease.KindReboot, lease.KindStage} {
		for i := 0; i < p.budgetFor(k); i++ {
			if name := lease.SlotName(p.pool, k, i); !have[name] {
				p.out.CreateSlots = append(p.out.CreateSlots, SlotRef{Name: name, Kind: k, Index: i})
			}
		}
	}
}

// fresh returns the BootcNode status of node n when it was read in the boot
// the kubelet reports now; nil otherwise (a stale status is never acted on).
// A soft-reboot count outside systemd's uint32 is no status either.
func (p *planner) fresh(n Node) *fleetv1.BootcNodeStatus {
	bn := p.bns[n.Name]
	if bn == nil || bn.Spec.Pool != p.pool || !lease.ValidBootID(n.BootID) || bn.Status.BootID != n.BootID ||
		bn.Status.SoftRebootCount < 0 || bn.Status.SoftRebootCount > math.MaxUint32 {
		return nil
	}
	return &bn.Status
}

// softCount is the soft-reboot count of a fresh status (fresh checked its range).
func softCount(st *fleetv1.BootcNodeStatus) uint32 {
	if st == nil {
		return 0
	}
	return uint32(st.SoftRebootCount)
}

// softRebootedSince: the node's agent reports, in the kubelet's boot that the
// grant was issued in, more soft reboots than the grant recorded.
func softRebootedSince(n Node, st *fleetv1.BootcNodeStatus, g lease.Grant) bool {
	return st != nil && n.BootID == g.BootID && softCount(st) > g.SoftRebootCount
}

// unusedInEarlierBoot: the node is in another boot than the grant's, and its
// agent, reporting in that boot, lists the grant as never used
// (RebootGrantUnused: no reboot record names it, no reboot spent it).
func unusedInEarlierBoot(n Node, st *fleetv1.BootcNodeStatus, g lease.Grant) bool {
	if st == nil || (n.BootID == g.BootID && softCount(st) == g.SoftRebootCount) {
		return false
	}
	c, ok := claimOf(st, g.ID)
	return ok && c.Released == fleetv1.ReasonRebootGrantUnused
}

// verifiedBack says whether the node came back from the reboot grant g: Ready
// and booted on the grant's image, in a boot other than the one g was issued
// in, as the agent reports it in the kubelet's current boot. A full reboot
// shows as a new kubelet boot ID. A soft reboot keeps the boot ID, so it
// shows only as the agent's soft-reboot count (systemd's SoftRebootsCount,
// which the agent reads over D-Bus) above the grant's, in a report the
// coordinator saw after the grant's phase Reboot was written (docs/design.md,
// amendment 13).
func (p *planner) verifiedBack(n Node, st *fleetv1.BootcNodeStatus, g lease.Grant) (back, soft bool) {
	if !n.Ready || st == nil || !onDigest(st.Booted, g.Image.Digest) {
		return false, false
	}
	if n.BootID != g.BootID {
		return true, false
	}
	if softRebootedSince(n, st, g) && p.in.Heartbeats[n.Name].Seen.After(g.Renewed) {
		return true, true
	}
	return false, false
}

func onDigest(d *fleetv1.Deployment, dg string) bool {
	return d != nil && dg != "" && d.Digest == dg
}

func (p *planner) change(s Slot, c SlotChange) {
	c.Slot, c.Kind = s.Name, s.Kind
	if c.Node == "" {
		c.Node = s.Holder
	}
	p.out.Changes = append(p.out.Changes, c)
	a := p.after[s.Name]
	switch c.Op {
	case OpRelease, OpRevoke, OpReset:
		*a = Slot{Name: s.Name, Kind: s.Kind, Index: s.Index, State: SlotFree, ReleasedAt: s.ReleasedAt}
		if c.Op == OpRelease && c.Why == WhyVerified {
			a.ReleasedAt = p.in.Now
		}
		if c.Uncordon {
			p.uncordoned[c.Node] = true
		}
	case OpAdvance:
		a.Grant.Phase = lease.PhaseReboot
	case OpMarkFailed:
		a.Grant.Failure = c.Failure
	case OpCordon:
		a.CordonedByUs = true
	case OpMarkBack:
		a.BackSince = c.BackSince
	}
}

func (p *planner) event(typ, reason, format string, args ...any) {
	p.out.Events = append(p.out.Events, Event{Type: typ, Reason: reason, Message: fmt.Sprintf(format, args...)})
}

// nodeEvent is an Event on the pool that is about node: the controller
// records it on the Node too, so `kubectl describe node` tells the story.
func (p *planner) nodeEvent(node, typ, reason, format string, args ...any) {
	p.out.Events = append(p.out.Events, Event{Type: typ, Reason: reason, Message: fmt.Sprintf(format, args...), Node: node})
}

func (p *planner) requeueAt(t time.Time) {
	d := t.Sub(p.in.Now)
	if d <= 0 {
		d = time.Second
	}
	if p.out.RequeueAfter == 0 || d < p.out.RequeueAfter {
		p.out.RequeueAfter = d
	}
}

// held decides what happens to one slot as it is now.
func (p *planner) held(s Slot) {
	switch s.State {
	case SlotFree:
		return
	case SlotMalformed:
		p.event("Warning", EventSlotMalformed, "slot Lease %s/%s was not a valid grant (%s); reset it to free", lease.Namespace, s.Name, s.Problem)
		p.change(s, SlotChange{Op: OpReset, Why: WhyMalformed})
		if s.Kind == lease.KindReboot && s.Holder != "" {
			p.out.StopDrains = append(p.out.StopDrains, s.Holder)
		}
		return
	}
	g := s.Grant
	n, exists := p.nodes[g.Holder]
	reboot := s.Kind == lease.KindReboot
	// Ours: the grant records our cordon, or the Node carries our mark (we
	// stopped between cordoning and recording it).
	uncordon := reboot && exists && (s.CordonedByUs || (n.CordonedFor != "" && n.CordonedFor == lease.CordonMark(g.ID)))
	stop := func() {
		if reboot {
			p.out.StopDrains = append(p.out.StopDrains, g.Holder)
		}
	}
	if g.Failure != "" {
		p.failedSlot[g.Holder] = g.Failure
	}
	switch {
	case !exists && reboot && g.Phase == lease.PhaseReboot && p.in.Now.Before(g.Renewed.Add(p.b.RebootTimeout)):
		// The Node object is gone, but the machine may be down in its
		// reboot and come back under the same name: the slot stays held
		// until it is back (then it is verified as usual) or rebootTimeout
		// passed, so deleting a Node cannot let two nodes be down at once.
		p.requeueAt(g.Renewed.Add(p.b.RebootTimeout))
		p.goneHolders = append(p.goneHolders, g.Holder)
		return
	case !exists:
		stop()
		p.change(s, SlotChange{Op: OpRelease, Why: WhyNodeDeleted})
		p.nodeEvent(g.Holder, "Normal", EventGrantReleased, "released %s slot %s: node %s was deleted%s", s.Kind, s.Name, g.Holder, goneFor(reboot && g.Phase == lease.PhaseReboot, p.b.RebootTimeout))
		delete(p.failedSlot, g.Holder)
		return
	case !n.InPool:
		stop()
		p.change(s, SlotChange{Op: OpRevoke, Why: WhyLeftPool, Uncordon: uncordon})
		p.nodeEvent(g.Holder, "Normal", EventGrantRevoked, "revoked %s slot %s: node %s left the pool%s", s.Kind, s.Name, g.Holder, restored(uncordon))
		delete(p.failedSlot, g.Holder)
		return
	}
	st := p.fresh(n)
	if !reboot {
		p.stageSlot(s, n, st)
		return
	}
	if g.Phase == lease.PhaseReboot {
		back, soft := p.verifiedBack(n, st, g)
		p.trackBack(s, n, back)
		switch {
		case back && !p.readyLongEnough(s, n):
			// Back, but not for minReadySeconds yet (pacing.go).
		case back:
			how := "in a new boot"
			if soft {
				how = fmt.Sprintf("after a soft reboot (boot ID unchanged, soft-reboot count %d, granted at %d)", softCount(st), g.SoftRebootCount)
			}
			p.change(s, SlotChange{Op: OpRelease, Why: WhyVerified, Uncordon: uncordon})
			p.nodeEvent(n.Name, "Normal", EventNodeUpdated, "node %s is Ready, booted on %s %s; released reboot slot %s%s", n.Name, g.Image, how, s.Name, restored(uncordon))
			delete(p.failedSlot, g.Holder)
		case unusedInEarlierBoot(n, st, g):
			// The node went down some other way (power loss, a person)
			// before its agent used the grant, and is back: no reboot into
			// the image will come under it, and the locked stage is gone.
			// Up and Ready, it holds no budget; it is staged again.
			p.change(s, SlotChange{Op: OpRevoke, Why: WhyBootChanged, Uncordon: uncordon})
			p.nodeEvent(n.Name, "Warning", EventGrantRevoked, "revoked reboot slot %s: node %s came back in another boot (%s) without its agent having used the grant (%s); it will be staged and granted again%s",
				s.Name, n.Name, bootChange(n, st, g), fleetv1.ReasonRebootGrantUnused, restored(uncordon))
			delete(p.failedSlot, g.Holder)
		// renewTime is when the coordinator advanced the grant to Reboot;
		// no agent writes a Lease, so nothing a node does extends it.
		case g.Failure == "" && !p.in.Now.Before(g.Renewed.Add(p.b.RebootTimeout)):
			p.change(s, SlotChange{Op: OpMarkFailed, Failure: fleetv1.ReasonRebootTimeout, Why: WhyRebootTimeout})
			p.failedSlot[g.Holder] = fleetv1.ReasonRebootTimeout
			p.nodeEvent(n.Name, "Warning", EventRebootTimeout, "node %s did not come back Ready on %s in a new boot within %s (%s); slot %s stays held: repair the node (the slot is released once it is back on the image), delete the Node if it is gone, or uncordon it and delete the Lease",
				n.Name, g.Image, p.b.RebootTimeout, p.whyNotBack(n, st, g), s.Name)
		case g.Failure == "":
			p.requeueAt(g.Renewed.Add(p.b.RebootTimeout))
		}
		return
	}
	// Phase Draining.
	d, hasDrain := p.in.Drains[n.Name]
	hasDrain = hasDrain && d.Grant == g.ID
	switch {
	case p.target.Digest != "" && !p.isTarget(n.Name, g.Image):
		stop()
		p.change(s, SlotChange{Op: OpRevoke, Why: WhyImageChanged, Uncordon: uncordon})
		p.nodeEvent(n.Name, "Normal", EventGrantRevoked, "revoked reboot slot %s of node %s before its reboot: %s%s", s.Name, n.Name, p.changedTarget(n.Name), restored(uncordon))
	case n.BootID != g.BootID || (st != nil && softCount(st) != g.SoftRebootCount):
		stop()
		p.change(s, SlotChange{Op: OpRevoke, Why: WhyBootChanged, Uncordon: uncordon})
		p.nodeEvent(n.Name, "Warning", EventGrantRevoked, "revoked reboot slot %s: node %s rebooted outside the grant (%s)%s", s.Name, n.Name, bootChange(n, st, g), restored(uncordon))
	case st != nil && onDigest(st.Staged, g.Image.Digest) && !p.stagedForReboot(st, g.Image):
		// requireSignedImages was turned on after the stage: the node is
		// staged again, verified, before it may reboot.
		stop()
		p.change(s, SlotChange{Op: OpRevoke, Why: WhyUnverified, Uncordon: uncordon})
		p.nodeEvent(n.Name, "Warning", EventGrantRevoked, "revoked reboot slot %s of node %s before its reboot: its staged %s was fetched without enforcing the signature policy (signature %q) and the pool requires signed images; it will be staged again%s",
			s.Name, n.Name, g.Image, orUnknown(string(st.Staged.Signature)), restored(uncordon))
	case !n.Unschedulable:
		p.change(s, SlotChange{Op: OpCordon, Why: WhyCordon})
	case !s.CordonedByUs && n.CordonedFor != "" && n.CordonedFor == lease.CordonMark(g.ID):
		// We cordoned it for this grant but stopped before recording that.
		p.change(s, SlotChange{Op: OpCordon, Why: WhyCordon})
	case hasDrain && d.State == DrainDone:
		p.change(s, SlotChange{Op: OpAdvance, Why: WhyDrained})
		p.nodeEvent(n.Name, "Normal", EventDrained, "node %s drained; slot %s moves to phase Reboot", n.Name, s.Name)
	case hasDrain && d.State == DrainRunning:
		if d.Message != "" {
			p.drainMsgs = append(p.drainMsgs, fmt.Sprintf("%s: %s", n.Name, d.Message))
		}
	default:
		if hasDrain && d.State == DrainFailed {
			p.drainMsgs = append(p.drainMsgs, fmt.Sprintf("%s: %s", n.Name, d.Message))
			p.nodeEvent(n.Name, "Warning", EventDrainFailed, "drain of node %s did not finish within %s (attempt %d): %s; retrying, the node will not reboot until it drains",
				n.Name, p.b.DrainTimeout, d.Attempts, d.Message)
		}
		p.out.StartDrains = append(p.out.StartDrains, DrainStart{Node: n.Name, Grant: g.ID, Timeout: p.b.DrainTimeout})
	}
}

// stageSlot decides about a held stage slot of a node in the pool.
func (p *planner) stageSlot(s Slot, n Node, st *fleetv1.BootcNodeStatus) {
	g := s.Grant
	claim, claimed := claimOf(st, g.ID)
	switch {
	case st != nil && (p.stagedForReboot(st, g.Image) || onDigest(st.Booted, g.Image.Digest)):
		p.change(s, SlotChange{Op: OpRelease, Why: WhyStaged})
		p.nodeEvent(n.Name, "Normal", EventStaged, "node %s staged %s; released stage slot %s", n.Name, g.Image, s.Name)
	case p.target.Digest != "" && !p.isTarget(n.Name, g.Image):
		p.change(s, SlotChange{Op: OpRevoke, Why: WhyImageChanged})
		p.nodeEvent(n.Name, "Normal", EventGrantRevoked, "revoked stage slot %s of node %s: its image %s is no longer the node's target (%s)", s.Name, n.Name, g.Image, p.changedTarget(n.Name))
	case n.BootID != g.BootID || (st != nil && softCount(st) != g.SoftRebootCount):
		p.change(s, SlotChange{Op: OpRevoke, Why: WhyBootChanged})
		p.nodeEvent(n.Name, "Normal", EventGrantRevoked, "revoked stage slot %s: node %s rebooted since the grant (%s)", s.Name, n.Name, bootChange(n, st, g))
	case claimed && claim.Released != "":
		p.change(s, SlotChange{Op: OpRevoke, Why: WhyReleased})
		p.nodeEvent(n.Name, "Warning", EventGrantRevoked, "node %s let go of stage slot %s (%s: %s); the slot goes to the next node and %s waits at the back of the queue",
			n.Name, s.Name, claim.Released, truncate(st.Message, 300), n.Name)
	default:
		// Alive from the grant (the coordinator's own write) or from the
		// last heartbeat that listed it, as the coordinator saw it.
		alive := g.Acquired
		if hb := p.in.Heartbeats[n.Name].Seen; claimed && hb.After(alive) {
			alive = hb
		}
		if !p.in.Now.Before(alive.Add(g.Duration)) {
			p.change(s, SlotChange{Op: OpRelease, Why: WhyExpired})
			p.nodeEvent(n.Name, "Warning", EventGrantReleased, "stage slot %s of node %s expired: no report of its agent listing the grant seen for %s (since %s); released it",
				s.Name, n.Name, g.Duration, alive.UTC().Format(time.RFC3339))
			return
		}
		p.requeueAt(alive.Add(g.Duration))
	}
}

// claimOf finds grant id in the agent's fresh status.
func claimOf(st *fleetv1.BootcNodeStatus, id lease.ID) (fleetv1.GrantInUse, bool) {
	if st == nil {
		return fleetv1.GrantInUse{}, false
	}
	for _, c := range st.Grants {
		if c.Lease == id.Lease && c.UID == id.UID && c.LeaseTransitions == id.Transitions {
			return c, true
		}
	}
	return fleetv1.GrantInUse{}, false
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-len("…")] + "…"
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

// holdsAfter returns the slots node holds once Changes are applied.
func (p *planner) holdsAfter() map[string][]*Slot {
	h := map[string][]*Slot{}
	for _, s := range p.after {
		if s.State != SlotFree && s.Holder != "" {
			h[s.Holder] = append(h[s.Holder], s)
		}
	}
	return h
}

func (p *planner) countAfter(k lease.Kind) int {
	c := 0
	for _, s := range p.after {
		if s.Kind == k && s.State != SlotFree {
			c++
		}
	}
	return c
}

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

func (p *planner) failures() int {
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

func (p *planner) halted() bool { return p.failures() >= p.b.HaltAfterFailures }

// grant hands free slots to eligible nodes, in name order.
func (p *planner) grant(slots []Slot) {
	if p.target.Digest == "" || p.in.ResolveError != "" || p.b.Paused {
		return
	}
	free := map[lease.Kind][]Slot{}
	for _, s := range slots {
		if s.State == SlotFree && s.Index < p.budgetFor(s.Kind) {
			free[s.Kind] = append(free[s.Kind], s)
		}
	}
	holds := p.holdsAfter()
	stillStaging := p.stagingWithoutSlot(holds)
	heldReboot, heldStage := p.countAfter(lease.KindReboot), p.countAfter(lease.KindStage)+len(stillStaging)
	other := p.otherwiseUnavailable(holds)

	// Reboot grants: nodes already unavailable for other reasons first, since
	// moving one of them into a slot costs no extra budget.
	var rebootable []string
	for _, name := range p.members {
		n := p.nodes[name]
		st := p.fresh(n)
		tgt, ok := p.targetOf(name)
		if !ok || p.conflicted(n) || n.Held || len(holds[name]) > 0 || !n.Ready || st == nil || !p.desiredIsTarget(name) {
			continue
		}
		if st.Phase == fleetv1.PhaseDegraded || onDigest(st.Booted, tgt.Digest) {
			continue
		}
		if p.stagedForReboot(st, tgt) && st.Staged.DownloadOnly {
			rebootable = append(rebootable, name)
		}
	}
	rebootable = RebootOrder(rebootable, func(name string) bool { return other[name] })
	granted := map[string]bool{}
	if !p.halted() && p.rebootGrantsAllowed(heldReboot) {
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
			p.nodeEvent(name, "Normal", EventRebootGranted, "granted reboot slot %s to node %s for %s: cordon and drain, then reboot", s.Name, name, tgt)
		}
	}

	for _, name := range p.stageQueue() {
		if len(free[lease.KindStage]) == 0 || heldStage >= p.b.MaxStaging || !p.stageGrantsAllowed() {
			break
		}
		n := p.nodes[name]
		st := p.fresh(n)
		tgt, ok := p.targetOf(name)
		if !ok || granted[name] || stillStaging[name] || p.conflicted(n) || n.Held || len(holds[name]) > 0 || !n.Ready || st == nil || !p.desiredIsTarget(name) {
			continue
		}
		if st.Phase == fleetv1.PhaseDegraded || onDigest(st.Booted, tgt.Digest) || p.stagedForReboot(st, tgt) {
			continue
		}
		s := free[lease.KindStage][0]
		free[lease.KindStage] = free[lease.KindStage][1:]
		p.grantSlot(s, n, tgt, st)
		heldStage++
		p.nodeEvent(name, "Normal", EventStageGranted, "granted stage slot %s to node %s for %s", s.Name, name, tgt)
	}
}

// stagingWithoutSlot finds nodes that hold no stage slot but report, in
// their current boot, a stage under way: a revoked holder downloads until
// its agent sees the revoke and cancels. Until it reports that it stopped
// (or goes quiet for a lease duration, as an unrenewed grant would), its
// download counts against maxStaging, so its slot is not handed on early.
func (p *planner) stagingWithoutSlot(holds map[string][]*Slot) map[string]bool {
	out := map[string]bool{}
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
		slot := false
		for _, s := range holds[name] {
			slot = slot || s.Kind == lease.KindStage
		}
		if !slot {
			out[name] = true
			p.requeueAt(quiet)
		}
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

// isTarget: img is node name's target.
func (p *planner) isTarget(name string, img imageref.Pinned) bool {
	tgt, ok := p.targetOf(name)
	return ok && tgt == img
}

// stageQueue is the order stage slots are offered in (StageOrder).
func (p *planner) stageQueue() []string {
	return StageOrder(p.members, func(name string) bool {
		st := p.fresh(p.nodes[name])
		return st != nil && st.Reason == fleetv1.ReasonStageFailed
	})
}

// grantSlot grants s to n for img, recording n's boot: the kubelet's boot ID
// and the soft-reboot count its agent reported in that boot (callers grant
// only to nodes with a fresh status, so the two belong to the same boot).
func (p *planner) grantSlot(s Slot, n Node, img imageref.Pinned, st *fleetv1.BootcNodeStatus) {
	c := SlotChange{Op: OpGrant, Node: n.Name, Image: img, BootID: n.BootID, SoftRebootCount: softCount(st), Why: WhyEligible}
	p.change(s, c)
	a := p.after[s.Name]
	*a = Slot{Name: s.Name, Kind: s.Kind, Index: s.Index, State: SlotHeld, Holder: n.Name,
		Grant: lease.Grant{Pool: p.pool, Kind: s.Kind, Holder: n.Name, Image: img, BootID: n.BootID, SoftRebootCount: c.SoftRebootCount}}
	if s.Kind == lease.KindReboot {
		a.Grant.Phase = lease.PhaseDraining
	}
}

// membership keeps one BootcNode per (unconflicted) pool node and removes
// those of nodes that left.
func (p *planner) membership() {
	holds := p.holdsAfter()
	for _, name := range p.members {
		n := p.nodes[name]
		if p.conflicted(n) {
			continue
		}
		desired := ""
		if tgt, ok := p.targetOf(name); ok {
			desired = tgt.String()
		}
		// A reboot already under way finishes on the image it was granted for.
		for _, s := range holds[name] {
			if s.State == SlotHeld && s.Kind == lease.KindReboot && s.Grant.Phase == lease.PhaseReboot {
				desired = s.Grant.Image.String()
			}
		}
		spec := fleetv1.BootcNodeSpec{Pool: p.pool, DesiredImage: desired, RebootPolicy: p.rebootPolicy(), RequireSignedImages: p.in.Pool.Spec.RequireSignedImages}
		bn := p.bns[name]
		if bn != nil && bn.Spec.Pool != p.pool {
			continue // still another pool's; that pool removes it once the node left it
		}
		c := BootcNodeChange{Name: name, Spec: spec, NoPlatformImage: p.noPlatformImage(name, bn)}
		c.RolloutState, c.RolloutReason = p.explain(name, holds)
		switch {
		case bn == nil:
			p.out.CreateBootcNodes = append(p.out.CreateBootcNodes, c)
		case bn.Spec != spec || bn.Annotations[fleetv1.AnnotationNoPlatformImage] != c.NoPlatformImage ||
			bn.Annotations[fleetv1.AnnotationRolloutState] != c.RolloutState || bn.Annotations[fleetv1.AnnotationRolloutReason] != c.RolloutReason:
			p.out.UpdateBootcNodes = append(p.out.UpdateBootcNodes, c)
		}
	}
	var gone []string
	for name, bn := range p.bns {
		if bn.Spec.Pool != p.pool {
			continue
		}
		if n, ok := p.nodes[name]; !ok || !n.InPool {
			gone = append(gone, name)
		}
	}
	sort.Strings(gone)
	p.out.DeleteBootcNodes = gone
}

func (p *planner) rebootPolicy() fleetv1.RebootPolicy {
	if p.in.Pool.Spec.RebootPolicy == "" {
		return fleetv1.RebootPolicyReboot
	}
	return p.in.Pool.Spec.RebootPolicy
}

func joinMax(items []string, max int) string {
	if len(items) <= max {
		return strings.Join(items, ", ")
	}
	return strings.Join(items[:max], ", ") + fmt.Sprintf(" and %d more", len(items)-max)
}
