package plan

import (
	"fmt"
	"sort"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/health"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/platform"
)

const poolName = "workers"

var (
	t0    = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	imgV1 = mustPinned("quay.io/example/os@sha256:" + hex('1'))
	imgV2 = mustPinned("quay.io/example/os@sha256:" + hex('2'))
	imgV3 = mustPinned("quay.io/example/os@sha256:" + hex('3'))
)

func hex(c byte) string {
	b := make([]byte, 64)
	for i := range b {
		b[i] = c
	}
	return string(b)
}

func mustPinned(s string) imageref.Pinned {
	p, err := imageref.ParsePinned(s)
	if err != nil {
		panic(err)
	}
	return p
}

// bootID makes a valid boot ID from a node name and a boot number.
func bootID(node string, boot int) string {
	h := uint32(2166136261)
	for _, c := range node {
		h = (h ^ uint32(c)) * 16777619
	}
	return fmt.Sprintf("%08x-0000-4000-8000-%012x", h, boot)
}

// world is a pool's objects as the API server would hold them; apply carries
// out an Output the way the controller does (same Lease mutations).
type world struct {
	pool       *fleetv1.BootcNodePool
	target     imageref.Pinned
	index      *platform.Index // the target's, when it is a multi-arch index
	resolveErr string
	// indexUnknown, uninspected: see Input.IndexUnknown, Input.Uninspected.
	indexUnknown bool
	uninspected  string
	nodes        map[string]*Node
	boots        map[string]int
	softs        map[string]uint32 // systemd's SoftRebootsCount, by node
	// soft: agents of this world soft-reboot (a soft-reboot capable image,
	// policy AllowSoftReboot) instead of rebooting fully.
	soft   bool
	bns    map[string]*fleetv1.BootcNode
	leases map[string]*coordinationv1.Lease
	drains map[string]Drain
	hb     map[string]Heartbeat
	// grantsSeen and stagingSince: what the controller remembers between
	// passes on its own clock (Input.GrantsSeen, UngrantedStagingSince).
	grantsSeen   map[lease.ID]time.Time
	stagingSince map[string]time.Time
	now          time.Time
	uid          int
	// rollbacks: by node, bootc's rollback deployment (the image booted
	// before the last update); health: the gate's verdicts (Input.Health).
	rollbacks map[string]imageref.Pinned
	health    map[string]health.Verdict
}

func newWorld(n, maxUnavailable, maxStaging int) *world {
	w := &world{
		pool: &fleetv1.BootcNodePool{
			ObjectMeta: metav1.ObjectMeta{Name: poolName, Generation: 1},
			Spec: fleetv1.BootcNodePoolSpec{
				NodeSelector: metav1.LabelSelector{MatchLabels: map[string]string{"pool": poolName}},
				Image:        "quay.io/example/os:latest",
				Rollout: fleetv1.RolloutSpec{
					MaxUnavailable:    ptr.To(intstr.FromInt32(int32(maxUnavailable))),
					MaxStaging:        ptr.To(intstr.FromInt32(int32(maxStaging))),
					DrainTimeout:      &metav1.Duration{Duration: 10 * time.Minute},
					RebootTimeout:     &metav1.Duration{Duration: 15 * time.Minute},
					HaltAfterFailures: ptr.To(int32(1)),
				},
			},
		},
		target: imgV1,
		nodes:  map[string]*Node{},
		boots:  map[string]int{},
		softs:  map[string]uint32{},
		bns:    map[string]*fleetv1.BootcNode{},
		leases: map[string]*coordinationv1.Lease{},
		drains: map[string]Drain{},
		hb:     map[string]Heartbeat{},
		now:    t0,

		grantsSeen:   map[lease.ID]time.Time{},
		stagingSince: map[string]time.Time{},
		rollbacks:    map[string]imageref.Pinned{},
		health:       map[string]health.Verdict{},
	}
	for i := 0; i < n; i++ {
		w.addNode(fmt.Sprintf("node-%02d", i))
	}
	return w
}

func (w *world) addNode(name string) {
	w.boots[name] = 1
	w.nodes[name] = &Node{Name: name, InPool: true, Ready: true, BootID: bootID(name, 1)}
}

