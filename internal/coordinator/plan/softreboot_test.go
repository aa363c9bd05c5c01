package plan

import (
	"strings"
	"testing"
	"time"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// A grant records the boot it is issued in: the kubelet's boot ID and the
// soft-reboot count the node's agent reported in that same boot.
func TestGrantRecordsTheSoftRebootCount(t *testing.T) {
	for _, kind := range []lease.Kind{lease.KindStage, lease.KindReboot} {
		t.Run(string(kind), func(t *testing.T) {
			w := settled(1, 1, 1)
			if kind == lease.KindReboot {
				w = stagedWorld(1, 1)
			}
			w.softs["node-00"] = 3
			w.agentReports("node-00", imgV0, stagedOf(w.bns["node-00"]), w.bns["node-00"].Status.Phase)
			out := w.step()
			cs := changes(out, OpGrant, kind)
			if len(cs) != 1 || cs[0].SoftRebootCount != 3 || cs[0].BootID != bootID("node-00", 1) {
				t.Fatalf("grant %+v, want boot %s with soft-reboot count 3", cs, bootID("node-00", 1))
			}
			s, ok := w.grantOf("node-00", kind)
			if !ok || s.Grant.SoftRebootCount != 3 || w.leases[s.Name].Annotations[lease.AnnotationSoftRebootCount] != "3" {
				t.Fatalf("lease after the grant: %+v", s)
			}
			// Released, the slot keeps no count behind.
			ApplyToLease(w.leases[s.Name], SlotChange{Op: OpRelease}, w.now, time.Minute)
			if _, left := w.leases[s.Name].Annotations[lease.AnnotationSoftRebootCount]; left {
				t.Fatal("released slot kept the soft-reboot count")
			}
		})
	}
}

func TestNoGrantOnAnInvalidSoftRebootCount(t *testing.T) {
	for _, n := range []int64{-1, 1 << 32} {
		w := settled(1, 1, 1)
		w.bns["node-00"].Status.SoftRebootCount = n
		if out := w.plan(); len(out.Changes) != 0 {
			t.Errorf("soft-reboot count %d: changes %+v, want none (no fresh status)", n, out.Changes)
		}
	}
}

// A soft reboot keeps the kubelet's boot ID, so the reboot slot is released
// on the agent's report of the same boot ID with a larger soft-reboot count
// than granted, seen after the grant's phase Reboot, Ready, on the target.
func TestSoftRebootVerifiedByTheBootIdentity(t *testing.T) {
	softBack := func(w *world) {
		w.now = w.now.Add(10 * time.Second)
		w.softReboot("node-00")
		w.agentReports("node-00", imgV1, imageref.Pinned{}, fleetv1.PhaseIdle)
	}
	for _, c := range []struct {
		name   string
		mutate func(w *world)
		want   bool
	}{
		{"same boot ID, count above the grant's, on target, Ready, seen after phase Reboot", softBack, true},
		{"a full reboot is verified as before", func(w *world) {
			w.now = w.now.Add(10 * time.Second)
			w.reboot("node-00")
			w.agentReports("node-00", imgV1, imageref.Pinned{}, fleetv1.PhaseIdle)
		}, true},
		{"not soft-rebooted yet: same count", func(w *world) {
			w.now = w.now.Add(10 * time.Second)
			w.agentReports("node-00", imgV0, imgV1, fleetv1.PhaseRebooting)
		}, false},
		{"the soft reboot restarted the old root (nothing prepared)", func(w *world) {
			w.now = w.now.Add(10 * time.Second)
			w.softs["node-00"]++
			w.agentReports("node-00", imgV0, imgV1, fleetv1.PhaseDegraded)
		}, false},
		{"soft-rebooted onto the target but NotReady", func(w *world) { softBack(w); w.nodes["node-00"].Ready = false }, false},
		{"the report with the larger count was seen before phase Reboot", func(w *world) {
			softBack(w)
			s, _ := w.grantOf("node-00", lease.KindReboot)
			w.hb["node-00"] = Heartbeat{Seen: s.Grant.Renewed.Add(-time.Second)}
		}, false},
		{"the report with the larger count was seen at the moment of phase Reboot", func(w *world) {
			softBack(w)
			s, _ := w.grantOf("node-00", lease.KindReboot)
			w.hb["node-00"] = Heartbeat{Seen: s.Grant.Renewed}
		}, false},
		{"the agent's report is from another boot ID than the kubelet's", func(w *world) {
			softBack(w)
			w.bns["node-00"].Status.BootID = bootID("node-00", 7)
		}, false},
		{"a count below the grant's is no soft reboot", func(w *world) {
			softBack(w)
			s, _ := w.grantOf("node-00", lease.KindReboot)
			l := w.leases[s.Name]
			l.Annotations[lease.AnnotationSoftRebootCount] = "5"
		}, false},
		{"a count beyond uint32 is no status", func(w *world) {
			softBack(w)
			w.bns["node-00"].Status.SoftRebootCount = 1 << 32
		}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := rebootingWorld(t, false)
			c.mutate(w)
			out := w.plan()
			rel := changes(out, OpRelease, lease.KindReboot)
			if got := len(rel) == 1; got != c.want {
				t.Fatalf("release: got %v, want %v (%+v, events %+v)", got, c.want, out.Changes, out.Events)
			}
			if c.want && (!rel[0].Uncordon || rel[0].Why != WhyVerified || !hasEvent(out, fleetv1.EventNodeUpdated, "node-00")) {
				t.Fatalf("release %+v, events %+v", rel[0], out.Events)
			}
			if !c.want && len(changes(out, OpRevoke, lease.KindReboot)) != 0 {
				t.Fatalf("a grant in phase Reboot was revoked: %+v", out.Changes)
			}
		})
	}
}

