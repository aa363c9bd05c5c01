package kubectl

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/plan"
)

// reader reads the fleet at one instant, now.
type reader struct {
	c   client.Client
	now time.Time
}

// poolView is one pool as read: its slots and, when read with nodes, its
// members (Nodes its selector matches, and Nodes whose BootcNode names it).
type poolView struct {
	now     time.Time
	pool    *fleetv1.BootcNodePool
	budget  plan.Budget
	slots   []plan.Slot // by kind, then index
	members []string    // sorted
	nodes   map[string]*corev1.Node
	bns     map[string]*fleetv1.BootcNode
	// leases are the slot Leases as read; queues caches queue by kind.
	leases []coordinationv1.Lease
	queues map[lease.Kind][]string
}

func (r *reader) pools(ctx context.Context) ([]fleetv1.BootcNodePool, error) {
	var l fleetv1.BootcNodePoolList
	if err := r.c.List(ctx, &l); err != nil {
		return nil, apiError(err, "list", "bootcnodepools.fleet.bootc.dev")
	}
	sort.Slice(l.Items, func(i, j int) bool { return l.Items[i].Name < l.Items[j].Name })
	return l.Items, nil
}

func (r *reader) pool(ctx context.Context, name string) (*fleetv1.BootcNodePool, error) {
	p := &fleetv1.BootcNodePool{}
	if err := r.c.Get(ctx, client.ObjectKey{Name: name}, p); err != nil {
		if isNotFound(err) {
			return nil, fmt.Errorf("BootcNodePool %q not found", name)
		}
		return nil, apiError(err, "get", "bootcnodepools.fleet.bootc.dev")
	}
	return p, nil
}

// slotLeases lists the slot Leases by pool.
func (r *reader) slotLeases(ctx context.Context) (map[string][]coordinationv1.Lease, error) {
	var l coordinationv1.LeaseList
	if err := r.c.List(ctx, &l, client.InNamespace(lease.Namespace), client.HasLabels{lease.LabelPool}); err != nil {
		return nil, apiError(err, "list", "leases.coordination.k8s.io in namespace "+lease.Namespace)
	}
	out := map[string][]coordinationv1.Lease{}
	for _, x := range l.Items {
		out[x.Labels[lease.LabelPool]] = append(out[x.Labels[lease.LabelPool]], x)
	}
	return out, nil
}

// newView is pool p as read, without its slots yet.
func (r *reader) newView(p *fleetv1.BootcNodePool) *poolView {
	return &poolView{now: r.now, pool: p, budget: plan.ResolveBudget(p.Spec.Rollout, int(p.Status.Nodes))}
}

// view is pool p with its slots, from the slot Leases leases.
func (r *reader) view(p *fleetv1.BootcNodePool, leases []coordinationv1.Lease) *poolView {
	v := r.newView(p)
	v.setSlots(leases)
	return v
}

// setSlots parses the pool's slot Leases. Read them after the members: the
// coordinator moves a slot first and writes its note on the BootcNode
// later, so slots read last are never older than the notes (see current).
func (v *poolView) setSlots(leases []coordinationv1.Lease) {
	v.leases = leases
	v.slots, v.queues = nil, nil
	for i := range leases {
		if s, ok := plan.ParseSlot(v.pool.Name, &leases[i]); ok {
			v.slots = append(v.slots, s)
		}
	}
	// A stage slot's phase from its holder's report: Finished once it is
	// done with the grant (amendment 31), as the coordinator finds it.
	v.slots = plan.WithFinished(v.slots, v.slotHolder, v.pool.Spec.RequireSignedImages)
	sort.Slice(v.slots, func(i, j int) bool {
		if v.slots[i].Kind != v.slots[j].Kind {
			return v.slots[i].Kind < v.slots[j].Kind
		}
		return v.slots[i].Index < v.slots[j].Index
	})
}

// slotHolder is a slot holder's Node and its agent's report if read in the
// Node's current boot (plan.WithFinished).
func (v *poolView) slotHolder(name string) (plan.Node, *fleetv1.BootcNodeStatus, bool) {
	n := v.nodes[name]
	if n == nil {
		return plan.Node{}, nil, false
	}
	pn := plan.Node{Name: name, BootID: n.Status.NodeInfo.BootID}
	bn := v.bns[name]
	if bn == nil || bn.Status.BootID != pn.BootID || bn.Status.SoftRebootCount < 0 || bn.Status.SoftRebootCount > math.MaxUint32 {
		return pn, nil, true
	}
	return pn, &bn.Status, true
}

