package plan

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/platform"
)

// Defaults of the pool's rollout fields, for objects the API server did not default.
const (
	DefaultDrainTimeout      = 10 * time.Minute
	DefaultRebootTimeout     = 15 * time.Minute
	DefaultStageTimeout      = lease.DefaultStageTimeout
	DefaultHaltAfterFailures = 1
)

// Budget is a pool's resolved rollout bounds.
type Budget struct {
	MaxUnavailable int
	MaxStaging     int
	DrainTimeout   time.Duration
	RebootTimeout  time.Duration
	// StageTimeout bounds one stage (amendment 19); within
	// lease.MinStageTimeout..lease.MaxStageTimeout.
	StageTimeout      time.Duration
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
		StageTimeout:      DefaultStageTimeout,
		HaltAfterFailures: DefaultHaltAfterFailures,
		Paused:            spec.Paused,
	}
	if spec.DrainTimeout != nil && spec.DrainTimeout.Duration > 0 {
		b.DrainTimeout = spec.DrainTimeout.Duration
	}
	if spec.RebootTimeout != nil && spec.RebootTimeout.Duration > 0 {
		b.RebootTimeout = spec.RebootTimeout.Duration
	}
	// The CRD schema refuses values out of bounds; an object that got past
	// it (an older schema) gets the default, never an unbounded stage.
	if spec.StageTimeout != nil && spec.StageTimeout.Duration >= lease.MinStageTimeout && spec.StageTimeout.Duration <= lease.MaxStageTimeout {
		b.StageTimeout = spec.StageTimeout.Duration
	}
	if spec.HaltAfterFailures != nil && *spec.HaltAfterFailures >= 1 {
		b.HaltAfterFailures = int(*spec.HaltAfterFailures)
	}
	return b
}

// MaxSlots bounds a budget, so a typo cannot create thousands of Leases (slot
// indexes are at most 4 digits).
const MaxSlots = 1000

func scaled(v *intstr.IntOrString, def intstr.IntOrString, size int) int {
	n, err := intstr.GetScaledValueFromIntOrPercent(intstr.ValueOrDefault(v, def), size, true)
	if err != nil || n < 1 {
		return 1
	}
	return min(n, MaxSlots)
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
	// read: the slots as read, in the Input's order, with their phases
	// (withFinished); never changed.
	read []Slot
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
	// freshOf and conflict: per-node facts asked many times a pass, found
	// once (at 1,000 nodes re-deriving them was most of a pass's CPU).
	freshOf  map[string]freshStatus
	conflict map[string]bool
	// staging: nodes reporting Staging without a stage grant (amendments 7
	// and 20), once the held slots are settled.
	staging ungrantedStaging
	// failureCount is failures() once the held slots are settled.
	failureCount  int
	failuresKnown bool
	// quarantine is the pool's quarantined target while spec.image is the
	// one it failed under (gate.go); nil: none.
	quarantine *fleetv1.Quarantine
	// gateFailing: a gate fails in this pass (gatesFailing).
	gateFailing bool
	// waves: the canaries and the zone now rolling (canary.go), found once
	// the held slots are settled.
	waves *waveState
}

type freshStatus struct {
	bootID string
	status *fleetv1.BootcNodeStatus
}

