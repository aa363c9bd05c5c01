package plan

import (
	"fmt"
	"sort"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	"github.com/bootc-fleet/bootc-fleet/api/text"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// When grants may go: maintenance windows (windows.go), batches paced by
// spec.rollout.pauseBetweenBatches, and minReadySeconds before a reboot
// slot is released. Held nodes (fleetv1.AnnotationHold) are skipped where
// grants are chosen.

// rebootGrantsAllowed: a window is open (or none is configured) and, with
// pauseBetweenBatches, the previous batch is done: no reboot slot held and
// the pause since the last release over. heldReboot counts reboot slots
// held after this plan's changes so far.
func (p *planner) rebootGrantsAllowed(heldReboot int) bool {
	if !p.win.open {
		if !p.win.next.IsZero() {
			p.requeueAt(p.win.next)
		}
		return false
	}
	if p.win.configured {
		p.requeueAt(p.win.until) // to show the window closing
	}
	pause := p.pauseBetweenBatches()
	if pause <= 0 {
		return true
	}
	if heldReboot > 0 {
		return false // the batch is still out; its releases requeue the pool
	}
	if last := p.lastRebootRelease(); !last.IsZero() && p.in.Now.Before(last.Add(pause)) {
		p.requeueAt(last.Add(pause))
		return false
	}
	return true
}

// stageGrantsAllowed: staging waits for a window only with stageOnlyInWindow.
func (p *planner) stageGrantsAllowed() bool {
	return p.win.open || !p.in.Pool.Spec.Rollout.StageOnlyInWindow
}

func (p *planner) pauseBetweenBatches() time.Duration {
	if d := p.in.Pool.Spec.Rollout.PauseBetweenBatches; d != nil {
		return d.Duration
	}
	return 0
}

// lastRebootRelease is when a reboot slot of the pool was last released
// with its node verified back, as the slots record it.
func (p *planner) lastRebootRelease() time.Time {
	var last time.Time
	for _, s := range p.after {
		if s.Kind == lease.KindReboot && s.ReleasedAt.After(last) {
			last = s.ReleasedAt
		}
	}
	return last
}

func (p *planner) minReady() time.Duration {
	return time.Duration(p.in.Pool.Spec.Rollout.MinReadySeconds) * time.Second
}

// trackBack keeps a reboot slot's back-since record: set when its holder is
// first found back (verified) and minReadySeconds applies, cleared when it
// is not back any more, so a node that comes up and falls over starts the
// clock again and keeps its slot.
func (p *planner) trackBack(s Slot, n Node, back bool) {
	if p.minReady() <= 0 && !p.gated(s.Grant) {
		return
	}
	switch {
	case back && s.BackSince.IsZero():
		p.change(s, SlotChange{Op: OpMarkBack, BackSince: p.in.Now, Why: WhyBackOnImage})
		gate := ""
		if p.gated(s.Grant) {
			gate = fmt.Sprintf(" and passed its health gate (within %s)", p.healthTimeout())
		}
		p.nodeEvent(n.Name, "Normal", fleetv1.EventNodeBack, "node %s is back on %s; releasing reboot slot %s once it has stayed Ready for %s (minReadySeconds)%s", n.Name, s.Grant.Image, s.Name, p.minReady(), gate)
		p.requeueAt(p.in.Now.Add(p.minReady()))
	case back:
		p.requeueAt(s.BackSince.Add(p.minReady()))
	case !s.BackSince.IsZero():
		p.change(s, SlotChange{Op: OpMarkBack, Why: WhyNotBackAnyMore})
		p.nodeEvent(n.Name, "Warning", fleetv1.EventNodeFellOver, "node %s came back on %s but is not any more (Ready %v) before minReadySeconds (%s) passed; reboot slot %s stays held, and the minReadySeconds clock starts again once it is back (it came back in time, so rebootTimeout no longer applies)",
			n.Name, s.Grant.Image, n.Ready, p.minReady(), s.Name)
	}
}

// readyLongEnough: the holder has been back for minReadySeconds, as the
// slot records it (trackBack sets the record in this plan at the earliest).
func (p *planner) readyLongEnough(s Slot) bool {
	if p.minReady() <= 0 {
		return true
	}
	return !s.BackSince.IsZero() && !p.in.Now.Before(s.BackSince.Add(p.minReady()))
}

// heldNodes names the pool's nodes held out of rollouts, with the reason.
func (p *planner) heldNodes() []string {
	var out []string
	for _, name := range p.members {
		if n := p.nodes[name]; n.Held {
			if n.HoldReason != "" {
				out = append(out, fmt.Sprintf("%s (%s)", name, text.Truncate(n.HoldReason, 100)))
			} else {
				out = append(out, name)
			}
		}
	}
	sort.Strings(out)
	return out
}

// pacingMessage says what holds new grants back, for Progressing; "" if nothing.
func (p *planner) pacingMessage(held []string) string {
	var parts []string
	if p.win.configured && !p.win.open {
		parts = append(parts, p.win.describe()+": no new reboot grants")
	}
	if pause := p.pauseBetweenBatches(); pause > 0 && p.win.open {
		if last := p.lastRebootRelease(); p.countAfter(lease.KindReboot) == 0 && !last.IsZero() && p.in.Now.Before(last.Add(pause)) {
			parts = append(parts, fmt.Sprintf("pausing between batches until %s", last.Add(pause).UTC().Format(time.RFC3339)))
		}
	}
	if len(held) > 0 {
		parts = append(parts, fmt.Sprintf("%d node(s) held (%s): %s", len(held), fleetv1.AnnotationHold, joinMax(held, 5)))
	}
	if len(parts) == 0 {
		return ""
	}
	return strings.Join(parts, "; ")
}

// windowCondition sets MaintenanceWindow, only for a pool with windows.
func (p *planner) windowCondition(set func(typ string, status metav1.ConditionStatus, reason, msg string)) {
	switch w := p.win; {
	case !w.configured:
	case w.err != nil:
		set(fleetv1.PoolMaintenanceWindow, metav1.ConditionFalse, fleetv1.ReasonInvalidWindow, w.describe())
	case w.open:
		set(fleetv1.PoolMaintenanceWindow, metav1.ConditionTrue, fleetv1.ReasonWindowOpen, w.describe())
	default:
		msg := w.describe() + ": no new reboot grants"
		if p.in.Pool.Spec.Rollout.StageOnlyInWindow {
			msg += " and no new stage grants (stageOnlyInWindow)"
		}
		set(fleetv1.PoolMaintenanceWindow, metav1.ConditionFalse, fleetv1.ReasonWindowClosed, msg+"; work granted earlier finishes")
	}
}
