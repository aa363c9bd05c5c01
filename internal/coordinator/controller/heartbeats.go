package controller

import (
	"sync"
	"time"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/plan"
)

// heartbeats times each node's reports on the coordinator's own clock: the
// agent writes no Lease, and its status.lastReportTime is its own clock's
// reading, so only a change of that value counts, at the moment this
// coordinator first saw it (as the node lifecycle controller times kubelet
// Leases: kubernetes pkg/controller/nodelifecycle, probeTimestamp). A
// restarted coordinator starts from "seen now": it may wait up to one lease
// duration longer than needed, never shorter.
type heartbeats struct {
	mu    sync.Mutex
	nodes map[string]*seenReport
}

type seenReport struct {
	uid      string
	report   time.Time // status.lastReportTime as written
	reported bool      // status.lastReportTime is set
	desired  string    // spec.desiredImage
	seen     time.Time
	specSeen time.Time
	// slots is the fleet.bootc.dev/slots annotation, first seen at
	// slotsSeen (amendment 39).
	slots     string
	slotsSeen time.Time
}

func newHeartbeats() *heartbeats { return &heartbeats{nodes: map[string]*seenReport{}} }

// observe records what bns show at now and returns the pool's view.
func (h *heartbeats) observe(bns []fleetv1.BootcNode, now time.Time) map[string]plan.Heartbeat {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[string]plan.Heartbeat, len(bns))
	for i := range bns {
		bn := &bns[i]
		var report time.Time
		reported := bn.Status.LastReportTime != nil
		if reported {
			report = bn.Status.LastReportTime.Time
		}
		s := h.nodes[bn.Name]
		if s == nil || s.uid != string(bn.UID) {
			s = &seenReport{uid: string(bn.UID), report: report, reported: reported, desired: bn.Spec.DesiredImage, seen: now, specSeen: now,
				slots: bn.Annotations[fleetv1.AnnotationSlots], slotsSeen: now}
			h.nodes[bn.Name] = s
		}
		if s.reported != reported || !s.report.Equal(report) {
			s.report, s.reported, s.seen = report, reported, now
		}
		if s.desired != bn.Spec.DesiredImage {
			s.desired, s.specSeen = bn.Spec.DesiredImage, now
		}
		if v := bn.Annotations[fleetv1.AnnotationSlots]; s.slots != v {
			s.slots, s.slotsSeen = v, now
		}
		hb := plan.Heartbeat{SpecSeen: s.specSeen, SlotsSeen: s.slotsSeen}
		if reported {
			hb.Seen = s.seen
		}
		out[bn.Name] = hb
	}
	return out
}

// forgetGone drops what it remembers of nodes whose BootcNode is gone, or
// was made again (another UID). all is every BootcNode the cache holds.
func (h *heartbeats) forgetGone(all map[string]*fleetv1.BootcNode) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for name, s := range h.nodes {
		if bn, ok := all[name]; !ok || string(bn.UID) != s.uid {
			delete(h.nodes, name)
		}
	}
}