// withNodes reads the pool's members.
func (r *reader) withNodes(ctx context.Context, v *poolView) error {
	sel, err := metav1.LabelSelectorAsSelector(&v.pool.Spec.NodeSelector)
	if err != nil {
		return fmt.Errorf("BootcNodePool %s has a nodeSelector that cannot be read: %w", v.pool.Name, err)
	}
	var nodes corev1.NodeList
	if err := r.c.List(ctx, &nodes); err != nil {
		return apiError(err, "list", "nodes")
	}
	var bns fleetv1.BootcNodeList
	if err := r.c.List(ctx, &bns); err != nil {
		return apiError(err, "list", "bootcnodes.fleet.bootc.dev")
	}
	v.nodes, v.bns = map[string]*corev1.Node{}, map[string]*fleetv1.BootcNode{}
	in := map[string]bool{}
	for i := range bns.Items {
		if bn := &bns.Items[i]; bn.Spec.Pool == v.pool.Name {
			v.bns[bn.Name], in[bn.Name] = bn, true
		}
	}
	for i := range nodes.Items {
		n := &nodes.Items[i]
		if sel.Matches(labels.Set(n.Labels)) || in[n.Name] {
			v.nodes[n.Name], in[n.Name] = n, true
		}
	}
	for name := range in {
		v.members = append(v.members, name)
	}
	sort.Strings(v.members)
	return nil
}

// SlotHolder is a held slot: who holds it, doing what, since when.
type SlotHolder struct {
	Slot string `json:"slot"` // the slot Lease's name
	Kind string `json:"kind"` // reboot or stage
	Node string `json:"node"`
	// Phase is what the holder does under it: Staging, Finished (a stage
	// slot its holder is done with, handed on by the next stage grant:
	// amendment 31), Draining,
	// Rebooting, Verifying (back, minReadySeconds running), Failed (did
	// not come back within rebootTimeout), or Malformed (the coordinator
	// resets the slot).
	Phase string `json:"phase"`
	// Since is when that phase began: the grant (acquireTime) for Staging
	// and Draining, the move to phase Reboot (renewTime) for Rebooting and
	// Failed, the first verified sight of the node back for Verifying.
	Since *metav1.Time `json:"since,omitempty"`
	// For is Since as a duration at the report's time, e.g. 1m40s.
	For   string `json:"for,omitempty"`
	Image string `json:"image,omitempty"`
}

func (v *poolView) holder(s plan.Slot) SlotHolder {
	h := SlotHolder{Slot: s.Name, Kind: string(s.Kind), Node: s.Holder, Phase: string(s.Phase)}
	var since time.Time
	switch g := s.Grant; s.Phase {
	case plan.PhaseStaging, plan.PhaseDraining:
		since = g.Acquired
	case plan.PhaseVerifying:
		// Back since then; or came back and fell over since: waiting to be
		// back for minReadySeconds, from the move to phase Reboot.
		since = s.BackSince
		if since.IsZero() {
			since = g.Renewed
		}
	case plan.PhaseRebooting, plan.PhaseFailed:
		since = g.Renewed
	}
	if s.Phase.Grant() {
		h.Image = s.Grant.Image.String()
	}
	if !since.IsZero() {
		h.Since = &metav1.Time{Time: since.UTC()}
		h.For = age(v.now.Sub(since))
	}
	return h
}

// holders are the held slots of kind k but finished ones, which hold no
// capacity (finished counts those).
func (v *poolView) holders(k lease.Kind) []SlotHolder {
	var out []SlotHolder
	for _, s := range v.slots {
		if s.Kind == k && s.State != plan.SlotFree && s.Phase != plan.PhaseFinished {
			out = append(out, v.holder(s))
		}
	}
	return out
}

// finished counts the stage slots whose holders are done with them.
func (v *poolView) finished() int {
	c := 0
	for _, s := range v.slots {
		if s.Phase == plan.PhaseFinished {
			c++
		}
	}
	return c
}

