package plan

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

var imgV0 = mustPinned("quay.io/example/os@sha256:" + hex('0'))

// settled is a world of n nodes booted on imgV0 whose slots and BootcNodes
// exist, agents reporting in the current boot.
func settled(n, maxUnavailable, maxStaging int) *world {
	w := newWorld(n, maxUnavailable, maxStaging)
	w.step() // create slots and BootcNodes
	for _, name := range sortedKeys(w.nodes) {
		w.agentReports(name, imgV0, imageref.Pinned{}, fleetv1.PhaseWaiting)
	}
	return w
}

func changes(out Output, op Op, kind lease.Kind) []SlotChange {
	var cs []SlotChange
	for _, c := range out.Changes {
		if c.Op == op && c.Kind == kind {
			cs = append(cs, c)
		}
	}
	return cs
}

func nodesOf(cs []SlotChange) []string {
	var ns []string
	for _, c := range cs {
		ns = append(ns, c.Node)
	}
	return ns
}

func cond(out Output, typ string) metav1.Condition {
	c := meta.FindStatusCondition(out.Status.Conditions, typ)
	if c == nil {
		return metav1.Condition{}
	}
	return *c
}

func hasEvent(out Output, reason, substr string) bool {
	for _, e := range out.Events {
		if e.Reason == reason && strings.Contains(e.Message, substr) {
			return true
		}
	}
	return false
}

func TestResolveBudget(t *testing.T) {
	for _, c := range []struct {
		name          string
		unav, staging *intstr.IntOrString
		size          int
		wantU, wantS  int
	}{
		{"defaults are 1 and 25%", nil, nil, 10, 1, 3},
		{"integers are taken as is", ptr.To(intstr.FromInt32(3)), ptr.To(intstr.FromInt32(5)), 10, 3, 5},
		{"percent rounds up", ptr.To(intstr.FromString("30%")), ptr.To(intstr.FromString("11%")), 10, 3, 2},
		{"percent never below 1", ptr.To(intstr.FromString("1%")), ptr.To(intstr.FromString("1%")), 3, 1, 1},
		{"empty pool still has one slot", ptr.To(intstr.FromString("50%")), nil, 0, 1, 1},
		{"zero integer becomes 1", ptr.To(intstr.FromInt32(0)), ptr.To(intstr.FromInt32(0)), 4, 1, 1},
		{"garbage string becomes 1", ptr.To(intstr.FromString("lots")), nil, 4, 1, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := ResolveBudget(fleetv1.RolloutSpec{MaxUnavailable: c.unav, MaxStaging: c.staging}, c.size)
			if b.MaxUnavailable != c.wantU || b.MaxStaging != c.wantS {
				t.Fatalf("got maxUnavailable %d maxStaging %d, want %d %d", b.MaxUnavailable, b.MaxStaging, c.wantU, c.wantS)
			}
		})
	}
}

func TestSlotsCreatedToBudgetAndOnlyFreeSurplusDeleted(t *testing.T) {
	w := newWorld(4, 2, 1)
	out := w.step()
	if len(out.CreateSlots) != 3 {
		t.Fatalf("created %v, want 2 reboot + 1 stage", out.CreateSlots)
	}
	// Hold reboot-1, then shrink the budget to 1: reboot-1 must stay.
	l := w.leases[lease.SlotName(poolName, lease.KindReboot, 1)]
	ApplyToLease(l, SlotChange{Op: OpGrant, Kind: lease.KindReboot, Node: "node-00", Image: imgV1, BootID: bootID("node-00", 1), CordonedByUs: true}, w.now, time.Minute)
	w.pool.Spec.Rollout.MaxUnavailable = ptr.To(intstr.FromInt32(1))
	out = w.plan()
	if len(out.DeleteSlots) != 0 {
		t.Fatalf("deleted held surplus slot: %v", out.DeleteSlots)
	}
	ApplyToLease(l, SlotChange{Op: OpRelease}, w.now, time.Minute)
	out = w.plan()
	if !reflect.DeepEqual(out.DeleteSlots, []string{"workers-reboot-1"}) {
		t.Fatalf("DeleteSlots = %v, want the free surplus slot", out.DeleteSlots)
	}
}

func TestStageGrantRequiresFreshAgentStatus(t *testing.T) {
	for _, c := range []struct {
		name   string
		mutate func(w *world)
		want   bool
	}{
		{"agent reported in the kubelet's boot", func(*world) {}, true},
		{"agent status from an earlier boot", func(w *world) { w.nodes["node-00"].BootID = bootID("node-00", 2) }, false},
		{"kubelet reports no boot ID", func(w *world) { w.nodes["node-00"].BootID = "" }, false},
		{"node NotReady", func(w *world) { w.nodes["node-00"].Ready = false }, false},
		{"already staged on target", func(w *world) { w.agentReports("node-00", imgV0, imgV1, fleetv1.PhaseStaged) }, false},
		{"already booted on target", func(w *world) { w.agentReports("node-00", imgV1, imageref.Pinned{}, fleetv1.PhaseIdle) }, false},
		{"agent Degraded", func(w *world) { w.agentReports("node-00", imgV0, imageref.Pinned{}, fleetv1.PhaseDegraded) }, false},
		{"also matched by another pool", func(w *world) { w.nodes["node-00"].OtherPools = []string{"other"} }, false},
		{"paused", func(w *world) { w.pool.Spec.Rollout.Paused = true }, false},
		{"resolve failed", func(w *world) { w.resolveErr = "registry unreachable" }, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := settled(1, 1, 1)
			c.mutate(w)
			got := len(changes(w.plan(), OpGrant, lease.KindStage)) == 1
			if got != c.want {
				t.Fatalf("stage grant: got %v, want %v", got, c.want)
			}
		})
	}
}

