package plan

import (
	"fmt"
	"slices"
	"time"

	"testing"

	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"pgregory.net/rapid"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/platform"
)

// TestPlanProperties generates random fleets and random histories (agents
// acting under their grants, drains finishing or failing, nodes going
// NotReady, rebooting on their own, being cordoned by others, leaving the
// pool or the cluster, the target changing, pauses, registry errors, time
// passing) and applies every Plan output to get the next state. After every
// Plan it checks the invariants of docs/design.md that the planner owns.
//
// On failure rapid prints the failing history and a seed; rerun it with
//
//	go test ./coordinator/plan -run TestPlanProperties -rapid.seed=<seed>
//
// (-rapid.checks=N runs more histories.)
func TestPlanProperties(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		n := rapid.IntRange(1, 8).Draw(rt, "nodes")
		w := newWorld(n, rapid.IntRange(1, 4).Draw(rt, "maxUnavailable"), rapid.IntRange(1, 4).Draw(rt, "maxStaging"))
		w.soft = rapid.Bool().Draw(rt, "softReboots")
		w.pool.Spec.Rollout.HaltAfterFailures = ptr.To(int32(rapid.IntRange(1, 3).Draw(rt, "haltAfterFailures")))
		gated := rapid.Bool().Draw(rt, "healthGate")
		if gated {
			gatedPool(w, time.Minute, 0, rapid.SampledFrom([]fleetv1.FailurePolicy{fleetv1.OnFailureRollback, fleetv1.OnFailureHalt}).Draw(rt, "onFailure"))
		}
		arches := []string{"amd64", "arm64"}
		for _, name := range sortedKeys(w.nodes) {
			w.nodes[name].OS, w.nodes[name].Arch = "linux", rapid.SampledFrom(arches).Draw(rt, "arch")
			w.agentReports(name, imgV0, imageref.Pinned{}, fleetv1.PhaseWaiting)
		}
		drawWaves(rt, w)
		// Targets: single manifests, and multi-arch indexes (the last
		// without arm64, so arm64 nodes have no image while it is the target).
		images := []imageref.Pinned{imgV1, imgV2, imgV3, propIndexes[0].target, propIndexes[1].target, propIndexes[2].target}
		nodeNames := func() []string { return sortedKeys(w.nodes) }
		pick := func(label string) string {
			names := nodeNames()
			if len(names) == 0 {
				return ""
			}
			return rapid.SampledFrom(names).Draw(rt, label)
		}

		steps := rapid.IntRange(10, 120).Draw(rt, "steps")
		for i := 0; i < steps; i++ {
			switch ev := rapid.IntRange(0, 16).Draw(rt, "event"); ev {
			case 0, 1, 2, 3, 4:
				checkedStep(rt, w)
			case 5, 6:
				if name := pick("agent"); name != "" {
					agentActs(w, name)
				}
			case 7:
				if name := pick("drain"); name != "" {
					if d, ok := w.drains[name]; ok && d.State == DrainRunning {
						if rapid.Bool().Draw(rt, "drainOK") {
							d.State = DrainDone
						} else {
							d.State, d.Message = DrainFailed, "pod default/web-0: PodDisruptionBudget web-pdb"
						}
						w.drains[name] = d
					}
				}
			case 8:
				if name := pick("ready"); name != "" {
					w.nodes[name].Ready = !w.nodes[name].Ready
				}
			case 9:
				if name := pick("cordon"); name != "" {
					w.nodes[name].Unschedulable = !w.nodes[name].Unschedulable
				}
			case 10:
				if name := pick("powercycle"); name != "" {
					if rapid.Bool().Draw(rt, "unplannedSoft") {
						// Someone ran systemctl soft-reboot: same boot ID,
						// count+1, nothing applied (nothing prepared /run/nextroot).
						w.softs[name]++
						break
					}
					// An unplanned reboot: new boot, nothing staged is applied
					// (download-only), the agent has not reported yet.
					w.boots[name]++
					w.nodes[name].BootID = bootID(name, w.boots[name])
				}
			case 11:
				w.now = w.now.Add(time.Duration(rapid.IntRange(1, 20*60).Draw(rt, "seconds")) * time.Second)
			case 12:
				w.target, w.index = rapid.SampledFrom(images).Draw(rt, "target"), nil
				for _, pi := range propIndexes {
					if pi.target == w.target {
						w.index = pi.index(rt)
					}
				}
			case 13:
				switch rapid.IntRange(0, 2).Draw(rt, "pauseOrError") {
				case 0:
					w.pool.Spec.Rollout.Paused = !w.pool.Spec.Rollout.Paused
				case 1:
					if w.resolveErr == "" {
						w.resolveErr = "registry unreachable"
					} else {
						w.resolveErr = ""
					}
				case 2:
					w.pool.Spec.Rollout.MaxUnavailable = ptr.To(intstr.FromInt32(int32(rapid.IntRange(1, 4).Draw(rt, "newMaxUnavailable"))))
					w.pool.Spec.Rollout.MaxStaging = ptr.To(intstr.FromString(fmt.Sprintf("%d%%", rapid.IntRange(1, 100).Draw(rt, "newMaxStagingPct"))))
				}
			case 14:
				if name := pick("membership"); name != "" {
					switch rapid.IntRange(0, 2).Draw(rt, "how") {
					case 0:
						w.nodes[name].InPool = !w.nodes[name].InPool
					case 1:
						delete(w.nodes, name)
						delete(w.drains, name)
					case 2:
						late := fmt.Sprintf("late-%d", i)
						w.addNode(late)
						w.nodes[late].OS, w.nodes[late].Arch = "linux", rapid.SampledFrom(arches).Draw(rt, "lateArch")
						drawWaveLabels(rt, w, late)
					}
				}
			case 15:
				for j := 0; j < 3; j++ {
					checkedStep(rt, w)
					idealAll(w)
				}
			case 16:
				// The gate's verdict for a node: passes, fails, or not
				// evaluated (absent).
				if name := pick("verdictNode"); name != "" {
					switch rapid.IntRange(0, 3).Draw(rt, "verdict") {
					case 0:
						w.health[name] = hostPass
					case 1:
						w.health[name] = hostFailed
					case 2:
						delete(w.health, name)
					default:
						// The boot loader falls back (boot counting, or a
						// person's bootc rollback and reboot): a new boot
						// on the rollback deployment, the agent not
						// reported yet.
						w.rollBack(name)
					}
				}
			}
		}
		// With every fault healed, the pool converges.
		w.resolveErr, w.pool.Spec.Rollout.Paused = "", false
		w.pool.Spec.Rollout.HaltAfterFailures = ptr.To(int32(1000))
		// Every gate passes now; a quarantined target is named again by a
		// new spec.image (the quarantine holds only for the string it
		// failed under), below.
		for _, name := range sortedKeys(w.nodes) {
			w.health[name] = hostPass
		}
		for _, name := range sortedKeys(w.nodes) {
			w.nodes[name].Ready, w.nodes[name].InPool = true, true
			// Whoever else cordoned nodes is done with them.
			if !w.cordonedByUs(name) {
				w.nodes[name].Unschedulable = false
			}
		}
		for i := 0; i < 200; i++ {
			for _, name := range sortedKeys(w.nodes) {
				w.health[name] = hostPass // late nodes too
			}
			// A quarantine (also one a node that fell back before the
			// healing causes now) is lifted by naming the image again.
			if q := w.pool.Status.Quarantine; q != nil && q.SpecImage == w.pool.Spec.Image {
				w.pool.Spec.Image = fmt.Sprintf("quay.io/example/os:healed-%d", i)
			}
			// A person clears the slots marked failed: uncordons the node and
			// deletes the Lease (docs/coordinator.md).
			for name, l := range w.leases {
				if l.Annotations[lease.AnnotationFailure] != "" {
					if n := w.nodes[ptr.Deref(l.Spec.HolderIdentity, "")]; n != nil && w.cordonedByUs(n.Name) {
						n.Unschedulable = false
					}
					delete(w.leases, name)
				}
			}
			checkedStep(rt, w)
			idealAll(w)
			w.now = w.now.Add(time.Minute)
		}
		for _, name := range sortedKeys(w.nodes) {
			bn := w.bns[name]
			want, ok := expectedFor(w, name)
			if !ok {
				// The index has no image for it: nothing to converge to, and
				// said so on its BootcNode.
				if bn == nil || bn.Spec.DesiredImage != "" || bn.Annotations[fleetv1.AnnotationNoPlatformImage] == "" {
					rt.Fatalf("node %s without a platform image: %+v", name, bn)
				}
				continue
			}
			if bn == nil || bn.Status.Booted == nil || bn.Status.Booted.Digest != want.Digest {
				rt.Fatalf("node %s did not converge on %s: node %+v status %+v\nnodes %s\nlast plan: %s", name, want, *w.nodes[name], bn, describeNodes(w), describe(w.plan()))
			}
		}
	})
}

