package plan

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// A held node gets no new grant of either kind, is counted and named, is no
// failure, and what it already holds finishes.
func TestHeldNodeGetsNoNewGrants(t *testing.T) {
	w := stagedWorld(2, 2)
	w.nodes["node-00"].Held, w.nodes["node-00"].HoldReason = true, "disk replacement"
	out := w.step()
	if g := nodesOf(changes(out, OpGrant, lease.KindReboot)); len(g) != 1 || g[0] != "node-01" {
		t.Fatalf("reboot grants %v, want node-01 only", g)
	}
	if out.Status.Held != 1 || out.Status.Failures != 0 {
		t.Fatalf("held %d failures %d", out.Status.Held, out.Status.Failures)
	}
	if c := cond(out, fleetv1.PoolProgressing); !strings.Contains(c.Message, "1 node(s) held (fleet.bootc.dev/hold): node-00 (disk replacement)") {
		t.Fatalf("Progressing %q", c.Message)
	}
	// Stage grants skip it too.
	w2 := settled(1, 1, 1)
	w2.nodes["node-00"].Held = true
	if out := w2.plan(); len(changes(out, OpGrant, lease.KindStage)) != 0 {
		t.Fatal("stage grant to a held node")
	}
	// A hold set after the grant does not take the grant back.
	w.nodes["node-01"].Held = true
	out = w.step()
	if len(changes(out, OpRevoke, lease.KindReboot)) != 0 {
		t.Fatalf("revoked the reboot grant of a node held after it: %+v", out.Changes)
	}
	if _, ok := w.grantOf("node-01", lease.KindReboot); !ok {
		t.Fatal("held node lost its grant")
	}
}

func windowed(w *world, ws ...fleetv1.MaintenanceWindow) {
	w.pool.Spec.Rollout.Windows = ws
}

// Outside every window no reboot grant is given (staging goes on unless
// stageOnlyInWindow), the pool says when the next opens and wakes up then;
// work granted inside a window finishes after it closes.
func TestMaintenanceWindowGatesGrants(t *testing.T) {
	// t0 is noon UTC (world_test.go): a window at 02:00 UTC is closed.
	closedNow := win("02:00", time.Hour, "")
	opens := time.Date(t0.Year(), t0.Month(), t0.Day()+1, 2, 0, 0, 0, time.UTC)
	w := stagedWorld(1, 1)
	windowed(w, closedNow)
	out := w.plan()
	if len(changes(out, OpGrant, lease.KindReboot)) != 0 {
		t.Fatal("reboot grant outside the window")
	}
	c := cond(out, fleetv1.PoolMaintenanceWindow)
	if c.Status != metav1.ConditionFalse || c.Reason != fleetv1.ReasonWindowClosed || !strings.Contains(c.Message, "next opens at "+opens.Format(time.RFC3339)) {
		t.Fatalf("MaintenanceWindow %+v", c)
	}
	if out.RequeueAfter <= 0 || out.RequeueAfter > opens.Sub(t0) {
		t.Fatalf("requeue after %s, want by the opening", out.RequeueAfter)
	}
	// Staging is not gated...
	ws := settled(1, 1, 1)
	windowed(ws, closedNow)
	if len(changes(ws.plan(), OpGrant, lease.KindStage)) != 1 {
		t.Fatal("no stage grant outside the window without stageOnlyInWindow")
	}
	// ... unless asked.
	ws.pool.Spec.Rollout.StageOnlyInWindow = true
	if out := ws.plan(); len(changes(out, OpGrant, lease.KindStage)) != 0 || !strings.Contains(cond(out, fleetv1.PoolMaintenanceWindow).Message, "no new stage grants") {
		t.Fatal("stage grant outside the window with stageOnlyInWindow")
	}
	// The window opens: grant.
	w.now = opens.Add(30 * time.Minute)
	w.agentReports("node-00", imgV0, imgV1, fleetv1.PhaseStaged)
	out = w.step()
	if len(changes(out, OpGrant, lease.KindReboot)) != 1 {
		t.Fatalf("no reboot grant inside the window: %+v", out.Changes)
	}
	if c := cond(out, fleetv1.PoolMaintenanceWindow); c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, "open until "+opens.Add(time.Hour).Format(time.RFC3339)) {
		t.Fatalf("MaintenanceWindow %+v", c)
	}
	// It closes while the node drains: the grant goes on.
	w.now = opens.Add(90 * time.Minute)
	w.agentReports("node-00", imgV0, imgV1, fleetv1.PhaseStaged)
	out = w.step()
	if len(changes(out, OpRevoke, lease.KindReboot)) != 0 {
		t.Fatal("closing window revoked granted work")
	}
	if _, ok := w.grantOf("node-00", lease.KindReboot); !ok {
		t.Fatal("grant lost when the window closed")
	}
	// A window that cannot be read keeps reboots from being granted.
	wb := stagedWorld(1, 1)
	windowed(wb, win("02:00", time.Hour, "Nowhere/Atlantis"))
	out = wb.plan()
	if len(changes(out, OpGrant, lease.KindReboot)) != 0 || cond(out, fleetv1.PoolMaintenanceWindow).Reason != fleetv1.ReasonInvalidWindow {
		t.Fatalf("unreadable window: changes %+v condition %+v", out.Changes, cond(out, fleetv1.PoolMaintenanceWindow))
	}
}