func TestStageGrantCarriesNodeBootAndTarget(t *testing.T) {
	w := settled(1, 1, 1)
	out := w.step()
	cs := changes(out, OpGrant, lease.KindStage)
	if len(cs) != 1 || cs[0].BootID != bootID("node-00", 1) || cs[0].Image != imgV1 {
		t.Fatalf("grant = %+v", cs)
	}
	s, ok := w.grantOf("node-00", lease.KindStage)
	if !ok || s.Grant.Transitions != 1 || s.Grant.Duration != time.Minute || s.Grant.Phase != "" {
		t.Fatalf("lease after grant = %+v", s)
	}
	if len(out.Events) != 0 {
		t.Fatalf("a stage grant records no Event (the Lease and the coordinator's log say it; Staged follows): %+v", out.Events)
	}
}

func TestStageGrantsBoundedByMaxStaging(t *testing.T) {
	w := settled(10, 1, 3)
	out := w.step()
	if got := nodesOf(changes(out, OpGrant, lease.KindStage)); !reflect.DeepEqual(got, []string{"node-00", "node-01", "node-02"}) {
		t.Fatalf("stage grants to %v, want the first three by name", got)
	}
	if out := w.step(); len(changes(out, OpGrant, lease.KindStage)) != 0 {
		t.Fatal("granted beyond maxStaging")
	}
}

func TestStageSlotRelease(t *testing.T) {
	for _, c := range []struct {
		name    string
		mutate  func(w *world)
		wantOp  Op
		wantWhy string
	}{
		{"agent reports the image staged, not locked", func(w *world) {
			w.agentReports("node-00", imgV0, imgV1, fleetv1.PhaseStaged)
			w.bns["node-00"].Status.Staged.DownloadOnly = false
		}, OpRelease, WhyStaged},
		// Finished: kept, handed on by the next stage grant (amendment 31).
		{"agent reports the image staged", func(w *world) { w.agentReports("node-00", imgV0, imgV1, fleetv1.PhaseStaged) }, "", ""},
		{"lease not renewed within its duration", func(w *world) { w.now = w.now.Add(61 * time.Second) }, OpRelease, WhyExpired},
		{"target changed", func(w *world) { w.target = imgV2 }, OpRevoke, WhyImageChanged},
		{"node rebooted since the grant", func(w *world) { w.reboot("node-00") }, "", ""},
		{"node left the pool", func(w *world) { w.nodes["node-00"].InPool = false }, OpRevoke, WhyLeftPool},
		{"node deleted", func(w *world) { delete(w.nodes, "node-00") }, OpRelease, WhyNodeDeleted},
		{"still staging, renewed", func(w *world) { w.now = w.now.Add(30 * time.Second) }, "", ""},
		{"stale status claims staged", func(w *world) {
			w.agentReports("node-00", imgV0, imgV1, fleetv1.PhaseStaged)
			w.bns["node-00"].Status.BootID = bootID("node-00", 0)
		}, "", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := settled(1, 1, 1)
			w.step()
			if _, ok := w.grantOf("node-00", lease.KindStage); !ok {
				t.Fatal("setup: no stage grant")
			}
			c.mutate(w)
			cs := changes(w.plan(), c.wantOp, lease.KindStage)
			if c.wantOp == "" {
				out := w.plan()
				if len(changes(out, OpRelease, lease.KindStage))+len(changes(out, OpRevoke, lease.KindStage)) != 0 {
					t.Fatalf("slot freed too early: %+v", out.Changes)
				}
				return
			}
			if len(cs) != 1 || cs[0].Why != c.wantWhy {
				t.Fatalf("changes %+v, want one %s (%s)", w.plan().Changes, c.wantOp, c.wantWhy)
			}
		})
	}
}