// stageSlots snapshots the world's held stage slots with their phases.
func (w *world) stageSlots() map[string]Slot {
	out := map[string]Slot{}
	for name, l := range w.leases {
		if s, ok := w.slot(l); ok && s.Kind == lease.KindStage && s.State == SlotHeld {
			out[name] = s
		}
	}
	return out
}

// reported records the phase changes a report or a reboot made on the
// stage slots held before (OpReport: no write, amendment 31).
func (w *world) reported(before map[string]Slot) {
	for name, was := range before {
		now, ok := w.slot(w.leases[name])
		if !ok || now.Phase == was.Phase || now.Grant.ID != was.Grant.ID {
			continue
		}
		why := WhyStageGone
		if now.Phase == PhaseFinished {
			n, bn := w.nodes[now.Holder], w.bns[now.Holder]
			switch {
			case n.BootID != now.Grant.BootID || w.softs[now.Holder] != now.Grant.SoftRebootCount:
				why = WhyRebooted
			case bn != nil && onDigest(bn.Status.Booted, now.Grant.Image.Digest):
				why = WhyBooted
			default:
				why = WhyStaged
			}
		}
		made.record(Transition{From: was.Phase, Op: OpReport, Why: why, To: now.Phase})
	}
}

// agentReports makes the node's agent report the given booted/staged digests
// in the current boot.
func (w *world) agentReports(name string, booted, staged imageref.Pinned, phase fleetv1.NodePhase) {
	defer w.reported(w.stageSlots())
	bn := w.bns[name]
	if bn == nil {
		bn = &fleetv1.BootcNode{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: fleetv1.BootcNodeSpec{Pool: poolName}}
		w.bns[name] = bn
	}
	bn.Status = fleetv1.BootcNodeStatus{BootID: w.nodes[name].BootID, SoftRebootCount: int64(w.softs[name]), Phase: phase,
		LastReportTime: &metav1.MicroTime{Time: w.now}}
	// Like the agent: list every grant it holds in this boot, and the
	// coordinator sees the new report now.
	for _, ln := range sortedKeys(w.leases) {
		if g, err := lease.Parse(w.leases[ln]); err == nil && g.Holder == name && g.BootID == bn.Status.BootID && g.SoftRebootCount == w.softs[name] {
			bn.Status.Grants = append(bn.Status.Grants, fleetv1.GrantInUse{Lease: g.Lease, UID: g.UID, LeaseTransitions: g.Transitions})
		}
	}
	h := w.hb[name]
	h.Seen = w.now
	w.hb[name] = h
	if booted.Digest != "" {
		bn.Status.Booted = &fleetv1.Deployment{Image: booted.String(), Digest: booted.Digest}
	}
	if staged.Digest != "" {
		bn.Status.Staged = &fleetv1.Deployment{Image: staged.String(), Digest: staged.Digest, DownloadOnly: true}
	}
	if rb := w.rollbacks[name]; rb.Digest != "" {
		bn.Status.Rollback = &fleetv1.Deployment{Image: rb.String(), Digest: rb.Digest}
	}
}

