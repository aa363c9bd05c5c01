package plan

import (
	"fmt"
	"sort"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// The rollout's waves (docs/design.md, amendment 26): the canaries go first
// and alone, and only once every canary is on its target with its slot
// released (its gate passed) and the soak has passed since the last of them
// was does any other node get a reboot grant; then, under zoneOrder
// Sequential, one zone after another. Stage grants are not held back (a
// staged image is locked), only ordered the same way.

// MaxCanaries bounds status.canary.nodes (its schema's maxItems).
const MaxCanaries = 256

// waveState is what the waves allow in this pass.
type waveState struct {
	// canaries of the target (status.canary.nodes); on: the pool asks for
	// canaries.
	on       bool
	canaries []string
	canary   map[string]bool
	// passed is status.canary.passedTime (zero: not all passed yet);
	// newly: set in this pass.
	passed time.Time
	newly  bool
	// soakUntil: passed plus the soak.
	soakUntil time.Time
	// waiting: only canaries get reboot grants.
	waiting bool
	// zoned: the pool's nodes go zone by zone; zone is the one rolling now
	// (among the canaries while waiting), hasZone false when no node has
	// work left.
	zoned   bool
	zone    string
	hasZone bool
	// hold: a wave ends in this pass (waveBoundary); no reboot grant until
	// the next, and why.
	hold string
}

// rebootEligible is the waves' say on a reboot grant to node name: the
// one hook of grant.go (and of explain's words): ok is false while the
// canaries go first and name is not one, or while another zone rolls.
func (p *planner) rebootEligible(name string) (ok bool, why string) {
	w := p.wavesNow()
	n := p.nodes[name]
	switch {
	case w.hold != "":
		return false, w.hold
	case w.waiting && !w.canary[name]:
		return false, w.waitingText()
	case w.zoned && w.hasZone && ZoneOf(p.zoneOrder(), n.Zone) != w.zone:
		return false, fmt.Sprintf("zone %s rolls first (zoneOrder Sequential): one zone finishes before the next starts", zoneName(w.zone))
	}
	return true, ""
}

// waveOrder orders q by wave (WaveOrder): canaries first while they go
// alone, then by zone.
func (p *planner) waveOrder(q []string) []string {
	w := p.wavesNow()
	return WaveOrder(q, Waves{Canary: func(name string) bool { return w.waiting && w.canary[name] },
		Zone: p.zoneOfNode, Rolling: w.zone, HasRolling: w.zoned && w.hasZone})
}

func (p *planner) zoneOfNode(name string) string { return ZoneOf(p.zoneOrder(), p.nodes[name].Zone) }

func (p *planner) zoneOrder() fleetv1.ZoneOrder {
	if p.in.Pool.Spec.Rollout.ZoneOrder == "" {
		return fleetv1.ZoneOrderSequential
	}
	return p.in.Pool.Spec.Rollout.ZoneOrder
}

// wavesNow works the waves out once per pass, after the held slots are
// settled (a canary released in this pass counts as done).
func (p *planner) wavesNow() *waveState {
	if p.waves != nil {
		return p.waves
	}
	w := &waveState{canary: map[string]bool{}}
	p.waves = w
	holds := p.holdsAfter()
	want := p.canaryCount()
	if p.target.Digest == "" || want == 0 {
		p.currentZone(w, holds)
		p.holdAtBoundary(w)
		return w
	}
	w.on = true
	prev := p.in.Pool.Status.Canary
	if prev != nil && prev.Target == p.target.String() {
		for _, name := range prev.Nodes {
			if p.keepCanary(name, holds) && !w.canary[name] {
				w.canaries, w.canary[name] = append(w.canaries, name), true
			}
		}
		if prev.PassedTime != nil {
			w.passed = prev.PassedTime.Time
		}
	}
	if w.passed.IsZero() {
		p.addCanaries(w, want, holds)
		if len(w.canaries) > 0 && p.canariesDone(w, holds) {
			w.passed, w.newly = ceilSecond(p.in.Now), true
		}
	}
	sort.Strings(w.canaries)
	if !w.passed.IsZero() {
		w.soakUntil = w.passed.Add(p.soak())
	}
	// No canary yet (no node could be one): nobody else goes either.
	w.waiting = w.passed.IsZero() || p.in.Now.Before(w.soakUntil)
	if w.waiting && !w.passed.IsZero() {
		p.requeueAt(w.soakUntil)
	}
	p.currentZone(w, holds)
	p.holdAtBoundary(w)
	return w
}

func (p *planner) holdAtBoundary(w *waveState) {
	if w.hold = p.waveBoundary(w); w.hold != "" {
		p.requeueAt(p.in.Now)
	}
}

// waveBoundary says why no reboot grant goes out in this pass when a wave
// ends in it: the last canary's slot, or the last slot of the zone that was
// rolling, is released in this pass (held as read, free after). The next wave's first grants wait for
// the next pass, so they are written after that release: the controller
// writes a release that hands its slot on in one write with that grant,
// beside other slots' grants, and a grant of the next wave written beside
// the release it counted on could land first (the Lease history, and a
// crash or a conflict in between, would show two waves under way at once).
func (p *planner) waveBoundary(w *waveState) string {
	read := p.holdsAsRead()
	if w.newly {
		for _, name := range w.canaries {
			if holdsKind(read[name], lease.KindReboot) {
				return "the canaries passed in this pass; the rest of the pool goes once their slots' release is written"
			}
		}
	}
	if !w.zoned || !w.hasZone {
		return ""
	}
	before := &waveState{canary: w.canary, waiting: w.waiting}
	p.currentZone(before, read)
	if before.hasZone && before.zone != w.zone {
		return fmt.Sprintf("zone %s finished in this pass; zone %s starts once its last release is written", zoneName(before.zone), zoneName(w.zone))
	}
	return ""
}

// holdsAsRead returns the slots each node held as read, before this pass's
// changes.
func (p *planner) holdsAsRead() map[string][]*Slot {
	h := map[string][]*Slot{}
	for i := range p.read {
		if s := &p.read[i]; s.State != SlotFree && s.Holder != "" && s.Phase != PhaseFinished {
			h[s.Holder] = append(h[s.Holder], s)
		}
	}
	return h
}

// canaryCount is spec.rollout.canary.nodes for this pool (a percentage of
// its nodes, rounded up); 0 without canaries. A value the schema should
// have refused counts as the default, 1: canaries stay on.
func (p *planner) canaryCount() int {
	c := p.in.Pool.Spec.Rollout.Canary
	if c == nil {
		return 0
	}
	n, err := intstr.GetScaledValueFromIntOrPercent(intstr.ValueOrDefault(c.Nodes, intstr.FromInt32(1)), len(p.members), true)
	if err != nil || n < 0 {
		n = 1
	}
	return min(n, MaxCanaries)
}

func (p *planner) soak() time.Duration {
	if c := p.in.Pool.Spec.Rollout.Canary; c != nil && c.Soak != nil && c.Soak.Duration > 0 {
		return c.Soak.Duration
	}
	return 0
}

// keepCanary: a canary chosen earlier stays one while it is in the pool and
// under way (it holds a reboot slot) or could still be updated: not held,
// not conflicting, with an image for its platform. Holding a canary is how
// an operator has another node picked.
func (p *planner) keepCanary(name string, holds map[string][]*Slot) bool {
	n, ok := p.nodes[name]
	if !ok || !n.InPool {
		return false
	}
	return holdsKind(holds[name], lease.KindReboot) || (!p.conflicted(n) && !n.Held && p.noImage[name] == nil)
}

// canaryCandidate: a node that may become a canary: it could be updated
// and is not known to run its target already.
func (p *planner) canaryCandidate(name string, holds map[string][]*Slot) bool {
	n := p.nodes[name]
	if !p.keepCanary(name, holds) || n.Held || p.conflicted(n) || p.failedSlot[name] != "" || p.signatureRejected(name) {
		return false
	}
	tgt, ok := p.targetOf(name)
	st := p.fresh(n)
	return ok && (st == nil || (st.Phase != fleetv1.PhaseDegraded && !onDigest(st.Booted, tgt.Digest)))
}

// addCanaries fills the canaries up, until they passed: the nodes labelled
// fleetv1.LabelCanary that could be canaries, all of them; when none
// could, the first nodes of the queue order (zone order, then name) up to
// want.
func (p *planner) addCanaries(w *waveState, want int, holds map[string][]*Slot) {
	order := WaveOrder(p.members, Waves{Canary: func(string) bool { return false }, Zone: p.zoneOfNode})
	var labelled, unlabelled []string
	for _, name := range order {
		if w.canary[name] || !p.canaryCandidate(name, holds) {
			continue
		}
		if p.nodes[name].Canary {
			labelled = append(labelled, name)
		} else {
			unlabelled = append(unlabelled, name)
		}
	}
	if len(labelled) > 0 {
		want, unlabelled = MaxCanaries, labelled
	}
	for _, name := range unlabelled {
		if len(w.canaries) >= min(want, MaxCanaries) {
			return
		}
		w.canaries, w.canary[name] = append(w.canaries, name), true
	}
}

// canariesDone: every canary is booted on its target (as its agent reports
// in its current boot) and holds no reboot slot: its gate passed and the
// slot was released.
func (p *planner) canariesDone(w *waveState, holds map[string][]*Slot) bool {
	for _, name := range w.canaries {
		if !p.onTargetReleased(name, holds) {
			return false
		}
	}
	return true
}

func (p *planner) onTargetReleased(name string, holds map[string][]*Slot) bool {
	st := p.fresh(p.nodes[name])
	tgt, ok := p.targetOf(name)
	return ok && st != nil && onDigest(st.Booted, tgt.Digest) && !holdsKind(holds[name], lease.KindReboot)
}

// currentZone finds the zone rolling now, under zoneOrder Sequential: the
// zone of a node under way (holding a reboot slot, not failed), so a hold
// lifted in an earlier zone waits for it; else the first zone (name order,
// no zone last) with a node that still has work, among the canaries while
// they go alone.
func (p *planner) currentZone(w *waveState, holds map[string][]*Slot) {
	if p.zoneOrder() != fleetv1.ZoneOrderSequential {
		return
	}
	w.zoned = true
	underWay := false
	for _, name := range p.members {
		busy := p.underWay(holds[name])
		if !busy && (underWay || (w.waiting && !w.canary[name]) || !p.hasWork(name, holds)) {
			continue
		}
		z := p.zoneOfNode(name)
		if !w.hasZone || (busy && !underWay) || ZoneBefore(z, w.zone) {
			w.zone, w.hasZone = z, true
		}
		underWay = underWay || busy
	}
}

// underWay: ss holds a reboot slot that is not failed.
func (p *planner) underWay(ss []*Slot) bool {
	for _, s := range ss {
		if s.Kind == lease.KindReboot {
			return s.Phase != PhaseFailed
		}
	}
	return false
}

// hasWork: node name still has its update to do, and can: it is under way
// (a reboot slot held, not failed), or is not on its target and is not
// failed, held, degraded, conflicting or without an image for its platform.
// A node NotReady or silent has work: its zone waits for it (hold it to let
// the next zone go).
func (p *planner) hasWork(name string, holds map[string][]*Slot) bool {
	n := p.nodes[name]
	if holdsKind(holds[name], lease.KindReboot) {
		return p.underWay(holds[name])
	}
	if p.conflicted(n) || n.Held || p.noImage[name] != nil || p.failedSlot[name] != "" || p.signatureRejected(name) {
		return false
	}
	tgt, ok := p.targetOf(name)
	st := p.fresh(n)
	return ok && (st == nil || (st.Phase != fleetv1.PhaseDegraded && !onDigest(st.Booted, tgt.Digest)))
}

// waitingText says why a node that is not a canary waits.
func (w *waveState) waitingText() string {
	if w.passed.IsZero() {
		return fmt.Sprintf("the canaries go first: %s", joinMax(w.canaries, 5))
	}
	return fmt.Sprintf("the canaries passed; soaking until %s", w.soakUntil.UTC().Format(time.RFC3339))
}

// canaryStatus fills status.canary, records CanariesPassed and, while the
// canaries go alone, says so in Progressing (reason CanaryWaiting) instead
// of RollingOut. Neither the status nor the message holds a clock reading
// that moves by itself, so they are rewritten only when something changed.
func (p *planner) canaryStatus(set setCondition, st *fleetv1.BootcNodePoolStatus) {
	w := p.wavesNow()
	if !w.on {
		return
	}
	cs := &fleetv1.CanaryStatus{Target: p.target.String(), Nodes: append([]string(nil), w.canaries...)}
	if !w.passed.IsZero() {
		cs.PassedTime = &metav1.Time{Time: w.passed}
	}
	st.Canary = cs
	if w.newly {
		p.event("Normal", fleetv1.EventCanariesPassed, "every canary (%s) is on %s, its health gate passed and its slot released; %s",
			joinMax(w.canaries, 5), p.target, soakText(p.soak(), w.soakUntil))
	}
	prog := findCondition(st.Conditions, fleetv1.PoolProgressing)
	if !w.waiting || prog == nil || prog.Status != metav1.ConditionTrue || prog.Reason != fleetv1.ReasonRollingOut {
		return
	}
	holds := p.holdsAfter()
	var msg string
	if len(w.canaries) == 0 {
		msg = "canaries first: no node can be a canary yet (every node that still needs the target is held, conflicting or without an image for its platform); no reboot grant until one can"
	} else if w.passed.IsZero() {
		var pending []string
		for _, name := range w.canaries {
			if !p.onTargetReleased(name, holds) {
				pending = append(pending, name)
			}
		}
		msg = fmt.Sprintf("canaries first: %d of %d on the target (%s); still to pass: %s; no other node gets a reboot grant until they all passed their gate and the soak (%s) after", len(w.canaries)-len(pending), len(w.canaries), joinMax(w.canaries, 5), joinMax(pending, 5), p.soak())
	} else {
		msg = fmt.Sprintf("canaries passed (%s) at %s; soaking for %s, until %s: no other node gets a reboot grant before then", joinMax(w.canaries, 5), w.passed.UTC().Format(time.RFC3339), p.soak(), w.soakUntil.UTC().Format(time.RFC3339))
	}
	set(fleetv1.PoolProgressing, metav1.ConditionTrue, fleetv1.ReasonCanaryWaiting, msg)
}

func soakText(soak time.Duration, until time.Time) string {
	if soak <= 0 {
		return "no soak: the rest of the pool goes on"
	}
	return fmt.Sprintf("the rest of the pool goes on after the soak (%s), at %s", soak, until.UTC().Format(time.RFC3339))
}

func findCondition(cs []metav1.Condition, typ string) *metav1.Condition {
	for i := range cs {
		if cs[i].Type == typ {
			return &cs[i]
		}
	}
	return nil
}

func zoneName(z string) string {
	if z == "" {
		return "(no zone)"
	}
	return z
}

// ceilSecond is t rounded up to a whole second, as metav1.Time stores it:
// a passedTime is later than the pass that set it, never earlier.
func ceilSecond(t time.Time) time.Time {
	if r := t.Truncate(time.Second); r.Before(t) {
		return r.Add(time.Second)
	}
	return t
}