// A revoked stage holder keeps downloading until its agent cancels: its
// slot goes to no one else while it still reports Staging, unless it has
// been quiet for a lease duration.
func TestRevokedStagerHoldsItsBudgetUntilItStops(t *testing.T) {
	for _, c := range []struct {
		name      string
		then      func(w *world)
		wantGrant bool
	}{
		{"still reports Staging", func(w *world) { w.now = w.now.Add(30 * time.Second) }, false},
		{"reports that it stopped", func(w *world) { w.agentReports("node-00", imgV0, imageref.Pinned{}, fleetv1.PhaseWaiting) }, true},
		{"quiet for a lease duration", func(w *world) { w.now = w.now.Add(61 * time.Second) }, true},
		{"Staging reported in an earlier boot", func(w *world) { w.reboot("node-00") }, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := settled(3, 1, 1)
			w.step()
			if _, ok := w.grantOf("node-00", lease.KindStage); !ok {
				t.Fatal("setup: node-00 has no stage grant")
			}
			w.agentReports("node-00", imgV0, imageref.Pinned{}, fleetv1.PhaseStaging)
			w.target = imgV2
			if out := w.step(); len(changes(out, OpRevoke, lease.KindStage)) != 1 {
				t.Fatalf("setup: stage grant not revoked: %+v", out.Changes)
			}
			out := w.step() // BootcNodes now ask for v2
			if got := changes(out, OpGrant, lease.KindStage); len(got) != 0 {
				t.Fatalf("stage slot handed on while its revoked holder still downloads: %+v", got)
			}
			if out.RequeueAfter <= 0 || out.RequeueAfter > time.Minute {
				t.Fatalf("requeue after %s, want by the end of the holder's quiet period", out.RequeueAfter)
			}
			c.then(w)
			got := changes(w.step(), OpGrant, lease.KindStage)
			if c.wantGrant != (len(got) == 1) {
				t.Fatalf("stage grants %+v, want a grant: %v", got, c.wantGrant)
			}
		})
	}
}

// stagedWorld: n nodes with imgV1 staged download-only in the current boot.
func stagedWorld(n, maxUnavailable int) *world {
	w := settled(n, maxUnavailable, n)
	for _, name := range sortedKeys(w.nodes) {
		w.agentReports(name, imgV0, imgV1, fleetv1.PhaseStaged)
	}
	return w
}

func TestRebootGrantRequiresStagedTargetInCurrentBoot(t *testing.T) {
	for _, c := range []struct {
		name   string
		mutate func(w *world)
		want   bool
	}{
		{"staged download-only, Ready, fresh", func(*world) {}, true},
		{"staged but not download-only", func(w *world) { w.bns["node-00"].Status.Staged.DownloadOnly = false }, false},
		{"staged another image", func(w *world) { w.agentReports("node-00", imgV0, imgV2, fleetv1.PhaseStaged) }, false},
		{"status from an earlier boot", func(w *world) { w.nodes["node-00"].BootID = bootID("node-00", 9) }, false},
		{"node NotReady", func(w *world) { w.nodes["node-00"].Ready = false }, false},
		{"desired image not yet written", func(w *world) { w.bns["node-00"].Spec.DesiredImage = "" }, false},
		{"paused", func(w *world) { w.pool.Spec.Rollout.Paused = true }, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := stagedWorld(1, 1)
			c.mutate(w)
			got := len(changes(w.plan(), OpGrant, lease.KindReboot)) == 1
			if got != c.want {
				t.Fatalf("reboot grant: got %v, want %v", got, c.want)
			}
		})
	}
}

func TestRebootGrantsBoundedByUnavailableNodes(t *testing.T) {
	for _, c := range []struct {
		name    string
		mutate  func(w *world)
		want    []string
		cordons []bool
	}{
		{"all healthy: maxUnavailable grants", func(*world) {}, []string{"node-00", "node-01", "node-02"}, []bool{true, true, true}},
		{"one NotReady node takes one slot's budget", func(w *world) { w.nodes["node-05"].Ready = false }, []string{"node-00", "node-01"}, []bool{true, true}},
		{"a node cordoned by someone else is granted first, at no extra cost", func(w *world) { w.nodes["node-05"].Unschedulable = true },
			[]string{"node-05", "node-00", "node-01"}, []bool{false, true, true}},
		{"three NotReady nodes leave no budget", func(w *world) {
			for _, n := range []string{"node-04", "node-05", "node-06"} {
				w.nodes[n].Ready = false
			}
		}, nil, nil},
		{"nodes outside the pool do not count", func(w *world) {
			w.nodes["outside"] = &Node{Name: "outside", Ready: false}
		}, []string{"node-00", "node-01", "node-02"}, []bool{true, true, true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := stagedWorld(8, 3)
			c.mutate(w)
			cs := changes(w.step(), OpGrant, lease.KindReboot)
			if got := nodesOf(cs); !reflect.DeepEqual(got, c.want) {
				t.Fatalf("reboot grants to %v, want %v", got, c.want)
			}
			// Whose cordon it is, is what the cordon after the grant found.
			for i, g := range cs {
				if got := w.cordonedByUs(g.Node); got != c.cordons[i] {
					t.Fatalf("grant %s cordoned by us %v, want %v", g.Node, got, c.cordons[i])
				}
			}
		})
	}
}