// Plan decides the changes for one pool. It is pure and deterministic: the
// same Input gives the same Output.
func Plan(in Input) Output {
	p := &planner{
		in:         in,
		pool:       in.Pool.Name,
		nodes:      make(map[string]Node, len(in.Nodes)),
		bns:        make(map[string]*fleetv1.BootcNode, len(in.BootcNodes)),
		members:    make([]string, 0, len(in.Nodes)),
		after:      map[string]*Slot{},
		uncordoned: map[string]bool{},
		failedSlot: map[string]string{},
		targets:    make(map[string]imageref.Pinned, len(in.Nodes)),
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
	p.freshOf, p.conflict = make(map[string]freshStatus, len(in.Nodes)), make(map[string]bool, len(in.Nodes))
	for _, n := range in.Nodes {
		p.freshOf[n.Name] = freshStatus{bootID: n.BootID, status: p.readFresh(n)}
		p.conflict[n.Name] = len(n.OtherPools) > 0 || len(validation.IsValidLabelValue(n.Name)) > 0
	}
	if in.Target.Digest != "" {
		p.target = in.Target
	}
	p.b = ResolveBudget(in.Pool.Spec.Rollout, len(p.members))
	p.nodeTargets()
	p.win = evalWindows(in.Pool.Spec.Rollout.Windows, in.Now)
	p.startQuarantine()

	// Each slot's phase is derived once a pass (WithFinished), and the
	// copies the pass makes of the slots are one slice each.
	p.read = p.withFinished(in.Slots)
	for _, s := range p.read {
		if s.Phase == PhaseFinished {
			if p.out.FinishedSlots == nil {
				p.out.FinishedSlots = map[lease.ID]bool{}
			}
			p.out.FinishedSlots[s.Grant.ID] = true
		}
	}
	slots := slices.Clone(p.read)
	sort.Slice(slots, func(i, j int) bool {
		if slots[i].Kind != slots[j].Kind {
			return slots[i].Kind < slots[j].Kind
		}
		return slots[i].Index < slots[j].Index
	})
	after := slices.Clone(slots)
	for i := range after {
		p.after[after[i].Name] = &after[i]
	}

	p.ensureSlots(slots)
	p.gateFailing = p.gatesFailing(slots)
	for i := range slots {
		p.held(slots[i])
	}
	// The held slots settled every node's failure: count them once, not
	// once per waiting node's explanation.
	p.failureCount, p.failuresKnown = p.countFailures(), true
	p.staging = p.stagingWithoutSlot(p.holdsAfter())
	p.out.StagingWithoutGrant = p.staging.all()
	p.grant(slots)
	p.membership()
	p.status()
	return p.out
}

// withFinished derives the phase of every slot, a stage slot's from its
// holder's fresh report (WithFinished).
func (p *planner) withFinished(slots []Slot) []Slot {
	return WithFinished(slots, func(name string) (Node, *fleetv1.BootcNodeStatus, bool) {
		n, ok := p.nodes[name]
		if !ok {
			return Node{}, nil, false
		}
		return n, p.fresh(n), true
	}, p.in.Pool.Spec.RequireSignedImages)
}

// conflicted: the node is matched by another pool too, or its name cannot be
// a label value; the pool acts on none of these.
func (p *planner) conflicted(n Node) bool {
	if c, ok := p.conflict[n.Name]; ok {
		return c
	}
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
	if f, ok := p.freshOf[n.Name]; ok && f.bootID == n.BootID {
		return f.status
	}
	return p.readFresh(n)
}

func (p *planner) readFresh(n Node) *fleetv1.BootcNodeStatus {
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
		if c.Op == OpRelease && (c.Why == WhyVerified || c.Why == WhyRolledBack || c.Why == WhyRolledBackByHost) {
			a.ReleasedAt = p.in.Now
		}
		if c.Uncordon {
			p.uncordoned[c.Node] = true
		}
	case OpAdvance:
		a.Grant.Phase = lease.PhaseReboot
		a.CordonedByUs = c.CordonedByUs
	case OpMarkFailed:
		a.Grant.Failure = c.Failure
	case OpMarkBack:
		a.BackSince = c.BackSince
		a.CameBack = a.CameBack || !c.BackSince.IsZero()
	}
	a.Phase = PhaseOf(*a)
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

// holdsAfter returns the slots node holds once Changes are applied. A
// finished stage slot is no hold: its holder is done with it, and it is
// handed on to whoever needs a stage slot next, its holder included.
func (p *planner) holdsAfter() map[string][]*Slot {
	h := map[string][]*Slot{}
	for _, s := range p.after {
		if s.State != SlotFree && s.Holder != "" && s.Phase != PhaseFinished {
			h[s.Holder] = append(h[s.Holder], s)
		}
	}
	return h
}

func (p *planner) countAfter(k lease.Kind) int {
	c := 0
	for _, s := range p.after {
		if s.Kind == k && s.State != SlotFree && s.Phase != PhaseFinished {
			c++
		}
	}
	return c
}

// membership keeps one BootcNode per (unconflicted) pool node and removes
// those of nodes that left. It emits creations and changes in the queue
// order (writeOrder), which the controller writes them in.
func (p *planner) membership() {
	holds := p.holdsAfter()
	for _, name := range p.writeOrder() {
		n := p.nodes[name]
		if p.conflicted(n) {
			continue
		}
		desired := ""
		if tgt, ok := p.targetOf(name); ok {
			desired = tgt.String()
		}
		if p.quarantined() {
			desired = "" // nothing to stage while the target is quarantined
		}
		// A reboot already under way finishes on the image it was granted
		// for; a rollback grant's node goes back to its previous image.
		for _, s := range holds[name] {
			if s.Phase.afterDrain() || (s.Phase.Grant() && s.Grant.Rollback) {
				desired = s.Grant.Image.String()
			}
		}
		spec := fleetv1.BootcNodeSpec{Pool: p.pool, DesiredImage: desired, RebootPolicy: p.rebootPolicy(), RequireSignedImages: p.in.Pool.Spec.RequireSignedImages,
			Health: p.nodeHealth(desired)}
		bn := p.bns[name]
		if bn != nil && bn.Spec.Pool != p.pool {
			continue // still another pool's; that pool removes it once the node left it
		}
		c := BootcNodeChange{Name: name, Spec: spec, NoPlatformImage: p.noPlatformImage(name, bn)}
		tgt, hasTarget := p.targetOf(name)
		c.RolloutState, c.RolloutReason = p.explain(name, holds, hasTarget && desired == tgt.String())
		c.Slots = slotNames(holds[name])
		switch {
		case bn == nil:
			p.out.CreateBootcNodes = append(p.out.CreateBootcNodes, c)
		case !equality.Semantic.DeepEqual(bn.Spec, spec) || bn.Annotations[fleetv1.AnnotationNoPlatformImage] != c.NoPlatformImage ||
			bn.Annotations[fleetv1.AnnotationRolloutState] != c.RolloutState || bn.Annotations[fleetv1.AnnotationRolloutReason] != c.RolloutReason ||
			!hasSlots(bn, c.Slots):
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

// slotNames are the names of the slots of held its agent is to watch,
// sorted (never nil: the annotation is written even with no slot, so the
// agent knows to follow it). An update's reboot grant is named from phase
// Reboot on: while it drains the agent has nothing to do under it and
// lists it nowhere (amendments 18 and 37), so the name goes in the patch
// that says Rebooting, which the advance makes due anyway, not in a patch
// of its own at the grant (amendment 39). A rollback grant is named at once:
// its agent lists and heartbeats it from the grant on.
func slotNames(held []*Slot) []string {
	names := make([]string, 0, len(held))
	for _, s := range held {
		if s.Kind == lease.KindReboot && s.Phase == PhaseDraining && !s.Grant.Rollback {
			continue
		}
		names = append(names, s.Name)
	}
	slices.Sort(names)
	return names
}

// hasSlots says whether bn's AnnotationSlots already says names.
func hasSlots(bn *fleetv1.BootcNode, names []string) bool {
	v, ok := bn.Annotations[fleetv1.AnnotationSlots]
	return ok && v == fleetv1.SlotsValue(names)
}

// namesSlot says whether bn lets its agent see slot: the annotation names it,
// or is absent (an agent then watches every Lease labelled with its node).
func namesSlot(bn *fleetv1.BootcNode, slot string) bool {
	names, present, err := fleetv1.SlotsOf(bn)
	return !present || (err == nil && slices.Contains(names, slot))
}

// writeOrder is the order of CreateBootcNodes and UpdateBootcNodes: the
// order stage slots are offered in (stageQueue: the canaries, then the zone
// rolling, then zone by zone, by name, a node whose last stage failed
// behind the others), which is the order its nodes can stage in and so be
// staged for a reboot grant. A node stages only once its BootcNode asks for
// the target, and a pool's patches take a while to land (at 1,000 nodes
// seconds), so written in this order the first wave's nodes have their
// target before the next wave's, and the canaries before anyone.
func (p *planner) writeOrder() []string {
	return p.stageQueue()
}

func (p *planner) rebootPolicy() fleetv1.RebootPolicy {
	if p.in.Pool.Spec.RebootPolicy == "" {
		return fleetv1.RebootPolicyReboot
	}
	return p.in.Pool.Spec.RebootPolicy
}

func joinMax(items []string, limit int) string {
	if len(items) <= limit {
		return strings.Join(items, ", ")
	}
	return strings.Join(items[:limit], ", ") + fmt.Sprintf(" and %d more", len(items)-limit)
}