// propIndex is a multi-arch index the property test may roll out.
type propIndex struct {
	target  imageref.Pinned
	entries map[string]imageref.Pinned // architecture -> image
}

var propIndexes = []propIndex{
	{mustPinned("quay.io/example/os@sha256:" + hex('4')), map[string]imageref.Pinned{"amd64": mustPinned("quay.io/example/os@sha256:" + hex('5')), "arm64": mustPinned("quay.io/example/os@sha256:" + hex('6'))}},
	{mustPinned("quay.io/example/os@sha256:" + hex('7')), map[string]imageref.Pinned{"amd64": mustPinned("quay.io/example/os@sha256:" + hex('8')), "arm64": mustPinned("quay.io/example/os@sha256:" + hex('9'))}},
	{mustPinned("quay.io/example/os@sha256:" + hex('a')), map[string]imageref.Pinned{"amd64": mustPinned("quay.io/example/os@sha256:" + hex('b'))}},
}

func (pi propIndex) index(rt *rapid.T) *platform.Index {
	ix := &platform.Index{Digest: pi.target.Digest}
	for _, arch := range sortedKeys(pi.entries) {
		if err := ix.Add("linux", arch, "", pi.entries[arch].Digest); err != nil {
			rt.Fatal(err)
		}
	}
	return ix
}