func TestDrainingGrantCordonsDrainsThenAdvances(t *testing.T) {
	w := stagedWorld(1, 1)
	out := w.step() // reboot grant; world cordons and starts the drain
	s, _ := w.grantOf("node-00", lease.KindReboot)
	if s.Grant.Phase != lease.PhaseDraining || !w.cordonedByUs("node-00") || !w.nodes["node-00"].Unschedulable {
		t.Fatalf("after grant: %+v unschedulable=%v", s, w.nodes["node-00"].Unschedulable)
	}
	if g := changes(out, OpGrant, lease.KindReboot); len(g) != 1 || g[0].DrainTimeout != 10*time.Minute {
		t.Fatalf("reboot grant %+v: want one, draining for 10m once cordoned", g)
	}
	if d := w.drains["node-00"]; d.Grant != s.Grant.ID || d.State != DrainRunning {
		t.Fatalf("drain after the grant's cordon = %+v", d)
	}
	// A restarted coordinator has no drain running: it starts one.
	delete(w.drains, "node-00")
	out = w.step()
	if len(out.StartDrains) != 1 || out.StartDrains[0].Grant != s.Grant.ID || out.StartDrains[0].Timeout != 10*time.Minute || len(out.Changes) != 0 {
		t.Fatalf("StartDrains = %+v, changes %+v", out.StartDrains, out.Changes)
	}
	if out := w.step(); len(out.Changes)+len(out.StartDrains) != 0 {
		t.Fatalf("while draining: %+v", out)
	}

	// A failed drain: event naming the blocker, retried, never advanced.
	w.drains["node-00"] = Drain{Grant: s.Grant.ID, State: DrainFailed, Attempts: 1, Message: `pod default/web-0 blocked by PodDisruptionBudget "web-pdb"`}
	out = w.step()
	if len(changes(out, OpAdvance, lease.KindReboot)) != 0 || len(out.StartDrains) != 1 {
		t.Fatalf("after failed drain: %+v", out)
	}
	if !hasEvent(out, fleetv1.EventDrainFailed, "web-pdb") {
		t.Fatalf("no DrainFailed event naming the PDB: %+v", out.Events)
	}
	if c := cond(out, fleetv1.PoolDegraded); c.Reason != fleetv1.ReasonDrainFailed || !strings.Contains(c.Message, "web-pdb") {
		t.Fatalf("Degraded = %+v", c)
	}

	// A drain result for another grant does not count.
	w.drains["node-00"] = Drain{Grant: lease.ID{Lease: s.Name, Transitions: 99}, State: DrainDone}
	if out := w.plan(); len(changes(out, OpAdvance, lease.KindReboot)) != 0 {
		t.Fatal("advanced on another grant's drain")
	}
	w.drains["node-00"] = Drain{Grant: s.Grant.ID, State: DrainDone}
	out = w.step()
	if len(changes(out, OpAdvance, lease.KindReboot)) != 1 {
		t.Fatalf("did not advance after drain: %+v", out.Changes)
	}
	if s, _ := w.grantOf("node-00", lease.KindReboot); s.Grant.Phase != lease.PhaseReboot || !s.CordonedByUs {
		t.Fatalf("after advance: phase %q, cordoned-by-us recorded %v", s.Grant.Phase, s.CordonedByUs)
	}
}

func TestDrainingGrantRecordsCordonWhenNodeWasUncordoned(t *testing.T) {
	w := stagedWorld(1, 1)
	w.nodes["node-00"].Unschedulable = true // cordoned by someone else
	w.step()
	if s, _ := w.grantOf("node-00", lease.KindReboot); s.CordonedByUs {
		t.Fatal("claimed a cordon someone else set")
	}
	w.nodes["node-00"].Unschedulable = false // they uncordon it mid-drain
	out := w.step()
	if len(changes(out, OpCordon, lease.KindReboot)) != 1 || !w.nodes["node-00"].Unschedulable {
		t.Fatalf("did not re-cordon: %+v", out.Changes)
	}
	if !w.cordonedByUs("node-00") {
		t.Fatal("cordon now ours but not marked")
	}
	s, _ := w.grantOf("node-00", lease.KindReboot)
	w.drains["node-00"] = Drain{Grant: s.Grant.ID, State: DrainDone}
	w.step()
	if s, _ := w.grantOf("node-00", lease.KindReboot); s.Grant.Phase != lease.PhaseReboot || !s.CordonedByUs {
		t.Fatalf("advance did not record the cordon as ours: %+v", s)
	}
}

// rebootingWorld: node-00 holds a reboot grant in phase Reboot, cordoned by
// us (or not).
func rebootingWorld(t *testing.T, cordonedBySomeoneElse bool) *world {
	w := stagedWorld(2, 1)
	w.nodes["node-00"].Unschedulable = cordonedBySomeoneElse
	w.step()
	s, ok := w.grantOf("node-00", lease.KindReboot)
	if !ok {
		t.Fatal("setup: no reboot grant")
	}
	w.step()
	w.drains["node-00"] = Drain{Grant: s.Grant.ID, State: DrainDone}
	w.step()
	if s, _ := w.grantOf("node-00", lease.KindReboot); s.Grant.Phase != lease.PhaseReboot {
		t.Fatal("setup: not in phase Reboot")
	}
	return w
}