// rebootAndReturn takes name's reboot grant through Reboot and back on imgV1.
func rebootAndReturn(t *testing.T, w *world, name string) {
	t.Helper()
	for i := 0; i < 6; i++ {
		s, ok := w.grantOf(name, lease.KindReboot)
		if !ok {
			t.Fatalf("%s has no reboot grant", name)
		}
		if s.Grant.Phase == lease.PhaseReboot {
			break
		}
		w.drains[name] = Drain{Grant: s.Grant.ID, State: DrainDone}
		w.step()
	}
	w.now = w.now.Add(5 * time.Second)
	w.reboot(name)
	w.agentReports(name, imgV1, imageref.Pinned{}, fleetv1.PhaseIdle)
}

// With minReadySeconds a node back on the image keeps its slot until it has
// stayed back that long; one that falls over in between starts again.
func TestMinReadySecondsHoldsTheSlot(t *testing.T) {
	w := stagedWorld(2, 1)
	w.pool.Spec.Rollout.MinReadySeconds = 60
	w.step()
	rebootAndReturn(t, w, "node-00")
	out := w.step()
	if len(changes(out, OpRelease, lease.KindReboot)) != 0 || len(changes(out, OpMarkBack, lease.KindReboot)) != 1 || !hasEvent(out, fleetv1.EventNodeBack, "once it has stayed Ready for 1m0s") {
		t.Fatalf("first sight of the node back: %+v %+v", out.Changes, out.Events)
	}
	if out.RequeueAfter <= 0 || out.RequeueAfter > time.Minute {
		t.Fatalf("requeue %s", out.RequeueAfter)
	}
	// Falls over at 30s: the record is cleared, the slot stays held.
	w.now = w.now.Add(30 * time.Second)
	w.nodes["node-00"].Ready = false
	out = w.step()
	if mb := changes(out, OpMarkBack, lease.KindReboot); len(mb) != 1 || !mb[0].BackSince.IsZero() || !hasEvent(out, fleetv1.EventNodeFellOver, "node-00") {
		t.Fatalf("falling over: %+v %+v", out.Changes, out.Events)
	}
	// Ready again: the clock starts over.
	w.now = w.now.Add(10 * time.Second)
	w.nodes["node-00"].Ready = true
	w.agentReports("node-00", imgV1, imageref.Pinned{}, fleetv1.PhaseIdle)
	w.step()
	w.now = w.now.Add(59 * time.Second)
	w.agentReports("node-00", imgV1, imageref.Pinned{}, fleetv1.PhaseIdle)
	if out := w.step(); len(changes(out, OpRelease, lease.KindReboot)) != 0 {
		t.Fatal("released before minReadySeconds after coming back again")
	}
	w.now = w.now.Add(2 * time.Second)
	w.agentReports("node-00", imgV1, imageref.Pinned{}, fleetv1.PhaseIdle)
	out = w.step()
	if len(changes(out, OpRelease, lease.KindReboot)) != 1 {
		t.Fatalf("not released after minReadySeconds: %+v", out.Changes)
	}
	// Without minReadySeconds the release is immediate (and nothing is marked).
	w2 := stagedWorld(1, 1)
	w2.step()
	rebootAndReturn(t, w2, "node-00")
	out = w2.step()
	if len(changes(out, OpRelease, lease.KindReboot)) != 1 || len(changes(out, OpMarkBack, lease.KindReboot)) != 0 {
		t.Fatalf("without minReadySeconds: %+v", out.Changes)
	}
}