// expectedFor is, independently of the planner, the image node name must
// be granted and end on: the target, or its architecture's image in the
// target's index (ok false: the index has none).
func expectedFor(w *world, name string) (imageref.Pinned, bool) {
	if w.index == nil {
		return w.target, true
	}
	for _, pi := range propIndexes {
		if pi.target == w.target {
			img, ok := pi.entries[w.nodes[name].Arch]
			return img, ok
		}
	}
	return imageref.Pinned{}, false
}

// idealAll: drains finish, every agent acts, NotReady rebooted nodes return.
func idealAll(w *world) {
	for node, d := range w.drains {
		if d.State == DrainRunning {
			d.State = DrainDone
			w.drains[node] = d
		}
	}
	for _, name := range sortedKeys(w.nodes) {
		agentActs(w, name)
	}
}

// agentActs plays one agent step exactly as the design allows it: refresh a
// stale status, stage only under a valid stage grant, reboot only under a
// valid reboot grant in phase Reboot.
func agentActs(w *world, name string) {
	n := w.nodes[name]
	bn := w.bns[name]
	if bn == nil {
		return
	}
	if bn.Status.BootID != n.BootID {
		w.agentReports(name, bootedOf(bn), stagedOf(bn), fleetv1.PhaseWaiting)
		return
	}
	if bn.Spec.DesiredImage == "" {
		return
	}
	desired := mustPinned(bn.Spec.DesiredImage)
	if uint32(bn.Status.SoftRebootCount) != w.softs[name] {
		w.agentReports(name, bootedOf(bn), stagedOf(bn), fleetv1.PhaseWaiting)
		return
	}
	if s, ok := w.grantOf(name, lease.KindReboot); ok && s.Grant.Rollback && s.Grant.Phase == lease.PhaseReboot && s.Grant.Failure == "" &&
		w.grantedInBoot(name, s.Grant) && s.Grant.Image == desired && w.rollbacks[name] == desired {
		w.rollBack(name)
		w.agentReports(name, bootedOf(w.bns[name]), imageref.Pinned{}, fleetv1.PhaseIdle)
		n.Ready = true
		return
	}
	if s, ok := w.grantOf(name, lease.KindReboot); ok && !s.Grant.Rollback && s.Grant.Phase == lease.PhaseReboot && s.Grant.Failure == "" &&
		w.grantedInBoot(name, s.Grant) && s.Grant.Image == desired && stagedOf(bn) == desired {
		w.rebootsUnderGrant(name)
		w.agentReports(name, bootedOf(w.bns[name]), imageref.Pinned{}, fleetv1.PhaseIdle)
		n.Ready = true
		return
	}
	if s, ok := w.grantOf(name, lease.KindStage); ok && w.grantedInBoot(name, s.Grant) && s.Grant.Image == desired {
		w.agentReports(name, bootedOf(bn), desired, fleetv1.PhaseStaged)
		return
	}
	// Nothing to do: while it holds a slot the agent still reports (a
	// heartbeat, amendment 8), which is also how the coordinator sees it
	// back after a soft reboot.
	for _, k := range []lease.Kind{lease.KindReboot, lease.KindStage} {
		if _, held := w.grantOf(name, k); held {
			w.agentReports(name, bootedOf(bn), stagedOf(bn), bn.Status.Phase)
			return
		}
	}
}