func TestRebootSlotReleasedOnlyWhenVerified(t *testing.T) {
	back := func(w *world) {
		w.reboot("node-00")
		w.agentReports("node-00", imgV1, imageref.Pinned{}, fleetv1.PhaseIdle)
	}
	for _, c := range []struct {
		name   string
		mutate func(w *world)
		want   bool
	}{
		{"Ready, new boot equal to the kubelet's, booted target", back, true},
		{"not rebooted yet", func(*world) {}, false},
		{"node NotReady", func(w *world) { back(w); w.nodes["node-00"].Ready = false }, false},
		{"agent status still from the old boot", func(w *world) {
			w.reboot("node-00")
			w.bns["node-00"].Status.BootID = bootID("node-00", 1)
		}, false},
		{"agent reports the new boot but kubelet still the old", func(w *world) {
			back(w)
			w.nodes["node-00"].BootID = bootID("node-00", 1)
			w.bns["node-00"].Status.BootID = bootID("node-00", 1)
		}, false},
		{"booted another image", func(w *world) {
			w.reboot("node-00")
			w.agentReports("node-00", imgV0, imageref.Pinned{}, fleetv1.PhaseDegraded)
		}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := rebootingWorld(t, false)
			c.mutate(w)
			out := w.plan()
			rel := changes(out, OpRelease, lease.KindReboot)
			if got := len(rel) == 1; got != c.want {
				t.Fatalf("release: got %v, want %v (%+v)", got, c.want, out.Changes)
			}
			if c.want && (!rel[0].Uncordon || rel[0].Why != WhyVerified || !hasEvent(out, fleetv1.EventNodeUpdated, "node-00")) {
				t.Fatalf("release %+v, events %+v", rel[0], out.Events)
			}
		})
	}
}

// A node that went down some other way while it held a reboot grant in
// phase Reboot comes back on its old image with its locked stage gone. Its
// agent lists the grant as unused: the slot is revoked (and the cordon
// lifted) at once, not held until rebootTimeout halts the pool.
func TestUnusedRebootGrantOfAnEarlierBootIsRevoked(t *testing.T) {
	for _, c := range []struct {
		name       string
		sameBoot   bool
		released   string
		wantRevoke bool
	}{
		{"new boot, agent says unused", false, fleetv1.ReasonRebootGrantUnused, true},
		{"new boot, agent says nothing (it rebooted under it)", false, "", false},
		{"new boot, another reason", false, fleetv1.ReasonGrantedInAnotherBoot, false},
		{"same boot, agent says unused", true, fleetv1.ReasonRebootGrantUnused, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := rebootingWorld(t, false)
			s, _ := w.grantOf("node-00", lease.KindReboot)
			if !c.sameBoot {
				w.reboot("node-00")
			}
			w.agentReports("node-00", imgV0, imageref.Pinned{}, fleetv1.PhaseWaiting)
			w.bns["node-00"].Status.Grants = []fleetv1.GrantInUse{{Lease: s.Grant.ID.Lease, UID: s.Grant.ID.UID,
				LeaseTransitions: s.Grant.ID.Transitions, Released: c.released}}
			w.now = w.now.Add(15*time.Minute + time.Second) // past rebootTimeout
			out := w.plan()
			rev := changes(out, OpRevoke, lease.KindReboot)
			if got := len(rev) == 1; got != c.wantRevoke {
				t.Fatalf("revoke: got %v, want %v (%+v)", got, c.wantRevoke, out.Changes)
			}
			if c.wantRevoke {
				if !rev[0].Uncordon || len(changes(out, OpMarkFailed, lease.KindReboot)) != 0 || !hasEvent(out, fleetv1.EventGrantRevoked, "node-00") {
					t.Fatalf("revoke %+v; changes %+v; events %+v", rev[0], out.Changes, out.Events)
				}
			}
		})
	}
}

func TestReleaseRestoresSomeoneElsesCordon(t *testing.T) {
	w := rebootingWorld(t, true)
	w.reboot("node-00")
	w.agentReports("node-00", imgV1, imageref.Pinned{}, fleetv1.PhaseIdle)
	out := w.step()
	rel := changes(out, OpRelease, lease.KindReboot)
	if len(rel) != 1 || rel[0].Uncordon || !w.nodes["node-00"].Unschedulable {
		t.Fatalf("release %+v; node unschedulable %v (must stay cordoned)", rel, w.nodes["node-00"].Unschedulable)
	}
}

