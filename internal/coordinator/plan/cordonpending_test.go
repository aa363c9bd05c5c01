package plan

import (
	"testing"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// The coordinator cordoned node-00 for its reboot grant and stopped before
// it recorded the cordon call's answer on the grant (a crash, or the API
// server gone between the two writes): the grant still says pending and
// the Node carries the mark the cordon's own update wrote. The cordon is
// the coordinator's (amendment 23): it is recorded so at the advance and
// lifted at the release. Before amendment 23 it stayed cordoned for good
// (CordonLeft), and a pool with maxUnavailable 1 stopped behind it.
func TestCordonPendingWithTheGrantsMarkIsOurs(t *testing.T) {
	w := stagedWorld(2, 1)
	w.step()
	s, ok := w.grantOf("node-00", lease.KindReboot)
	if !ok || !w.nodes["node-00"].Unschedulable {
		t.Fatalf("setup: grant %v, cordoned %v", ok, w.nodes["node-00"].Unschedulable)
	}
	// The record never landed.
	w.leases[s.Name].Annotations[lease.AnnotationCordonedByUs] = string(lease.CordonPending)
	w.drains["node-00"] = Drain{Grant: s.Grant.ID, State: DrainDone}
	out := w.step()
	if adv := changes(out, OpAdvance, lease.KindReboot); len(adv) != 1 || !adv[0].CordonedByUs {
		t.Fatalf("advance %+v did not record the pending cordon with the grant's mark as ours", adv)
	}
	w.reboot("node-00")
	w.agentReports("node-00", imgV1, imageref.Pinned{}, fleetv1.PhaseIdle)
	out = w.step()
	if rel := changes(out, OpRelease, lease.KindReboot); len(rel) != 1 || !rel[0].Uncordon {
		t.Fatalf("release %+v left the coordinator's own cordon in place", rel)
	}
}

// Pending is no proof without the grant's own mark: a Node cordoned by an
// administrator (no mark, or the mark of another grant) stays cordoned.
func TestCordonPendingWithoutTheGrantsMarkIsNotOurs(t *testing.T) {
	for name, mark := range map[string]func(Slot) string{
		"no mark": func(Slot) string { return "" },
		"another's grant": func(s Slot) string {
			return lease.CordonMark(lease.ID{Lease: s.Name, Transitions: s.Grant.ID.Transitions + 1, UID: s.Grant.ID.UID})
		},
	} {
		t.Run(name, func(t *testing.T) {
			w := stagedWorld(2, 1)
			w.step()
			s, ok := w.grantOf("node-00", lease.KindReboot)
			if !ok {
				t.Fatal("setup: no reboot grant")
			}
			w.leases[s.Name].Annotations[lease.AnnotationCordonedByUs] = string(lease.CordonPending)
			w.nodes["node-00"].CordonedFor = mark(s)
			w.drains["node-00"] = Drain{Grant: s.Grant.ID, State: DrainDone}
			out := w.step()
			if adv := changes(out, OpAdvance, lease.KindReboot); len(adv) != 1 || adv[0].CordonedByUs {
				t.Fatalf("advance %+v took a cordon without the grant's mark as ours", adv)
			}
		})
	}
}

// Once the cordon call's answer is recorded, no mark counts: a recorded
// "not ours" with the grant's mark copied onto the Node stays not ours.
func TestRecordedAnswerOutweighsTheMark(t *testing.T) {
	w := stagedWorld(2, 1)
	w.nodes["node-00"].Unschedulable = true // the administrator's cordon
	w.step()
	s, ok := w.grantOf("node-00", lease.KindReboot)
	if !ok || w.leases[s.Name].Annotations[lease.AnnotationCordonedByUs] != "false" {
		t.Fatalf("setup: grant %v, record %q", ok, w.leases[s.Name].Annotations[lease.AnnotationCordonedByUs])
	}
	w.nodes["node-00"].CordonedFor = lease.CordonMark(s.Grant.ID) // copied
	w.drains["node-00"] = Drain{Grant: s.Grant.ID, State: DrainDone}
	out := w.step()
	if adv := changes(out, OpAdvance, lease.KindReboot); len(adv) != 1 || adv[0].CordonedByUs {
		t.Fatalf("advance %+v took the copied mark over the recorded answer", adv)
	}
}