func (w *world) input() Input {
	in := Input{
		Pool:          w.pool.DeepCopy(),
		Target:        w.target,
		Index:         w.index,
		IndexUnknown:  w.indexUnknown,
		Uninspected:   w.uninspected,
		ResolveError:  w.resolveErr,
		Drains:        map[string]Drain{},
		Now:           w.now,
		LeaseDuration: time.Minute,
		Heartbeats:    map[string]Heartbeat{},
	}
	for k, v := range w.hb {
		in.Heartbeats[k] = v
	}
	for _, name := range sortedKeys(w.nodes) {
		in.Nodes = append(in.Nodes, *w.nodes[name])
	}
	for _, name := range sortedKeys(w.bns) {
		in.BootcNodes = append(in.BootcNodes, *w.bns[name].DeepCopy())
	}
	for _, name := range sortedKeys(w.leases) {
		if s, ok := ParseSlot(poolName, w.leases[name]); ok {
			in.Slots = append(in.Slots, s)
			if _, seen := w.grantsSeen[s.Grant.ID]; s.State == SlotHeld && !seen {
				w.grantsSeen[s.Grant.ID] = w.now
			}
		}
	}
	in.GrantsSeen = map[lease.ID]time.Time{}
	for k, v := range w.grantsSeen {
		in.GrantsSeen[k] = v
	}
	in.UngrantedStagingSince = map[string]time.Time{}
	for k, v := range w.stagingSince {
		in.UngrantedStagingSince[k] = v
	}
	for k, v := range w.drains {
		in.Drains[k] = v
	}
	if len(w.health) > 0 {
		in.Health = map[string]health.Verdict{}
		for k, v := range w.health {
			in.Health[k] = v
		}
	}
	return in
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

func (w *world) plan() Output { return Plan(w.input()) }

// apply carries out out like the controller: slot changes on the Lease as
// read, cordons right after a reboot grant, uncordons before a release.
func (w *world) apply(out Output) {
	for _, ref := range out.CreateSlots {
		l := NewSlotLease(poolName, ref)
		w.uid++
		l.UID = types.UID(fmt.Sprintf("uid-%d", w.uid))
		w.leases[l.Name] = l
	}
	for _, name := range out.DeleteSlots {
		delete(w.leases, name)
	}
	for _, c := range out.Changes {
		l := w.leases[c.Slot]
		if c.Uncordon {
			if n := w.nodes[c.Node]; n != nil {
				n.Unschedulable = false
			}
		}
		if c.Uncordon {
			if n := w.nodes[c.Node]; n != nil {
				n.CordonedFor = ""
			}
		}
		was, _ := w.slot(l)
		ApplyToLease(l, c, w.now, time.Minute)
		now, _ := w.slot(l)
		made.record(Transition{From: was.Phase, Op: c.Op, Why: c.Why, To: now.Phase})
		// Like the controller: a reboot grant is cordoned at once (our mark
		// on the Node says whose cordon it is until OpAdvance records it on
		// the grant), and its drain starts.
		if (c.Op == OpGrant && c.Kind == lease.KindReboot) || c.Op == OpCordon {
			g, err := lease.Parse(l)
			n := w.nodes[c.Node]
			if err != nil || n == nil {
				continue
			}
			// The cordon call's answer is recorded on the grant: someone
			// else's cordon at once; a cordon the call made on a grant
			// that says pending by the advance to Reboot, the grant's mark
			// saying it until then (amendment 29).
			made := !n.Unschedulable
			if made {
				n.Unschedulable, n.CordonedFor = true, lease.CordonMark(g.ID)
			}
			pending := g.Cordon == lease.CordonPending
			if (made && !pending) || (!made && pending) {
				lease.RecordCordon(l, made)
			}
			if d, ok := w.drains[c.Node]; !ok || d.Grant != g.ID {
				w.drains[c.Node] = Drain{Grant: g.ID, State: DrainRunning, Attempts: 1}
			}
			continue
		}

	}
	for _, name := range out.StopDrains {
		delete(w.drains, name)
	}
	for _, d := range out.StartDrains {
		prev := w.drains[d.Node]
		att := 1
		if prev.Grant == d.Grant {
			att = prev.Attempts + 1
		}
		w.drains[d.Node] = Drain{Grant: d.Grant, State: DrainRunning, Attempts: att, Message: prev.Message}
	}
	for _, c := range out.CreateBootcNodes {
		w.bns[c.Name] = &fleetv1.BootcNode{ObjectMeta: metav1.ObjectMeta{Name: c.Name}, Spec: c.Spec}
		w.bns[c.Name].SetNoPlatformImage(c.NoPlatformImage)
		w.bns[c.Name].SetRollout(c.RolloutState, c.RolloutReason)
		w.bns[c.Name].SetSlots(c.Slots)
	}
	for _, c := range out.UpdateBootcNodes {
		w.bns[c.Name].Spec = c.Spec
		w.bns[c.Name].SetNoPlatformImage(c.NoPlatformImage)
		w.bns[c.Name].SetRollout(c.RolloutState, c.RolloutReason)
		w.bns[c.Name].SetSlots(c.Slots)
	}
	for _, name := range out.DeleteBootcNodes {
		delete(w.bns, name)
	}
	w.pool.Status = out.Status
	since := map[string]time.Time{}
	for _, name := range out.StagingWithoutGrant {
		if t, ok := w.stagingSince[name]; ok {
			since[name] = t
		} else {
			since[name] = w.now
		}
	}
	w.stagingSince = since
}

// cordonedByUs: node holds a reboot grant whose record says the cordon is
// ours (the Node's mark alone never does).
func (w *world) cordonedByUs(node string) bool {
	s, held := w.grantOf(node, lease.KindReboot)
	n := w.nodes[node]
	return held && n != nil && cordonIsOurs(s, *n)
}

// slot parses a slot Lease of the world with its phase, a stage grant's
// from its holder's report as the planner finds it (WithFinished).
func (w *world) slot(l *coordinationv1.Lease) (Slot, bool) {
	s, ok := ParseSlot(poolName, l)
	if !ok {
		return s, false
	}
	return WithFinished([]Slot{s}, func(name string) (Node, *fleetv1.BootcNodeStatus, bool) {
		n := w.nodes[name]
		if n == nil {
			return Node{}, nil, false
		}
		if bn := w.bns[name]; bn != nil && bn.Spec.Pool == poolName && bn.Status.BootID == n.BootID {
			return *n, &bn.Status, true
		}
		return *n, nil, true
	}, w.pool.Spec.RequireSignedImages)[0], true
}

// step plans once and applies the result.
func (w *world) step() Output {
	out := w.plan()
	w.apply(out)
	return out
}

// grantOf returns the parsed grant a node holds of kind k, if any.
func (w *world) grantOf(node string, k lease.Kind) (Slot, bool) {
	for _, name := range sortedKeys(w.leases) {
		s, ok := w.slot(w.leases[name])
		if ok && s.State == SlotHeld && s.Kind == k && s.Grant.Holder == node {
			return s, true
		}
	}
	return Slot{}, false
}

// held counts the live grants of kind k: held slots but finished stage
// slots, which their holders are done with (amendment 31).
func (w *world) held(k lease.Kind) int {
	c := 0
	for _, l := range w.leases {
		if s, ok := w.slot(l); ok && s.Kind == k && s.State != SlotFree && s.Phase != PhaseFinished {
			c++
		}
	}
	return c
}

// otherwiseUnavailable counts pool nodes NotReady or cordoned without a reboot slot.
func (w *world) otherwiseUnavailable() int {
	c := 0
	for name, n := range w.nodes {
		if !n.InPool {
			continue
		}
		if _, ok := w.grantOf(name, lease.KindReboot); ok {
			continue
		}
		if !n.Ready || n.Unschedulable {
			c++
		}
	}
	return c
}

// reboot plays a node rebooting: a new boot ID, booted = what was staged.
func (w *world) reboot(name string) {
	defer w.reported(w.stageSlots())
	w.boots[name]++
	n := w.nodes[name]
	n.BootID = bootID(name, w.boots[name])
	bn := w.bns[name]
	if bn != nil && bn.Status.Staged != nil {
		if bn.Status.Booted != nil {
			w.rollbacks[name] = mustPinned(bn.Status.Booted.Image)
		}
		bn.Status.Booted, bn.Status.Staged = bn.Status.Staged, nil
		bn.Status.Booted.DownloadOnly = false
	}
}

// rollBack plays `bootc rollback` and a full reboot: a new boot ID, booted
// and rollback swapped, no staged deployment.
func (w *world) rollBack(name string) {
	w.boots[name]++
	w.nodes[name].BootID = bootID(name, w.boots[name])
	bn := w.bns[name]
	rb := w.rollbacks[name]
	if bn == nil || rb.Digest == "" {
		return
	}
	if bn.Status.Booted != nil {
		w.rollbacks[name] = mustPinned(bn.Status.Booted.Image)
	}
	bn.Status.Booted, bn.Status.Staged = &fleetv1.Deployment{Image: rb.String(), Digest: rb.Digest}, nil
}

// softReboot plays a node's soft reboot: the boot ID stays, systemd's
// soft-reboot count grows, and (prepared by the agent's unlock) booted =
// what was staged. The agent has not reported yet.
func (w *world) softReboot(name string) {
	defer w.reported(w.stageSlots())
	w.softs[name]++
	bn := w.bns[name]
	if bn != nil && bn.Status.Staged != nil {
		if bn.Status.Booted != nil {
			w.rollbacks[name] = mustPinned(bn.Status.Booted.Image)
		}
		bn.Status.Booted, bn.Status.Staged = bn.Status.Staged, nil
		bn.Status.Booted.DownloadOnly = false
	}
}

// reboots plays the reboot an agent of this world makes under a grant.
func (w *world) rebootsUnderGrant(name string) {
	if w.soft {
		w.softReboot(name)
	} else {
		w.reboot(name)
	}
}

// converge runs plan/apply and ideal agents and drains until nothing changes.
func (w *world) converge(maxSteps int, check func(Output)) {
	for i := 0; i < maxSteps; i++ {
		out := w.step()
		if check != nil {
			check(out)
		}
		w.idealWorld()
		w.now = w.now.Add(10 * time.Second)
	}
}

// idealWorld: every agent does what its grants allow, every drain finishes,
// every rebooted node comes back.
func (w *world) idealWorld() {
	for node, d := range w.drains {
		if d.State == DrainRunning {
			d.State = DrainDone
			w.drains[node] = d
		}
	}
	for _, name := range sortedKeys(w.nodes) {
		n := w.nodes[name]
		bn := w.bns[name]
		if bn == nil || bn.Spec.DesiredImage == "" {
			continue
		}
		desired := mustPinned(bn.Spec.DesiredImage)
		if bn.Status.BootID != n.BootID {
			w.agentReports(name, bootedOf(bn), stagedOf(bn), fleetv1.PhaseWaiting)
			continue
		}
		if s, ok := w.grantOf(name, lease.KindReboot); ok && s.Grant.Rollback && s.Grant.Phase == lease.PhaseReboot && w.grantedInBoot(name, s.Grant) && s.Grant.Image == desired {
			w.rollBack(name)
			w.agentReports(name, bootedOf(w.bns[name]), imageref.Pinned{}, fleetv1.PhaseIdle)
			continue
		}
		if s, ok := w.grantOf(name, lease.KindReboot); ok && s.Grant.Phase == lease.PhaseReboot && w.grantedInBoot(name, s.Grant) && s.Grant.Image == desired {
			w.rebootsUnderGrant(name)
			w.agentReports(name, bootedOf(w.bns[name]), imageref.Pinned{}, fleetv1.PhaseIdle)
			continue
		}
		if s, ok := w.grantOf(name, lease.KindStage); ok && w.grantedInBoot(name, s.Grant) && s.Grant.Image == desired {
			w.agentReports(name, bootedOf(bn), desired, fleetv1.PhaseStaged)
			continue
		}
		// Holding a slot it cannot act on (e.g. the reboot grant the
		// coordinator is verifying), the agent still sends heartbeats.
		if _, ok := w.grantOf(name, lease.KindReboot); ok {
			w.agentReports(name, bootedOf(bn), stagedOf(bn), bn.Status.Phase)
		}
	}
}

// grantedInBoot: g was issued in the node's current boot (boot ID and
// soft-reboot count), as lease.Grant.Allows requires of the agent.
func (w *world) grantedInBoot(name string, g lease.Grant) bool {
	return g.BootID == w.nodes[name].BootID && g.SoftRebootCount == w.softs[name]
}

func bootedOf(bn *fleetv1.BootcNode) imageref.Pinned {
	if bn.Status.Booted == nil {
		return imageref.Pinned{}
	}
	return mustPinned(bn.Status.Booted.Image)
}

func stagedOf(bn *fleetv1.BootcNode) imageref.Pinned {
	if bn.Status.Staged == nil {
		return imageref.Pinned{}
	}
	return mustPinned(bn.Status.Staged.Image)
}