// checkedStep plans, checks the plan against the state it was made from,
// applies it and checks the state after.
func checkedStep(rt *rapid.T, w *world) {
	in := w.input()
	before := map[string]Slot{}
	for _, s := range in.Slots {
		before[s.Name], _ = w.slot(w.leases[s.Name]) // a stage slot's phase from its holder's report
	}
	out := Plan(in)
	// The finished slots the pass reports are those InputSlots finds.
	wantFinished := map[lease.ID]bool{}
	for _, s := range InputSlots(in) {
		if s.Phase == PhaseFinished {
			wantFinished[s.Grant.ID] = true
		}
	}
	if len(wantFinished) != len(out.FinishedSlots) {
		rt.Fatalf("FinishedSlots %v, InputSlots finds %v finished", out.FinishedSlots, wantFinished)
	}
	for id := range wantFinished {
		if !out.FinishedSlots[id] {
			rt.Fatalf("FinishedSlots %v, InputSlots finds %v finished", out.FinishedSlots, wantFinished)
		}
	}

	// A slot may be freed and granted again in one pass (the release is
	// written first), never granted twice.
	freed, granted := map[string]bool{}, map[string]bool{}
	for _, c := range out.Changes {
		n, exists := w.nodes[c.Node]
		switch c.Op {
		case OpRelease, OpRevoke, OpReset:
			freed[c.Slot] = true
		}
		switch c.Op {
		case OpGrant:
			// No grant to a node whose agent status is from another boot;
			// the grant records the boot the agent reported.
			bn := w.bns[c.Node]
			if !exists || bn == nil || !lease.ValidBootID(n.BootID) || bn.Status.BootID != n.BootID || c.BootID != n.BootID ||
				int64(c.SoftRebootCount) != bn.Status.SoftRebootCount {
				rt.Fatalf("grant %+v to node %+v with agent status %+v", c, n, bn)
			}
			if c.Rollback {
				checkRollbackGrant(rt, w, in, before[c.Slot], c)
				granted[c.Slot] = true
				continue
			}
			// A quarantined target is never granted.
			if q := out.Status.Quarantine; q != nil {
				rt.Fatalf("grant %+v while %s is quarantined", c, q.Digest)
			}
			// A finished stage slot is handed on as a free one (amendment 31).
			if (before[c.Slot].State != SlotFree && before[c.Slot].Phase != PhaseFinished && !freed[c.Slot]) || granted[c.Slot] {
				rt.Fatalf("grant of slot %s that was not free: %+v (freed in this pass %v, granted already %v)", c.Slot, before[c.Slot], freed[c.Slot], granted[c.Slot])
			}
			granted[c.Slot] = true
			// A node's next stage takes its own finished slot (amendment
			// 31), so no old grant of it is left behind.
			if c.Kind == lease.KindStage {
				for name, s := range before {
					if s.Phase == PhaseFinished && s.Holder == c.Node && name != c.Slot && s.Index < ResolveBudget(w.pool.Spec.Rollout, inPool(in)).MaxStaging && !grantedTo(out, name) {
						rt.Fatalf("stage grant %+v in %s while the node's own finished slot %s stays behind", c, c.Slot, name)
					}
				}
			}
			if want, ok := expectedFor(w, c.Node); !ok || want != c.Image || w.resolveErr != "" || w.pool.Spec.Rollout.Paused {
				rt.Fatalf("grant %+v with the node's target %s (pool target %s), resolve error %q, paused %v", c, want, w.target, w.resolveErr, w.pool.Spec.Rollout.Paused)
			}
		case OpRelease, OpRevoke:
			s := before[c.Slot]
			if s.State != SlotHeld || s.Kind != lease.KindReboot || s.Grant.Phase != lease.PhaseReboot {
				continue
			}
			// No release of a reboot before verification (or the node left):
			// back on the image in a new boot, or in the same boot ID after
			// a soft reboot reported after the grant's phase Reboot.
			bn := w.bns[c.Node]
			onImage := exists && n.Ready && bn != nil && bn.Status.BootID == n.BootID &&
				bn.Status.Booted != nil && bn.Status.Booted.Digest == s.Grant.Image.Digest
			softBack := onImage && n.BootID == s.Grant.BootID && bn.Status.SoftRebootCount > int64(s.Grant.SoftRebootCount) &&
				in.Heartbeats[c.Node].Seen.After(s.Grant.Renewed)
			verified := onImage && (n.BootID != s.Grant.BootID || softBack)
			gone := !exists || !n.InPool
			// Rolled back by the host: a new boot, on the image bootc now
			// lists as its rollback deployment's other half.
			byHost := c.Why == WhyRolledBackByHost && exists && n.Ready && bn != nil && bn.Status.BootID == n.BootID && n.BootID != s.Grant.BootID &&
				bn.Status.Rollback != nil && bn.Status.Rollback.Digest == s.Grant.Image.Digest && !s.Grant.Rollback
			if !verified && !gone && !byHost {
				rt.Fatalf("reboot slot %s released unverified (%s): node %+v status %+v grant %+v", c.Slot, c.Why, n, bn, s.Grant)
			}
		case OpAdvance:
			d := w.drains[c.Node]
			if d.Grant != before[c.Slot].Grant.ID || d.State != DrainDone {
				rt.Fatalf("advance of %s without a finished drain for this grant: %+v", c.Slot, d)
			}
		}
	}

	leasesBefore := leaseCopies(w)
	w.apply(out)
	// Every phase change is an edge of the slot lifecycle (transitions.go).
	checkTransitions(rt.Fatalf, leasesBefore, out, in.Now, w)
	// Canaries first and alone, then one zone at a time (amendment 26).
	checkWaves(rt, w, in, out)

	members := 0
	for _, n := range w.nodes {
		if n.InPool {
			members++
		}
	}
	b := ResolveBudget(w.pool.Spec.Rollout, members)
	newReboots := 0
	for _, c := range changes(out, OpGrant, lease.KindReboot) {
		if !c.Rollback { // a rollback grant takes its node's own failed slot: no new disruption
			newReboots++
		}
	}
	rebootSlots := 0
	for _, l := range w.leases {
		if s, ok := ParseSlot(poolName, l); ok && s.Kind == lease.KindReboot {
			rebootSlots++
		}
	}
	if held := w.held(lease.KindReboot); held > rebootSlots {
		rt.Fatalf("%d reboot grants held, more than the %d reboot slots", held, rebootSlots)
	}
	for _, c := range changes(out, OpGrant, lease.KindReboot) {
		if s := before[c.Slot]; !c.Rollback && s.Index >= b.MaxUnavailable {
			rt.Fatalf("reboot grant %+v in slot %s beyond maxUnavailable %d", c, c.Slot, b.MaxUnavailable)
		}
	}
	if newReboots > 0 {
		if held, other := w.held(lease.KindReboot), w.otherwiseUnavailable(); held+other > b.MaxUnavailable {
			rt.Fatalf("after reboot grants: %d reboot slots held + %d otherwise unavailable > maxUnavailable %d\nnodes %s\nplan %s", held, other, b.MaxUnavailable, describeNodes(w), describe(out))
		}
	}
	if len(changes(out, OpGrant, lease.KindStage)) > 0 {
		if held := w.held(lease.KindStage); held > b.MaxStaging {
			rt.Fatalf("after stage grants: %d stage slots held > maxStaging %d", held, b.MaxStaging)
		}
	}
	// One live grant per node: a finished stage slot (amendment 31) is no
	// longer its holder's work, and is held beside at most one other.
	holders, finished := map[string]int{}, map[string]int{}
	for _, l := range w.leases {
		s, ok := w.slot(l)
		switch {
		case !ok || s.State != SlotHeld:
		case s.Phase == PhaseFinished:
			finished[s.Grant.Holder]++
		default:
			holders[s.Grant.Holder]++
		}
		if holders[s.Grant.Holder] > 1 {
			rt.Fatalf("node %s holds more than one live slot", s.Grant.Holder)
		}
	}
	checkSlotNames(rt, w)
}