func TestRebootTimeoutMarksFailedAndHalts(t *testing.T) {
	w := rebootingWorld(t, false)
	w.pool.Spec.Rollout.MaxStaging = ptr.To(intstr.FromInt32(2))
	w.reboot("node-00")
	w.nodes["node-00"].Ready = false
	w.now = w.now.Add(15*time.Minute + time.Second)
	// node-01 is staged and would get the reboot slot if there were one;
	// give the pool a second reboot slot so only the halt can stop it.
	w.pool.Spec.Rollout.MaxUnavailable = ptr.To(intstr.FromInt32(3))
	out := w.step()
	mf := changes(out, OpMarkFailed, lease.KindReboot)
	if len(mf) != 1 || mf[0].Failure != fleetv1.ReasonRebootTimeout {
		t.Fatalf("changes %+v, want MarkFailed RebootTimeout", out.Changes)
	}
	if len(changes(out, OpRelease, lease.KindReboot))+len(changes(out, OpRevoke, lease.KindReboot)) != 0 {
		t.Fatal("released a reboot slot whose node did not come back")
	}
	if c := cond(out, fleetv1.PoolHalted); c.Status != metav1.ConditionTrue || c.Reason != fleetv1.ReasonFailuresReached {
		t.Fatalf("Halted = %+v", c)
	}
	if out.Status.Failures != 1 || !hasEvent(out, fleetv1.EventRebootTimeout, "node-00") || !hasEvent(out, fleetv1.EventHalted, "node-00") {
		t.Fatalf("failures %d events %+v", out.Status.Failures, out.Events)
	}
	s, _ := w.grantOf("node-00", lease.KindReboot)
	if s.Grant.Failure != fleetv1.ReasonRebootTimeout {
		t.Fatalf("lease not marked: %+v", s.Grant)
	}
	// Later: still held, halted, no reboot grant to node-01 even with free slots.
	w.step()
	w.now = w.now.Add(time.Hour)
	out = w.step()
	if len(changes(out, OpGrant, lease.KindReboot)) != 0 {
		t.Fatal("reboot grant while halted")
	}
	if _, ok := w.grantOf("node-00", lease.KindReboot); !ok {
		t.Fatal("failed reboot slot reclaimed by expiry")
	}
	// Staging continues while halted.
	w.target = imgV2
	w.step()
	w.step()
	if _, ok := w.grantOf("node-01", lease.KindStage); !ok {
		t.Fatal("no stage grant while halted")
	}
}

func TestHaltAfterFailuresAboveOneKeepsGranting(t *testing.T) {
	w := rebootingWorld(t, false)
	w.pool.Spec.Rollout.HaltAfterFailures = ptr.To(int32(2))
	w.pool.Spec.Rollout.MaxUnavailable = ptr.To(intstr.FromInt32(2))
	w.reboot("node-00")
	w.nodes["node-00"].Ready = false
	w.now = w.now.Add(16 * time.Minute)
	w.step()
	out := w.step()
	if cond(out, fleetv1.PoolHalted).Status != metav1.ConditionFalse {
		t.Fatal("halted at 1 of 2 failures")
	}
	if cond(out, fleetv1.PoolDegraded).Reason != fleetv1.ReasonNodesDegraded {
		t.Fatalf("Degraded = %+v", cond(out, fleetv1.PoolDegraded))
	}
}

func TestPausedGrantsNothingButFinishesGrantedWork(t *testing.T) {
	w := stagedWorld(3, 1)
	w.step()
	s, _ := w.grantOf("node-00", lease.KindReboot)
	w.step()
	w.pool.Spec.Rollout.Paused = true
	w.drains["node-00"] = Drain{Grant: s.Grant.ID, State: DrainDone}
	w.pool.Spec.Rollout.MaxUnavailable = ptr.To(intstr.FromInt32(3))
	out := w.step()
	if len(changes(out, OpAdvance, lease.KindReboot)) != 1 {
		t.Fatal("granted work did not continue while paused")
	}
	out = w.step()
	if n := len(changes(out, OpGrant, lease.KindReboot)) + len(changes(out, OpGrant, lease.KindStage)); n != 0 {
		t.Fatalf("%d grants while paused", n)
	}
	if c := cond(out, fleetv1.PoolProgressing); c.Reason != fleetv1.ReasonPaused {
		t.Fatalf("Progressing = %+v", c)
	}
	w.pool.Spec.Rollout.Paused = false
	if out := w.plan(); len(changes(out, OpGrant, lease.KindReboot)) != 2 {
		t.Fatalf("resume: %+v", out.Changes)
	}
}

func TestNodeLeavingPoolRevokesRestoresCordonAndDeletesBootcNode(t *testing.T) {
	w := stagedWorld(2, 1)
	w.step()
	w.nodes["node-00"].InPool = false
	out := w.step()
	rv := changes(out, OpRevoke, lease.KindReboot)
	if len(rv) != 1 || !rv[0].Uncordon || rv[0].Why != WhyLeftPool {
		t.Fatalf("revoke %+v", out.Changes)
	}
	if w.nodes["node-00"].Unschedulable {
		t.Fatal("cordon not restored")
	}
	if !reflect.DeepEqual(out.DeleteBootcNodes, []string{"node-00"}) || !reflect.DeepEqual(out.StopDrains, []string{"node-00"}) {
		t.Fatalf("DeleteBootcNodes %v StopDrains %v", out.DeleteBootcNodes, out.StopDrains)
	}
}