// pauseBetweenBatches: batches of maxUnavailable, the next only when the
// last is all back and the pause since its last release is over.
func TestPauseBetweenBatches(t *testing.T) {
	w := stagedWorld(4, 2)
	w.pool.Spec.Rollout.PauseBetweenBatches = &metav1.Duration{Duration: 10 * time.Minute}
	out := w.step()
	if g := nodesOf(changes(out, OpGrant, lease.KindReboot)); len(g) != 2 {
		t.Fatalf("first batch %v, want 2", g)
	}
	rebootAndReturn(t, w, "node-00")
	out = w.step() // node-00's slot is released; node-01 is still out
	if len(changes(out, OpRelease, lease.KindReboot)) != 1 || len(changes(out, OpGrant, lease.KindReboot)) != 0 {
		t.Fatalf("a slot of an unfinished batch went to the next node: %+v", out.Changes)
	}
	// Long after that release, the batch is still out: still no grant.
	w.now = w.now.Add(11 * time.Minute)
	w.agentReports("node-02", imgV0, imgV1, fleetv1.PhaseStaged)
	if out := w.step(); len(changes(out, OpGrant, lease.KindReboot)) != 0 {
		t.Fatalf("granted while the batch is still out: %+v", out.Changes)
	}
	rebootAndReturn(t, w, "node-01")
	out = w.step()
	if len(changes(out, OpRelease, lease.KindReboot)) != 1 || len(changes(out, OpGrant, lease.KindReboot)) != 0 {
		t.Fatalf("no pause after the batch: %+v", out.Changes)
	}
	if c := cond(out, fleetv1.PoolProgressing); !strings.Contains(c.Message, "pausing between batches until") {
		t.Fatalf("Progressing %q", c.Message)
	}
	if out.RequeueAfter <= 0 || out.RequeueAfter > 10*time.Minute {
		t.Fatalf("requeue %s, want by the pause's end", out.RequeueAfter)
	}
	w.now = w.now.Add(9 * time.Minute)
	w.agentReports("node-02", imgV0, imgV1, fleetv1.PhaseStaged)
	w.agentReports("node-03", imgV0, imgV1, fleetv1.PhaseStaged)
	if out := w.step(); len(changes(out, OpGrant, lease.KindReboot)) != 0 {
		t.Fatal("granted during the pause")
	}
	w.now = w.now.Add(time.Minute + time.Second)
	w.agentReports("node-02", imgV0, imgV1, fleetv1.PhaseStaged)
	w.agentReports("node-03", imgV0, imgV1, fleetv1.PhaseStaged)
	if g := nodesOf(changes(w.step(), OpGrant, lease.KindReboot)); len(g) != 2 {
		t.Fatalf("second batch %v, want 2 at once", g)
	}
	// The pause is kept on the free slots, so a restarted coordinator keeps it.
	var marked int
	for _, l := range w.leases {
		if l.Annotations[lease.AnnotationReleasedAt] != "" {
			marked++
		}
	}
	if marked != 0 {
		t.Fatalf("%d granted slots still carry released-at", marked)
	}
}

// A reboot slot freed by a verified node goes to the next staged node in the
// same pass, written after the release, within maxUnavailable.
func TestFreedSlotGoesOnInTheSamePass(t *testing.T) {
	w := stagedWorld(2, 1)
	w.step()
	rebootAndReturn(t, w, "node-00")
	out := w.step()
	var ops []string
	for _, c := range out.Changes {
		if c.Kind == lease.KindReboot {
			ops = append(ops, string(c.Op)+" "+c.Node)
		}
	}
	if strings.Join(ops, ", ") != "Release node-00, Grant node-01" {
		t.Fatalf("reboot slot changes %v, want the release of node-00 then the grant to node-01", ops)
	}
	if w.held(lease.KindReboot) != 1 {
		t.Fatalf("%d reboot slots held, want 1 (maxUnavailable)", w.held(lease.KindReboot))
	}
}