// checkSlotNames: after a pass's writes, each of the pool's BootcNodes
// names exactly the slots whose live grants its node holds, but an update's
// reboot grant that still drains, so its agent, which watches only those
// (amendment 39), sees every grant it may use or must heartbeat.
func checkSlotNames(rt *rapid.T, w *world) {
	live := map[string][]string{}
	for _, l := range w.leases {
		if s, ok := w.slot(l); ok && s.State == SlotHeld && s.Phase != PhaseFinished &&
			(s.Kind != lease.KindReboot || s.Phase != PhaseDraining || s.Grant.Rollback) {
			live[s.Grant.Holder] = append(live[s.Grant.Holder], s.Name)
		}
	}
	for name, bn := range w.bns {
		if bn.Spec.Pool != poolName {
			continue
		}
		got, present, err := fleetv1.SlotsOf(bn)
		slices.Sort(live[name])
		if err != nil || !present || !slices.Equal(got, live[name]) && (len(got) > 0 || len(live[name]) > 0) {
			rt.Fatalf("BootcNode %s names slots %v (present %v, %v); its node holds the live grants of %v", name, got, present, err, live[name])
		}
	}
}

// checkRollbackGrant: a rollback grant re-issues, in the same slot, the
// update grant its node failed its gate under (with onFailure Rollback),
// for the node's current boot and its rollback deployment as its agent
// reports it there, keeping the failed grant's cordon record.
func checkRollbackGrant(rt *rapid.T, w *world, in Input, was Slot, c SlotChange) {
	n, bn := w.nodes[c.Node], w.bns[c.Node]
	switch {
	case was.State != SlotHeld || was.Kind != lease.KindReboot || was.Grant.Holder != c.Node || was.Grant.Rollback:
		rt.Fatalf("rollback grant %+v of a slot that was not the node's update grant: %+v", c, was)
	case !healthFailure(was.Grant.Failure) || was.Grant.Phase != lease.PhaseReboot:
		rt.Fatalf("rollback grant %+v for a node whose gate did not fail: %+v", c, was.Grant)
	case in.Pool.Spec.Health == nil || in.Pool.Spec.Rollout.OnFailure == fleetv1.OnFailureHalt:
		rt.Fatalf("rollback grant %+v with spec.health %+v, onFailure %q", c, in.Pool.Spec.Health, in.Pool.Spec.Rollout.OnFailure)
	case bn == nil || bn.Status.BootID != n.BootID || c.BootID != n.BootID || bn.Status.Rollback == nil || bn.Status.Rollback.Digest != c.Image.Digest:
		rt.Fatalf("rollback grant %+v not for the node's boot and rollback deployment: node %+v status %+v", c, n, bn)
	case c.Cordon != was.Grant.Cordon:
		rt.Fatalf("rollback grant %+v does not keep the cordon record %q", c, was.Grant.Cordon)
	}
}

