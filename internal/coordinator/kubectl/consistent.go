package kubectl

import (
	"fmt"
	"strings"

	"github.com/bootc-fleet/bootc-fleet/api/text"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/plan"
)

// current is node name's rollout state and reason, composed from one view.
// The coordinator moves a slot first and writes its note (the BootcNode's
// rollout annotations) a second or more later, in the background; the
// plugin reads the BootcNodes before the slots. So where the two disagree
// the slots are newer, and win: a node holding a slot is in the slot's
// phase (it never waits for a slot it holds itself), and a node whose note
// names a slot it no longer holds has given the slot up since. The reason
// then says that the coordinator's words are older.
func (v *poolView) current(name string) (state, reason string) {
	stored, coord := v.state(name)
	if v.bns[name] == nil {
		return stored, coord
	}
	if s, ok := v.grantOf(name); ok {
		if string(s.Phase) == stored {
			return stored, coord
		}
		h := v.holder(s)
		text := fmt.Sprintf("holds %s slot %s, %s", s.Kind, s.Name, strings.ToLower(h.Phase))
		if h.For != "" {
			text += " " + h.For
		}
		return string(s.Phase), text + "; " + olderNote(stored, coord)
	}
	if !slotState(stored) || v.stagesWithoutGrant(name) {
		return stored, coord
	}
	if img, ok := v.onDesired(name); ok {
		return fleetv1.RolloutUpdated, "runs " + img + "; it gave its slot up after the coordinator wrote its note (" + stored + ")"
	}
	if v.stagedDesired(name) && !v.rebootsBlocked() {
		// What the coordinator writes next (plan's explain): in the
		// reboot queue, which waiting() words.
		return fleetv1.RolloutWaitingForRebootSlot, "staged; waiting for a reboot slot: it gave its stage slot up after the coordinator wrote its note (" + stored + ")"
	}
	return stored, "holds no slot any more; what it does next is not written yet; " + olderNote(stored, coord)
}

// stagedDesired: the node's agent reports, in the Node's current boot, the
// digest its BootcNode asks for staged download-only.
func (v *poolView) stagedDesired(name string) bool {
	bn, n := v.bns[name], v.nodes[name]
	if bn == nil || n == nil || bn.Status.Staged == nil || !bn.Status.Staged.DownloadOnly || bn.Status.BootID != n.Status.NodeInfo.BootID {
		return false
	}
	want := bn.Spec.DesiredImage
	at := strings.LastIndex(want, "@")
	return at >= 0 && want[at+1:] == bn.Status.Staged.Digest
}

// rebootsBlocked: the pool grants no reboot slot now (paused, halted,
// outside its windows), so a staged node is not in the reboot queue.
func (v *poolView) rebootsBlocked() bool {
	w := plan.WindowsAt(v.pool.Spec.Rollout.Windows, v.now)
	return v.pool.Spec.Rollout.Paused || halted(v.pool) != nil || w.Err != nil || (w.Configured && !w.Open)
}

// olderNote quotes the coordinator's note, older than the slots.
func olderNote(stored, coord string) string {
	if stored == "" {
		return "the coordinator has not written its note yet"
	}
	return "the coordinator's note, older than the slots, says " + stored + ": " + coord
}

// slotState: a rollout state only a slot's holder is in.
func slotState(state string) bool {
	switch plan.SlotPhase(state) {
	case plan.PhaseStaging, plan.PhaseDraining, plan.PhaseRebooting, plan.PhaseVerifying, plan.PhaseFailed:
		return true
	}
	return false
}

// grantOf is the slot node holds under a valid grant it is not done with
// (a reboot slot before a stage slot, in the view's order; a finished stage
// slot is no one's work, amendment 31).
func (v *poolView) grantOf(node string) (plan.Slot, bool) {
	for _, s := range v.slots {
		if s.State != plan.SlotFree && s.Holder == node && s.Phase.Grant() && s.Phase != plan.PhaseFinished {
			return s, true
		}
	}
	return plan.Slot{}, false
}

// onDesired: the node's agent reports, in the Node's current boot, that it
// booted the digest its BootcNode asks for; img is that image, short.
func (v *poolView) onDesired(name string) (img string, ok bool) {
	bn, n := v.bns[name], v.nodes[name]
	if bn == nil || n == nil || bn.Status.Booted == nil || bn.Status.BootID != n.Status.NodeInfo.BootID {
		return "", false
	}
	want := bn.Spec.DesiredImage
	at := strings.LastIndex(want, "@")
	if at < 0 || want[at+1:] != bn.Status.Booted.Digest {
		return "", false
	}
	return shortImage(want), true
}

// shortImage keeps repository and a short digest, as the coordinator
// writes images in its notes.
func shortImage(ref string) string {
	if at := strings.LastIndex(ref, "@"); at >= 0 {
		return ref[:at+1] + text.ShortDigest(ref[at+1:])
	}
	return ref
}
