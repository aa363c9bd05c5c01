package plan

import (
	"testing"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// An administrator cordoned node-00 before its reboot grant; then someone
// other than the coordinator (the node's own kubelet credentials may write
// its Node's annotations) wrote the grant's cordoned-for mark on it. Cordon
// ownership comes only from the coordinator's own cordon call, recorded on
// the grant (amendment 21): the mark alone never makes the coordinator
// lift the administrator's cordon, whether the grant is released after the
// reboot or revoked before it.
func TestForgedCordonMarkNeverLiftsAnAdminsCordon(t *testing.T) {
	setup := func(t *testing.T) (*world, Slot) {
		w := stagedWorld(2, 1)
		w.nodes["node-00"].Unschedulable = true // the administrator's cordon
		w.step()
		s, ok := w.grantOf("node-00", lease.KindReboot)
		if !ok || w.nodes["node-00"].CordonedFor != "" {
			t.Fatalf("setup: grant %v, mark %q", ok, w.nodes["node-00"].CordonedFor)
		}
		w.nodes["node-00"].CordonedFor = lease.CordonMark(s.Grant.ID) // forged
		return w, s
	}
	t.Run("released after the reboot", func(t *testing.T) {
		w, s := setup(t)
		w.step()
		w.drains["node-00"] = Drain{Grant: s.Grant.ID, State: DrainDone}
		out := w.step()
		if adv := changes(out, OpAdvance, lease.KindReboot); len(adv) != 1 || adv[0].CordonedByUs {
			t.Fatalf("advance %+v recorded the forged mark as our cordon", adv)
		}
		w.reboot("node-00")
		w.agentReports("node-00", imgV1, imageref.Pinned{}, fleetv1.PhaseIdle)
		out = w.step()
		rel := changes(out, OpRelease, lease.KindReboot)
		if len(rel) != 1 || rel[0].Uncordon || !w.nodes["node-00"].Unschedulable {
			t.Fatalf("release %+v lifted the administrator's cordon (unschedulable now %v)", rel, w.nodes["node-00"].Unschedulable)
		}
	})
	t.Run("revoked while draining", func(t *testing.T) {
		w, _ := setup(t)
		w.target = imgV2
		out := w.step()
		rv := changes(out, OpRevoke, lease.KindReboot)
		if len(rv) != 1 || rv[0].Uncordon || !w.nodes["node-00"].Unschedulable {
			t.Fatalf("revoke %+v lifted the administrator's cordon", rv)
		}
	})
}