func (v *poolView) slotsOf(node string) []SlotHolder {
	var out []SlotHolder
	for _, s := range v.slots {
		if s.State != plan.SlotFree && s.Holder == node {
			out = append(out, v.holder(s))
		}
	}
	return out
}

func (v *poolView) state(name string) (state, reason string) {
	if bn := v.bns[name]; bn != nil {
		return bn.Annotations[fleetv1.AnnotationRolloutState], bn.Annotations[fleetv1.AnnotationRolloutReason]
	}
	return "", ""
}

func (v *poolView) ready(name string) bool {
	n := v.nodes[name]
	if n == nil {
		return false
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func (v *poolView) held(name string) bool {
	n := v.nodes[name]
	if n == nil {
		return false
	}
	_, ok := n.Annotations[fleetv1.AnnotationHold]
	return ok
}

// stagingWithoutGrant: members whose agent reports phase Staging in the
// Node's current boot while they hold no stage slot. The coordinator counts
// each against maxStaging for a bound, then names it on the pool as
// holding staging capacity without a grant (amendment 20).
func (v *poolView) stagingWithoutGrant() []string {
	var out []string
	for _, m := range v.members {
		if v.stagesWithoutGrant(m) {
			out = append(out, m)
		}
	}
	return out
}

// stagesWithoutGrant: member m's agent reports phase Staging in the Node's
// current boot while m holds no stage slot.
func (v *poolView) stagesWithoutGrant(m string) bool {
	bn, n := v.bns[m], v.nodes[m]
	if bn == nil || n == nil || bn.Status.Phase != fleetv1.PhaseStaging || bn.Status.BootID != n.Status.NodeInfo.BootID {
		return false
	}
	for _, s := range v.slots {
		if s.Kind == lease.KindStage && s.State != plan.SlotFree && s.Holder == m {
			return false
		}
	}
	return true
}

func (v *poolView) holdsReboot(name string) bool {
	for _, s := range v.slots {
		if s.Kind == lease.KindReboot && s.State != plan.SlotFree && s.Holder == name {
			return true
		}
	}
	return false
}

// otherwiseUnavailable: members NotReady or cordoned that hold no reboot
// slot; the coordinator counts them against maxUnavailable.
func (v *poolView) otherwiseUnavailable(name string) bool {
	n := v.nodes[name]
	return n != nil && !v.holdsReboot(name) && (!v.ready(name) || n.Spec.Unschedulable)
}

// queue is the nodes waiting for a slot of kind k, in the order the
// coordinator offers it: those the coordinator reports waiting for one,
// Ready and not held (it grants nothing to others).
func (v *poolView) queue(k lease.Kind) []string {
	want := fleetv1.RolloutWaitingForStageSlot
	if k == lease.KindReboot {
		want = fleetv1.RolloutWaitingForRebootSlot
	}
	if q, ok := v.queues[k]; ok {
		return q
	}
	var waiting []string
	for _, name := range v.members {
		if st, _ := v.current(name); st == want && v.ready(name) && !v.held(name) {
			waiting = append(waiting, name)
		}
	}
	q := plan.StageOrder(waiting, v.lastStageFailed)
	if k == lease.KindReboot {
		q = plan.RebootOrder(waiting, v.otherwiseUnavailable)
	}
	q = plan.WaveOrder(q, v.waves())
	if v.queues == nil {
		v.queues = map[lease.Kind][]string{}
	}
	v.queues[k] = q
	return q
}

// waves is the rollout's waves as the pool's status and Nodes show them
// (amendment 26): its canaries while they still go alone, each node's zone
// and the zone under way (a node of it holds a reboot slot that is not
// failed), for plan.WaveOrder.
func (v *poolView) waves() plan.Waves {
	w := plan.Waves{Canary: v.canaryAlone, Zone: v.zone}
	for _, s := range v.slots {
		if s.Kind == lease.KindReboot && s.State == plan.SlotHeld && s.Phase != plan.PhaseFailed && v.nodes[s.Holder] != nil {
			w.Rolling, w.HasRolling = v.zone(s.Holder), true
			break
		}
	}
	return w
}

// zone is the node's zone label under the pool's zoneOrder (plan.ZoneOf).
func (v *poolView) zone(name string) string {
	if n := v.nodes[name]; n != nil {
		return plan.ZoneOf(v.pool.Spec.Rollout.ZoneOrder, n.Labels[fleetv1.LabelZone])
	}
	return ""
}

// canary: name is one of the canaries of the pool's target.
func (v *poolView) canary(name string) bool {
	c := v.pool.Status.Canary
	return c != nil && c.Target == v.pool.Status.TargetImage && slices.Contains(c.Nodes, name)
}

// canaryAlone: name is a canary and the canaries still go alone (not all
// passed, or the soak since is still running).
func (v *poolView) canaryAlone(name string) bool {
	return v.canary(name) && v.canariesAlone()
}

func (v *poolView) canariesAlone() bool {
	c := v.pool.Status.Canary
	if c == nil || c.Target != v.pool.Status.TargetImage {
		return false
	}
	if c.PassedTime == nil {
		return true
	}
	var soak time.Duration
	if s := v.pool.Spec.Rollout.Canary; s != nil && s.Soak != nil {
		soak = s.Soak.Duration
	}
	return v.now.Before(c.PassedTime.Add(soak))
}

// waveText says which wave a waiting node waits for, if any ("" none).
func (v *poolView) waveText(name string) string {
	w := v.waves()
	switch {
	case v.canariesAlone() && !v.canary(name):
		return "after the canaries (" + andList(v.pool.Status.Canary.Nodes) + ")"
	case w.HasRolling && v.zone(name) != w.Rolling:
		return "after zone " + zoneText(w.Rolling) + " (zoneOrder Sequential)"
	}
	return ""
}

func zoneText(z string) string {
	if z == "" {
		return "(none)"
	}
	return z
}

func (v *poolView) lastStageFailed(name string) bool {
	bn := v.bns[name]
	return bn != nil && plan.LastStageFailed(bn.Status.Reason)
}

// Queue is a node's place in the queue for a slot.
type Queue struct {
	Kind     string `json:"kind"`     // reboot or stage
	Position int    `json:"position"` // 1 is next in line
	Of       int    `json:"of"`       // nodes in the queue
}

// NodeReport is a node's place in its pool's rollout, with the live part.
type NodeReport struct {
	Name string `json:"name"`
	// State is the coordinator's word (fleet.bootc.dev/rollout-state);
	// empty while the node has no BootcNode yet. Where the live slots are
	// newer than that word (the node got or gave up a slot since the
	// coordinator wrote it), it is the state the slots show, and
	// CoordinatorState is the word as written.
	State            string `json:"state"`
	CoordinatorState string `json:"coordinatorState,omitempty"`
	// Reason is the live explanation: for nodes waiting for a slot, who
	// holds the slots, for how long, and how many nodes are ahead;
	// otherwise the coordinator's reason.
	Reason string `json:"reason"`
	// CoordinatorReason is fleet.bootc.dev/rollout-reason as written.
	CoordinatorReason string       `json:"coordinatorReason,omitempty"`
	Queue             *Queue       `json:"queue,omitempty"`
	Slots             []SlotHolder `json:"slots,omitempty"`
	// Zone is the Node's topology.kubernetes.io/zone label; Canary: the
	// node is one of the canaries of the pool's target (amendment 26).
	Zone   string `json:"zone,omitempty"`
	Canary bool   `json:"canary,omitempty"`
	// Hold is the Node's fleet.bootc.dev/hold annotation, when present.
	Hold *string `json:"hold,omitempty"`
}

func (v *poolView) nodeReport(name string) NodeReport {
	stored, coord := v.state(name)
	state, reason := v.current(name)
	r := NodeReport{Name: name, State: state, Reason: reason, CoordinatorReason: coord, Slots: v.slotsOf(name), Canary: v.canary(name)}
	if state != stored {
		r.CoordinatorState = stored
	}
	if n := v.nodes[name]; n != nil {
		r.Zone = n.Labels[fleetv1.LabelZone]
		if h, ok := n.Annotations[fleetv1.AnnotationHold]; ok {
			r.Hold = &h
		}
	}
	switch {
	case v.bns[name] == nil:
		r.Reason = "no BootcNode yet: the coordinator creates one for each node its pool selects"
	case state == fleetv1.RolloutWaitingForRebootSlot:
		r.Queue, r.Reason = v.waiting(name, lease.KindReboot, reason)
	case state == fleetv1.RolloutWaitingForStageSlot:
		r.Queue, r.Reason = v.waiting(name, lease.KindStage, reason)
	}
	return r
}

// waiting is the live text of a node waiting for a slot of kind k. A node
// not in the queue (NotReady, held) keeps the coordinator's words, which
// say why.
func (v *poolView) waiting(name string, k lease.Kind, coord string) (*Queue, string) {
	q := v.queue(k)
	pos := -1
	for i, n := range q {
		if n == name {
			pos = i
		}
	}
	if pos < 0 {
		return nil, coord
	}
	queue := &Queue{Kind: string(k), Position: pos + 1, Of: len(q)}
	ahead := "next in line"
	switch {
	case pos == 1:
		ahead = "1 node ahead"
	case pos > 1:
		ahead = fmt.Sprintf("%d nodes ahead", pos)
	}
	capacity := v.budget.MaxStaging
	if k == lease.KindReboot {
		capacity = v.budget.MaxUnavailable
	}
	hs := v.holders(k)
	var who []string
	for _, h := range hs {
		w := h.Node
		if h.For != "" {
			w += " (" + strings.ToLower(h.Phase) + " " + h.For + ")"
		}
		who = append(who, w)
	}
	text := fmt.Sprintf("waiting for a %s slot: %d of %d held", k, len(hs), capacity)
	if len(who) > 0 {
		text += " by " + andList(who)
	}
	if k == lease.KindReboot {
		text = v.rebootWaitText(name, coord, text)
	} else {
		if u := v.stagingWithoutGrant(); len(u) > 0 {
			// Counted against maxStaging until their share lapses
			// (amendments 7 and 20).
			verb := " reports"
			if len(u) > 1 {
				verb = " report"
			}
			text += "; " + andList(u) + verb + " Staging without a stage grant"
		}
		if v.lastStageFailed(name) {
			text += "; its last stage failed, so it waits behind the others"
		}
	}
	return queue, text + "; " + ahead
}

// rebootWaitText adds to text, the live words of a node waiting for a
// reboot slot, the nodes counted against maxUnavailable, and the wave it
// waits for; pacing waits are the coordinator's to word (coord).
func (v *poolView) rebootWaitText(name, coord, text string) string {
	var others []string
	for _, m := range v.members {
		if v.otherwiseUnavailable(m) {
			why := "cordoned"
			if !v.ready(m) {
				why = "NotReady"
			}
			if m == name {
				why += ", this node"
			}
			others = append(others, m+" ("+why+")")
		}
	}
	if len(others) > 0 {
		text += fmt.Sprintf("; %d more counted against maxUnavailable: %s", len(others), andList(others))
	}
	// Pacing waits are the coordinator's to word; the queue is ours.
	if !strings.HasPrefix(coord, "staged; waiting for a reboot slot") && coord != "" {
		text = coord
	}
	if wave := v.waveText(name); wave != "" {
		text += "; " + wave
	}
	return text
}

func andList(items []string) string {
	if len(items) <= 1 {
		return strings.Join(items, "")
	}
	return strings.Join(items[:len(items)-1], ", ") + " and " + items[len(items)-1]
}

// age is a duration as a person reads it: 12s, 1m40s, 3h5m, 2d4h.
func age(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	d = d.Truncate(time.Second)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		m, s := int(d.Minutes()), int(d.Seconds())%60
		if s == 0 {
			return fmt.Sprintf("%dm", m)
		}
		return fmt.Sprintf("%dm%ds", m, s)
	case d < 24*time.Hour:
		h, m := int(d.Hours()), int(d.Minutes())%60
		if m == 0 {
			return fmt.Sprintf("%dh", h)
		}
		return fmt.Sprintf("%dh%dm", h, m)
	default:
		days, h := int(d.Hours())/24, int(d.Hours())%24
		if h == 0 {
			return fmt.Sprintf("%dd", days)
		}
		return fmt.Sprintf("%dd%dh", days, h)
	}
}