func TestSoftRebootReleaseSaysSo(t *testing.T) {
	w := rebootingWorld(t, false)
	w.now = w.now.Add(10 * time.Second)
	w.softReboot("node-00")
	w.agentReports("node-00", imgV1, imageref.Pinned{}, fleetv1.PhaseIdle)
	if out := w.plan(); !hasEvent(out, fleetv1.EventNodeUpdated, "after a soft reboot (boot ID unchanged, soft-reboot count 1, granted at 0)") {
		t.Fatalf("events %+v", out.Events)
	}
}

// A soft reboot that never entered the image times out like a reboot that
// did not come back, and says what the agent reports.
func TestSoftRebootIntoTheOldRootTimesOut(t *testing.T) {
	w := rebootingWorld(t, false)
	w.now = w.now.Add(10 * time.Second)
	w.softs["node-00"]++
	w.agentReports("node-00", imgV0, imgV1, fleetv1.PhaseDegraded)
	w.now = w.now.Add(15 * time.Minute)
	out := w.plan()
	if len(changes(out, OpMarkFailed, lease.KindReboot)) != 1 || !hasEvent(out, fleetv1.EventRebootTimeout, "it booted "+imgV0.Digest) {
		t.Fatalf("changes %+v, events %+v", out.Changes, out.Events)
	}
}

// A grant issued before a soft reboot is void for the agent (another boot);
// the coordinator takes back grants that cannot have been used yet. A stage
// grant is finished (amendment 31): the next stage grant, here its own
// node's in the new boot, hands it on in one write.
func TestGrantsOfTheBootBeforeASoftRebootAreRevoked(t *testing.T) {
	t.Run("stage", func(t *testing.T) {
		w := settled(1, 1, 1)
		w.step()
		old, _ := w.grantOf("node-00", lease.KindStage)
		w.now = w.now.Add(5 * time.Second)
		w.softs["node-00"]++
		w.agentReports("node-00", imgV0, imageref.Pinned{}, fleetv1.PhaseWaiting)
		if s, _ := w.slot(w.leases[old.Name]); s.Phase != PhaseFinished {
			t.Fatalf("stage slot of the boot before is %s, want %s", s.Phase, PhaseFinished)
		}
		out := w.plan()
		cs := changes(out, OpGrant, lease.KindStage)
		if len(out.Changes) != 1 || len(cs) != 1 || cs[0].Slot != old.Name || cs[0].SoftRebootCount != 1 {
			t.Fatalf("changes %+v, want one grant of %s in the new boot", out.Changes, old.Name)
		}
	})
	t.Run("reboot, draining", func(t *testing.T) {
		w := stagedWorld(1, 1)
		w.step()
		if s, ok := w.grantOf("node-00", lease.KindReboot); !ok || s.Grant.Phase != lease.PhaseDraining {
			t.Fatalf("setup: %+v", s)
		}
		w.softs["node-00"]++
		w.agentReports("node-00", imgV0, imgV1, fleetv1.PhaseStaged)
		out := w.plan()
		cs := changes(out, OpRevoke, lease.KindReboot)
		if len(cs) != 1 || cs[0].Why != WhyBootChanged || !cs[0].Uncordon {
			t.Fatalf("changes %+v", out.Changes)
		}
		var ev string
		for _, e := range out.Events {
			ev += e.Message
		}
		if !strings.Contains(ev, "rebooted outside the grant (same boot ID, soft-reboot count 1, granted at 0)") {
			t.Fatalf("events %+v", out.Events)
		}
	})
}

// A whole AllowSoftReboot rollout: every node soft-reboots once onto the
// target, every slot is released, nobody is left cordoned.
func TestFullRolloutConvergesWithSoftReboots(t *testing.T) {
	w := settled(5, 2, 2)
	w.pool.Spec.RebootPolicy = fleetv1.RebootPolicyAllowSoftReboot
	w.soft = true
	w.converge(60, nil)
	for _, name := range sortedKeys(w.nodes) {
		n, bn := w.nodes[name], w.bns[name]
		if bn.Status.Booted == nil || bn.Status.Booted.Digest != imgV1.Digest || w.softs[name] != 1 || w.boots[name] != 1 || n.Unschedulable {
			t.Errorf("node %s: booted %+v, soft reboots %d, boots %d, cordoned %v; want on %s after one soft reboot", name,
				bn.Status.Booted, w.softs[name], w.boots[name], n.Unschedulable, imgV1)
		}
	}
	if h := w.held(lease.KindReboot) + w.held(lease.KindStage); h != 0 {
		t.Errorf("%d slots still held", h)
	}
}