func TestDeletedNodeKeepsItsRebootSlotUntilBackOrTimedOut(t *testing.T) {
	t.Run("deleted while rebooting: held, the next node waits", func(t *testing.T) {
		w := rebootingWorld(t, false) // maxUnavailable 1, node-01 staged and waiting
		gone := *w.nodes["node-00"]
		delete(w.nodes, "node-00")
		w.now = w.now.Add(14 * time.Minute)
		out := w.step()
		if rel := changes(out, OpRelease, lease.KindReboot); len(rel) != 0 {
			t.Fatalf("reboot slot released while its machine may be down: %+v", rel)
		}
		if g := changes(out, OpGrant, lease.KindReboot); len(g) != 0 {
			t.Fatalf("a second node granted a reboot while the first may be down: %+v", g)
		}
		if out.RequeueAfter <= 0 || out.RequeueAfter > time.Minute {
			t.Fatalf("requeue after %s, want at the reboot timeout (1m away)", out.RequeueAfter)
		}
		if c := meta.FindStatusCondition(out.Status.Conditions, fleetv1.PoolAgentsReporting); c == nil || c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, "node-00") {
			t.Fatalf("pool does not name the deleted rebooting node: %+v", c)
		}
		// The machine comes back: the kubelet registers the Node again, the
		// agent reports from its new boot; the slot is verified as usual.
		w.nodes["node-00"] = &gone
		w.step() // BootcNode recreated
		w.reboot("node-00")
		w.agentReports("node-00", imgV1, imageref.Pinned{}, fleetv1.PhaseIdle)
		out = w.step()
		if rel := changes(out, OpRelease, lease.KindReboot); len(rel) != 1 || rel[0].Why != WhyVerified {
			t.Fatalf("slot not released when the machine came back verified: %+v", out.Changes)
		}
	})
	t.Run("deleted while rebooting and gone past rebootTimeout: released", func(t *testing.T) {
		w := rebootingWorld(t, false)
		delete(w.nodes, "node-00")
		w.now = w.now.Add(15 * time.Minute)
		out := w.step()
		rel := changes(out, OpRelease, lease.KindReboot)
		if len(rel) != 1 || rel[0].Uncordon || rel[0].Why != WhyNodeDeleted {
			t.Fatalf("%+v", out.Changes)
		}
		if !reflect.DeepEqual(out.DeleteBootcNodes, []string{"node-00"}) {
			t.Fatalf("DeleteBootcNodes %v", out.DeleteBootcNodes)
		}
	})
	t.Run("deleted while draining: released at once (no reboot can have started)", func(t *testing.T) {
		w := stagedWorld(2, 1)
		w.step()
		if s, ok := w.grantOf("node-00", lease.KindReboot); !ok || s.Grant.Phase != lease.PhaseDraining {
			t.Fatal("setup: node-00 has no Draining grant")
		}
		delete(w.nodes, "node-00")
		out := w.step()
		if rel := changes(out, OpRelease, lease.KindReboot); len(rel) != 1 || rel[0].Why != WhyNodeDeleted {
			t.Fatalf("%+v", out.Changes)
		}
	})
}

func TestConflictingNodeIsReportedAndLeftAlone(t *testing.T) {
	w := newWorld(2, 1, 1)
	w.nodes["node-01"].OtherPools = []string{"gpu"}
	w.addNode(strings.Repeat("n", 70))
	out := w.step()
	for _, c := range out.CreateBootcNodes {
		if c.Name != "node-00" {
			t.Fatalf("created BootcNode for conflicted node %s", c.Name)
		}
	}
	c := cond(out, fleetv1.PoolDegraded)
	if c.Reason != fleetv1.ReasonNodeConflict || !strings.Contains(c.Message, "node-01 (also matched by pool gpu)") || !strings.Contains(c.Message, "not a valid label value") {
		t.Fatalf("Degraded = %+v", c)
	}
	if !hasEvent(out, fleetv1.ReasonNodeConflict, "node-01") {
		t.Fatalf("no NodeConflict event: %+v", out.Events)
	}
	// An existing BootcNode of a conflicted node is left in place.
	w.bns["node-01"] = &fleetv1.BootcNode{Spec: fleetv1.BootcNodeSpec{Pool: poolName}}
	w.bns["node-01"].Name = "node-01"
	if out := w.plan(); len(out.DeleteBootcNodes)+len(out.UpdateBootcNodes) != 0 {
		t.Fatalf("acted on conflicted node: %+v", out)
	}
}