func describe(out Output) string {
	return fmt.Sprintf("changes %+v drains %+v status %+v events %+v", out.Changes, out.StartDrains, out.Status, out.Events)
}

func describeNodes(w *world) string {
	s := ""
	for _, name := range sortedKeys(w.nodes) {
		n := w.nodes[name]
		s += fmt.Sprintf("\n  %s inPool=%v ready=%v cordoned=%v boot=%s", name, n.InPool, n.Ready, n.Unschedulable, n.BootID)
		if bn := w.bns[name]; bn != nil {
			s += fmt.Sprintf(" desired=%.30s status=%s/%s booted=%+v staged=%+v", bn.Spec.DesiredImage, bn.Status.BootID, bn.Status.Phase, bn.Status.Booted, bn.Status.Staged)
		}
		for _, k := range []lease.Kind{lease.KindReboot, lease.KindStage} {
			if g, ok := w.grantOf(name, k); ok {
				s += fmt.Sprintf(" %s=%s/%s", k, g.Name, g.Grant.Phase)
			}
		}
	}
	for _, name := range sortedKeys(w.leases) {
		l := w.leases[name]
		s += fmt.Sprintf("\n  lease %s holder=%v ann=%v", name, ptr.Deref(l.Spec.HolderIdentity, ""), l.Annotations)
	}
	return s
}

// grantedTo: out grants slot.
func grantedTo(out Output, slot string) bool {
	for _, c := range out.Changes {
		if c.Op == OpGrant && c.Slot == slot {
			return true
		}
	}
	return false
}

// inPool counts in's pool members.
func inPool(in Input) int {
	c := 0
	for _, n := range in.Nodes {
		if n.InPool {
			c++
		}
	}
	return c
}