func TestImageChangeMidRollout(t *testing.T) {
	w := settled(6, 2, 2)
	for _, n := range []string{"node-02", "node-03"} {
		w.agentReports(n, imgV0, imgV1, fleetv1.PhaseStaged)
	}
	w.step() // node-00, node-01 stage; node-02, node-03 reboot-granted
	s3, _ := w.grantOf("node-03", lease.KindReboot)
	w.step()
	w.drains["node-03"] = Drain{Grant: s3.Grant.ID, State: DrainDone}
	w.step() // node-03 in phase Reboot; node-02 still draining

	w.target = imgV2
	out := w.step()
	if got := nodesOf(changes(out, OpRevoke, lease.KindStage)); !reflect.DeepEqual(got, []string{"node-00", "node-01"}) {
		t.Fatalf("stage revokes %v", got)
	}
	rv := changes(out, OpRevoke, lease.KindReboot)
	if len(rv) != 1 || rv[0].Node != "node-02" || !rv[0].Uncordon {
		t.Fatalf("reboot revokes %+v", rv)
	}
	if w.nodes["node-02"].Unschedulable {
		t.Fatal("draining node not uncordoned")
	}
	if s, ok := w.grantOf("node-03", lease.KindReboot); !ok || s.Grant.Image != imgV1 {
		t.Fatal("grant in phase Reboot was not left to complete")
	}
	if got := w.bns["node-03"].Spec.DesiredImage; got != imgV1.String() {
		t.Fatalf("node-03 desired %s while rebooting into v1", got)
	}
	if got := w.bns["node-00"].Spec.DesiredImage; got != imgV2.String() {
		t.Fatalf("node-00 desired %s, want v2", got)
	}
	if !hasEvent(out, fleetv1.EventImageChanged, imgV2.String()) || out.Status.TargetImage != imgV2.String() {
		t.Fatalf("events %+v target %s", out.Events, out.Status.TargetImage)
	}
	// The same pass re-issues the stage grants for v2, as the BootcNodes
	// are given v2 (amendment 29).
	for _, c := range changes(out, OpGrant, lease.KindStage) {
		if c.Image != imgV2 {
			t.Fatalf("stage grant for %s", c.Image)
		}
	}
	if len(changes(out, OpGrant, lease.KindStage)) != 2 {
		t.Fatalf("stage grants %+v", out.Changes)
	}
	// node-03 comes back on v1: released, then desired moves to v2.
	w.reboot("node-03")
	w.agentReports("node-03", imgV1, imageref.Pinned{}, fleetv1.PhaseIdle)
	out = w.step()
	if len(changes(out, OpRelease, lease.KindReboot)) != 1 || w.bns["node-03"].Spec.DesiredImage != imgV2.String() {
		t.Fatalf("after v1 reboot: %+v desired %s", out.Changes, w.bns["node-03"].Spec.DesiredImage)
	}
}

func TestResolveErrorDegradesAndGrantsNothing(t *testing.T) {
	w := stagedWorld(2, 1)
	w.resolveErr = "GET https://registry/v2/os/manifests/latest: connection refused"
	out := w.plan()
	if len(out.Changes) != 0 {
		t.Fatalf("changes while resolve fails: %+v", out.Changes)
	}
	c := cond(out, fleetv1.PoolDegraded)
	if c.Status != metav1.ConditionTrue || c.Reason != fleetv1.ReasonResolveFailed || !strings.Contains(c.Message, "connection refused") {
		t.Fatalf("Degraded = %+v", c)
	}
	if !hasEvent(out, fleetv1.ReasonResolveFailed, "connection refused") {
		t.Fatalf("events %+v", out.Events)
	}
}

func TestMalformedSlotIsReset(t *testing.T) {
	w := settled(1, 1, 1)
	l := w.leases["workers-reboot-0"]
	l.Spec.HolderIdentity = ptr.To("node-00")
	l.Annotations = map[string]string{lease.AnnotationImage: "not a ref"}
	out := w.step()
	if len(changes(out, OpReset, lease.KindReboot)) != 1 || !hasEvent(out, fleetv1.EventSlotMalformed, "workers-reboot-0") {
		t.Fatalf("%+v", out)
	}
	if s, _ := ParseSlot(poolName, w.leases["workers-reboot-0"]); s.State != SlotFree {
		t.Fatalf("after reset: %+v", s)
	}
}

func TestBootcNodesFollowMembershipAndTarget(t *testing.T) {
	w := newWorld(2, 1, 1)
	w.pool.Spec.RebootPolicy = fleetv1.RebootPolicyAllowSoftReboot
	out := w.step()
	want := fleetv1.BootcNodeSpec{Pool: poolName, DesiredImage: imgV1.String(), RebootPolicy: fleetv1.RebootPolicyAllowSoftReboot}
	if len(out.CreateBootcNodes) != 2 || out.CreateBootcNodes[0].Spec != want {
		t.Fatalf("create %+v", out.CreateBootcNodes)
	}
	w.target = imgV2
	out = w.step()
	if len(out.UpdateBootcNodes) != 2 || out.UpdateBootcNodes[1].Spec.DesiredImage != imgV2.String() {
		t.Fatalf("update %+v", out.UpdateBootcNodes)
	}
	// A BootcNode still owned by another pool is not taken over.
	w.bns["node-00"].Spec.Pool = "previous"
	if out := w.plan(); len(out.UpdateBootcNodes)+len(out.CreateBootcNodes)+len(out.DeleteBootcNodes) != 0 {
		t.Fatalf("touched another pool's BootcNode: %+v", out)
	}
}

func TestFullRolloutConvergesAndReportsUpToDate(t *testing.T) {
	w := settled(7, 2, 3)
	w.converge(60, nil)
	out := w.plan()
	if out.Status.Updated != 7 || cond(out, fleetv1.PoolUpToDate).Status != metav1.ConditionTrue {
		t.Fatalf("status %+v", out.Status)
	}
	if w.held(lease.KindReboot)+w.held(lease.KindStage) != 0 {
		t.Fatal("slots still held after convergence")
	}
	for name := range w.nodes {
		if w.nodes[name].Unschedulable {
			t.Fatalf("%s left cordoned", name)
		}
	}
}

func TestPlanIsDeterministic(t *testing.T) {
	w := stagedWorld(9, 3)
	w.nodes["node-04"].Unschedulable = true
	in := w.input()
	a, b := Plan(in), Plan(in)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("two plans of one input differ")
	}
}
