package invariant

import (
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
)

const (
	imgA  = "q.io/os@sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	imgB  = "q.io/os@sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
	boot1 = "boot-1"
	boot2 = "boot-2"
)

var pools = map[string]Pool{"p": {MaxUnavailable: 1, MaxStaging: 1, HaltAfter: 1}}

// log builds a history with increasing Seq.
type log struct{ evs []Event }

func (l *log) add(e Event) *log {
	e.Seq = int64(len(l.evs) + 1)
	e.At = time.Unix(0, 0).Add(time.Duration(e.Seq) * time.Second)
	e.Pool = "p"
	if e.CurrentBoot == "" {
		e.CurrentBoot = e.BootID
	}
	if e.ContentBoot == "" {
		e.ContentBoot = e.CurrentBoot
	}
	l.evs = append(l.evs, e)
	return l
}

func grant(l *log, name string, rv int64, node string, kind lease.Kind, img, boot string, phase lease.Phase) {
	l.add(Event{Kind: LeaseVersion, Lease: name, RV: rv, Holder: node, Node: node, Slot: kind, Image: img, BootID: boot, Phase: phase})
}

// cleanRun is one node going from imgA to imgB under grants.
func cleanRun() *log {
	l := &log{}
	grant(l, "p-stage-0", 1, "n1", lease.KindStage, imgB, boot1, "")
	l.add(Event{Kind: StageStart, Node: "n1", Image: imgB, BootID: boot1, GrantLease: "p-stage-0", GrantRV: 1})
	l.add(Event{Kind: StageEnd, Node: "n1"})
	grant(l, "p-stage-0", 2, "", lease.KindStage, "", "", "")
	grant(l, "p-reboot-0", 3, "n1", lease.KindReboot, imgB, boot1, lease.PhaseDraining)
	l.add(Event{Kind: Cordon, Node: "n1"})
	grant(l, "p-reboot-0", 4, "n1", lease.KindReboot, imgB, boot1, lease.PhaseReboot)
	l.add(Event{Kind: Apply, Node: "n1", Image: imgB, BootID: boot1, GrantLease: "p-reboot-0", GrantRV: 4})
	l.add(Event{Kind: Reboot, Node: "n1", Image: imgB, BootID: boot1, GrantLease: "p-reboot-0", GrantRV: 4})
	l.add(Event{Kind: Boot, Node: "n1", BootID: boot2})
	grant(l, "p-reboot-0", 5, "", lease.KindReboot, "", "", "")
	l.add(Event{Kind: Uncordon, Node: "n1"})
	return l
}

// softGrant logs a grant issued at a soft-reboot count.
func softGrant(l *log, name string, rv int64, node string, kind lease.Kind, img, boot string, soft uint32, phase lease.Phase) {
	l.add(Event{Kind: LeaseVersion, Lease: name, RV: rv, Holder: node, Node: node, Slot: kind, Image: img, BootID: boot, SoftRebootCount: soft, Phase: phase})
}

// softRun is one node going from imgA to imgB by a soft reboot: the boot ID
// stays boot1, the soft-reboot count goes 0 -> 1.
func softRun() *log {
	l := &log{}
	softGrant(l, "p-stage-0", 1, "n1", lease.KindStage, imgB, boot1, 0, "")
	l.add(Event{Kind: StageStart, Node: "n1", Image: imgB, BootID: boot1, CurrentBoot: boot1 + "/0", GrantLease: "p-stage-0", GrantRV: 1})
	l.add(Event{Kind: StageEnd, Node: "n1"})
	grant(l, "p-stage-0", 2, "", lease.KindStage, "", "", "")
	softGrant(l, "p-reboot-0", 3, "n1", lease.KindReboot, imgB, boot1, 0, lease.PhaseDraining)
	l.add(Event{Kind: Cordon, Node: "n1"})
	softGrant(l, "p-reboot-0", 4, "n1", lease.KindReboot, imgB, boot1, 0, lease.PhaseReboot)
	l.add(Event{Kind: Apply, Node: "n1", Image: imgB, BootID: boot1, CurrentBoot: boot1 + "/0", GrantLease: "p-reboot-0", GrantRV: 4})
	l.add(Event{Kind: Reboot, Node: "n1", Image: imgB, BootID: boot1, CurrentBoot: boot1 + "/0", GrantLease: "p-reboot-0", GrantRV: 4, Soft: true})
	l.add(Event{Kind: Boot, Node: "n1", BootID: boot1, SoftRebootCount: 1, Soft: true})
	grant(l, "p-reboot-0", 5, "", lease.KindReboot, "", "", "")
	l.add(Event{Kind: Uncordon, Node: "n1"})
	return l
}

func finalOK() Final {
	return Final{Target: map[string]string{"p": imgB}, Halted: map[string]bool{},
		Nodes: map[string]FinalNode{"n1": {Pool: "p", Booted: imgB, Phase: "Idle", Healthy: true}}}
}

func TestCleanRunHasNoViolations(t *testing.T) {
	if v := Check(cleanRun().evs, pools, finalOK()); len(v) != 0 {
		t.Fatalf("violations on a clean run: %v", v)
	}
	if v := Check(softRun().evs, pools, finalOK()); len(v) != 0 {
		t.Fatalf("violations on a clean soft-reboot run: %v", v)
	}
	// A second rollout by soft reboot in the same boot ID: a new grant,
	// issued at count 1, spent at count 1.
	l := softRun()
	softGrant(l, "p-reboot-0", 6, "n1", lease.KindReboot, imgA, boot1, 1, lease.PhaseDraining)
	l.add(Event{Kind: Cordon, Node: "n1"})
	softGrant(l, "p-reboot-0", 7, "n1", lease.KindReboot, imgA, boot1, 1, lease.PhaseReboot)
	l.add(Event{Kind: Reboot, Node: "n1", Image: imgA, BootID: boot1, SoftRebootCount: 1, CurrentBoot: boot1 + "/1", GrantLease: "p-reboot-0", GrantRV: 7, Soft: true})
	l.add(Event{Kind: Uncordon, Node: "n1"})
	final := finalOK()
	final.Target["p"] = imgA
	final.Nodes["n1"] = FinalNode{Pool: "p", Booted: imgA, Phase: "Idle", Healthy: true}
	if v := Check(l.evs, pools, final); len(v) != 0 {
		t.Fatalf("violations on two soft-reboot rollouts: %v", v)
	}
}

// TestTheOldOperatorBug replays the failure bootc-fleet exists to prevent:
// after a reboot the node reads stale status, stages the same image again
// and reboots a second time on its own.
func TestTheOldOperatorBug(t *testing.T) {
	l := cleanRun()
	l.add(Event{Kind: StageStart, Node: "n1", Image: imgB, BootID: boot2, ContentBoot: boot1})
	l.add(Event{Kind: StageEnd, Node: "n1"})
	l.add(Event{Kind: Reboot, Node: "n1", Image: imgB, BootID: boot2, ContentBoot: boot1, GrantLease: "p-reboot-0", GrantRV: 4})
	got := Check(l.evs, pools, finalOK())
	want := map[string]bool{"I1": false, "I2": false, "I3": false, "I5": false}
	for _, v := range got {
		want[v.Invariant] = true
		if v.Node != "n1" || len(v.Events) == 0 || !strings.Contains(v.String(), "n1") {
			t.Errorf("violation without node or evidence: %v", v)
		}
	}
	for inv, seen := range want {
		if !seen {
			t.Errorf("%s not reported; got %v", inv, got)
		}
	}
}

// TestACordonDeliveredLateIsOrderedByItsVersion: the Node watch may deliver
// the coordinator's cordon after the agent's reboot was logged (the agent
// acted on the advance, written after the cordon); the cordon's
// resourceVersion, below the grant version the agent confirmed, says it
// came first.
func TestACordonDeliveredLateIsOrderedByItsVersion(t *testing.T) {
	l := &log{}
	grant(l, "p-stage-0", 1, "n1", lease.KindStage, imgB, boot1, "")
	l.add(Event{Kind: StageStart, Node: "n1", Image: imgB, BootID: boot1, GrantLease: "p-stage-0", GrantRV: 1})
	l.add(Event{Kind: StageEnd, Node: "n1"})
	grant(l, "p-reboot-0", 3, "n1", lease.KindReboot, imgB, boot1, lease.PhaseDraining)
	grant(l, "p-reboot-0", 5, "n1", lease.KindReboot, imgB, boot1, lease.PhaseReboot)
	l.add(Event{Kind: Apply, Node: "n1", Image: imgB, BootID: boot1, GrantLease: "p-reboot-0", GrantRV: 5})
	l.add(Event{Kind: Reboot, Node: "n1", Image: imgB, BootID: boot1, GrantLease: "p-reboot-0", GrantRV: 5})
	l.add(Event{Kind: Cordon, Node: "n1", RV: 4})
	l.add(Event{Kind: Boot, Node: "n1", BootID: boot2})
	grant(l, "p-reboot-0", 7, "", lease.KindReboot, "", "", "")
	l.add(Event{Kind: Uncordon, Node: "n1", RV: 6})
	if v := Check(l.evs, pools, finalOK()); len(v) != 0 {
		t.Fatalf("violations on a run whose cordon came late through the watch: %v", v)
	}
}

func TestViolations(t *testing.T) {
	cases := []struct {
		name  string
		build func() *log
		final func() Final
		want  string // invariant and a word of the message
	}{
		{"stage without grant", func() *log {
			l := &log{}
			l.add(Event{Kind: StageStart, Node: "n1", Image: imgB, BootID: boot1})
			return l
		}, finalOK, "I1 no grant named"},
		{"stage under another node's grant", func() *log {
			l := &log{}
			grant(l, "p-stage-0", 1, "n2", lease.KindStage, imgB, boot1, "")
			l.add(Event{Kind: StageStart, Node: "n1", Image: imgB, BootID: boot1, GrantLease: "p-stage-0", GrantRV: 1})
			return l
		}, finalOK, `I1 grant held by "n2"`},
		{"stage of another image", func() *log {
			l := &log{}
			grant(l, "p-stage-0", 1, "n1", lease.KindStage, imgA, boot1, "")
			l.add(Event{Kind: StageStart, Node: "n1", Image: imgB, BootID: boot1, GrantLease: "p-stage-0", GrantRV: 1})
			return l
		}, finalOK, "I1 grant for image"},
		{"reboot under a grant of another boot", func() *log {
			l := &log{}
			grant(l, "p-reboot-0", 1, "n1", lease.KindReboot, imgB, boot1, lease.PhaseReboot)
			l.add(Event{Kind: Cordon, Node: "n1"})
			l.add(Event{Kind: Reboot, Node: "n1", Image: imgB, BootID: boot2, GrantLease: "p-reboot-0", GrantRV: 1})
			return l
		}, finalOK, "I1 grant issued in boot"},
		{"reboot while draining", func() *log {
			l := &log{}
			grant(l, "p-reboot-0", 1, "n1", lease.KindReboot, imgB, boot1, lease.PhaseDraining)
			l.add(Event{Kind: Cordon, Node: "n1"})
			l.add(Event{Kind: Reboot, Node: "n1", Image: imgB, BootID: boot1, GrantLease: "p-reboot-0", GrantRV: 1})
			return l
		}, finalOK, `I1 reboot grant in phase "Draining"`},
		{"stage slot used to reboot", func() *log {
			l := &log{}
			grant(l, "p-stage-0", 1, "n1", lease.KindStage, imgB, boot1, "")
			l.add(Event{Kind: Cordon, Node: "n1"})
			l.add(Event{Kind: Reboot, Node: "n1", Image: imgB, BootID: boot1, GrantLease: "p-stage-0", GrantRV: 1})
			return l
		}, finalOK, "I1 stage slot used"},
		{"two nodes cordoned with maxUnavailable 1", func() *log {
			l := &log{}
			l.add(Event{Kind: Cordon, Node: "n1"})
			l.add(Event{Kind: Cordon, Node: "n2"})
			return l
		}, finalOK, "I2 2 nodes of pool p cordoned"},
		{"two nodes staging with maxStaging 1", func() *log {
			l := &log{}
			l.add(Event{Kind: StageStart, Node: "n1", Image: imgB, BootID: boot1})
			l.add(Event{Kind: StageStart, Node: "n2", Image: imgB, BootID: boot1})
			return l
		}, finalOK, "I2 2 nodes of pool p staging"},
		{"reboot of an uncordoned node", func() *log {
			l := &log{}
			grant(l, "p-reboot-0", 1, "n1", lease.KindReboot, imgB, boot1, lease.PhaseReboot)
			l.add(Event{Kind: Reboot, Node: "n1", Image: imgB, BootID: boot1, GrantLease: "p-reboot-0", GrantRV: 1})
			return l
		}, finalOK, "I2 agent rebooted a node that was not cordoned"},
		{"reboot before its cordon was written", func() *log {
			l := &log{}
			grant(l, "p-reboot-0", 1, "n1", lease.KindReboot, imgB, boot1, lease.PhaseReboot)
			l.add(Event{Kind: Reboot, Node: "n1", Image: imgB, BootID: boot1, GrantLease: "p-reboot-0", GrantRV: 1})
			l.add(Event{Kind: Cordon, Node: "n1", RV: 2})
			return l
		}, finalOK, "I2 agent rebooted a node that was not cordoned"},
		{"reboot after an uncordon newer than its grant", func() *log {
			l := &log{}
			grant(l, "p-reboot-0", 1, "n1", lease.KindReboot, imgB, boot1, lease.PhaseDraining)
			l.add(Event{Kind: Cordon, Node: "n1", RV: 2})
			grant(l, "p-reboot-0", 3, "n1", lease.KindReboot, imgB, boot1, lease.PhaseReboot)
			l.add(Event{Kind: Uncordon, Node: "n1", RV: 4})
			l.add(Event{Kind: Reboot, Node: "n1", Image: imgB, BootID: boot1, GrantLease: "p-reboot-0", GrantRV: 3})
			return l
		}, finalOK, "I2 agent rebooted a node that was not cordoned"},
		// Soft reboots are reboots to every invariant.
		{"soft reboot under the grant of the boot before a soft reboot", func() *log {
			l := &log{}
			softGrant(l, "p-reboot-0", 1, "n1", lease.KindReboot, imgB, boot1, 0, lease.PhaseReboot)
			l.add(Event{Kind: Cordon, Node: "n1"})
			l.add(Event{Kind: Reboot, Node: "n1", Image: imgB, BootID: boot1, SoftRebootCount: 1, GrantLease: "p-reboot-0", GrantRV: 1, Soft: true})
			return l
		}, finalOK, "I1 grant issued in boot boot-1/0, node in boot boot-1/1"},
		{"soft reboot without a grant", func() *log {
			l := &log{}
			l.add(Event{Kind: Cordon, Node: "n1"})
			l.add(Event{Kind: Reboot, Node: "n1", Image: imgB, BootID: boot1, Soft: true})
			return l
		}, finalOK, "I1 no grant named"},
		{"soft reboot of an uncordoned node", func() *log {
			l := &log{}
			grant(l, "p-reboot-0", 1, "n1", lease.KindReboot, imgB, boot1, lease.PhaseReboot)
			l.add(Event{Kind: Reboot, Node: "n1", Image: imgB, BootID: boot1, GrantLease: "p-reboot-0", GrantRV: 1, Soft: true})
			return l
		}, finalOK, "I2 agent rebooted a node that was not cordoned"},
		{"one grant spent on two soft reboots", func() *log {
			l := softRun()
			l.add(Event{Kind: Reboot, Node: "n1", Image: imgB, BootID: boot1, CurrentBoot: boot1 + "/0", GrantLease: "p-reboot-0", GrantRV: 4, Soft: true})
			return l
		}, finalOK, "I3 one grant spent on two reboots"},
		{"a soft and a full reboot for one grant", func() *log {
			l := softRun()
			l.add(Event{Kind: Cordon, Node: "n1"})
			l.add(Event{Kind: Reboot, Node: "n1", Image: imgB, BootID: boot1, SoftRebootCount: 1, CurrentBoot: boot1 + "/1", GrantLease: "p-reboot-0", GrantRV: 4})
			return l
		}, finalOK, "I3 2 reboots, 1 reboot grants"},
		{"soft reboot on a status read before the last soft reboot", func() *log {
			l := &log{}
			softGrant(l, "p-reboot-0", 1, "n1", lease.KindReboot, imgB, boot1, 1, lease.PhaseReboot)
			l.add(Event{Kind: Cordon, Node: "n1"})
			l.add(Event{Kind: Reboot, Node: "n1", Image: imgB, BootID: boot1, SoftRebootCount: 1, CurrentBoot: boot1 + "/1", ContentBoot: boot1 + "/0",
				GrantLease: "p-reboot-0", GrantRV: 1, Soft: true})
			return l
		}, finalOK, "I5 Reboot based on status from boot boot-1/0"},
		{"healthy node on the old image", cleanRun, func() Final {
			f := finalOK()
			f.Nodes["n1"] = FinalNode{Pool: "p", Booted: imgA, Healthy: true}
			return f
		}, "I4 healthy node ended booted"},
		{"failed node without halt", cleanRun, func() Final {
			f := finalOK()
			f.Nodes["n2"] = FinalNode{Pool: "p", Booted: imgA, Healthy: false}
			return f
		}, "I4 pool p has 1 failed nodes"},
		{"node that cannot stage gives no reason", cleanRun, func() Final {
			f := finalOK()
			f.Nodes["n2"] = FinalNode{Pool: "p", Booted: imgA, Phase: "Waiting", Healthy: false, CannotStage: true}
			return f
		}, "I4 node that cannot stage reports no reason"},
		{"action on stale status", func() *log {
			l := &log{}
			grant(l, "p-stage-0", 1, "n1", lease.KindStage, imgB, boot2, "")
			l.add(Event{Kind: StageStart, Node: "n1", Image: imgB, BootID: boot2, ContentBoot: boot1, GrantLease: "p-stage-0", GrantRV: 1})
			return l
		}, finalOK, "I5 StageStart based on status from boot boot-1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := Check(tc.build().evs, pools, tc.final())
			inv, word, _ := strings.Cut(tc.want, " ")
			for _, v := range got {
				if v.Invariant == inv && strings.Contains(v.String(), word) {
					return
				}
			}
			t.Fatalf("want %s, got %v", tc.want, got)
		})
	}
}

func TestNodeThatCannotStageIsNoRebootFailure(t *testing.T) {
	f := finalOK()
	f.Nodes["n2"] = FinalNode{Pool: "p", Booted: imgA, Phase: "Waiting", Reason: "StageFailed", Healthy: false, CannotStage: true}
	if v := Check(cleanRun().evs, pools, f); len(v) != 0 {
		t.Fatalf("violations: %v", v)
	}
}

func TestHaltedPoolWithFailedNodeIsFine(t *testing.T) {
	f := finalOK()
	f.Nodes["n2"] = FinalNode{Pool: "p", Booted: imgA, Phase: "Degraded", Reason: "RebootTimeout", Healthy: false}
	f.Halted["p"] = true
	if v := Check(cleanRun().evs, pools, f); len(v) != 0 {
		t.Fatalf("violations: %v", v)
	}
}

// An unlocked staged deployment is gated like a stage: under a stage or
// reboot grant for that image in that boot, and nowhere else.
func TestUnlockedStagedDeploymentIsGated(t *testing.T) {
	tests := []struct {
		name    string
		e       Event
		violate bool
	}{
		{"under the stage grant", Event{Kind: Unlocked, Node: "n1", Image: imgB, BootID: boot1, GrantLease: "p-stage-0", GrantRV: 1}, false},
		{"under the reboot grant", Event{Kind: Unlocked, Node: "n1", Image: imgB, BootID: boot1, GrantLease: "p-reboot-0", GrantRV: 4}, false},
		{"of another image", Event{Kind: Unlocked, Node: "n1", Image: imgA, BootID: boot1, GrantLease: "p-stage-0", GrantRV: 1}, true},
		{"without a grant", Event{Kind: Unlocked, Node: "n1", Image: imgB, BootID: boot1}, true},
		{"in another boot", Event{Kind: Unlocked, Node: "n1", Image: imgB, BootID: boot2, GrantLease: "p-stage-0", GrantRV: 1}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := cleanRun()
			l.add(tc.e)
			var i1 bool
			for _, v := range Check(l.evs, pools, finalOK()) {
				i1 = i1 || v.Invariant == "I1"
			}
			if i1 != tc.violate {
				t.Fatalf("I1 violation = %v, want %v", i1, tc.violate)
			}
		})
	}
}

// A multi-arch index: the pool's target is the index, each node must end on
// its own platform's image.
func TestConvergenceJudgesEachNodeByItsPlatformImage(t *testing.T) {
	const index = "q.io/os@sha256:cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc"
	for _, c := range []struct {
		name   string
		booted string
		ok     bool
	}{
		{"its platform's image", imgB, true},
		{"the index digest (bootc never reports it)", index, false},
		{"another platform's image", imgA, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := Final{Target: map[string]string{"p": index}, Halted: map[string]bool{},
				Nodes: map[string]FinalNode{"n1": {Pool: "p", Booted: c.booted, Target: imgB, Phase: "Idle", Healthy: true}}}
			v := Check(cleanRun().evs, pools, f)
			if c.ok != (len(v) == 0) {
				t.Fatalf("booted %s with target %s: violations %v, want ok=%v", c.booted, imgB, v, c.ok)
			}
			for _, x := range v {
				if x.Invariant != "I4" || !strings.Contains(x.Message, "target "+imgB) {
					t.Fatalf("violation %v does not judge by the node's own target", x)
				}
			}
		})
	}
}

func TestShortCutsAtARuneBoundary(t *testing.T) {
	digest := "quay.io/os@sha256:" + strings.Repeat("ab", 32)
	for _, tc := range []struct{ in, want string }{
		{digest, "quay.io/os@sha256:abababababab…"},
		{"sha256:" + strings.Repeat("c", 12), "sha256:" + strings.Repeat("c", 12)},
		{"0f562c26-boot", "0f562c26-boot"},
		{"ééééééééé", "éééééé…"},
	} {
		got := short(tc.in)
		if got != tc.want || !utf8.ValidString(got) {
			t.Errorf("short(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// rollbackRun is one node going from imgA to imgB (bad), imgB quarantined,
// and the node rolled back to imgA under a rollback grant on the same slot.
func rollbackRun() *log {
	l := &log{}
	grant(l, "p-stage-0", 1, "n1", lease.KindStage, imgB, boot1, "")
	l.add(Event{Kind: StageStart, Node: "n1", Image: imgB, BootID: boot1, GrantLease: "p-stage-0", GrantRV: 1})
	l.add(Event{Kind: StageEnd, Node: "n1"})
	grant(l, "p-stage-0", 2, "", lease.KindStage, "", "", "")
	grant(l, "p-reboot-0", 3, "n1", lease.KindReboot, imgB, boot1, lease.PhaseDraining)
	l.add(Event{Kind: Cordon, Node: "n1"})
	grant(l, "p-reboot-0", 4, "n1", lease.KindReboot, imgB, boot1, lease.PhaseReboot)
	l.add(Event{Kind: Apply, Node: "n1", Image: imgB, BootID: boot1, GrantLease: "p-reboot-0", GrantRV: 4})
	l.add(Event{Kind: Reboot, Node: "n1", Image: imgB, BootID: boot1, GrantLease: "p-reboot-0", GrantRV: 4})
	l.add(Event{Kind: Boot, Node: "n1", BootID: boot2, Image: imgB})
	l.add(Event{Kind: Quarantine, RV: 5, Image: imgB, Detail: "q.io/os:v2"})
	rollbackGrant(l, 6, "n1", imgA, boot2, lease.PhaseDraining)
	rollbackGrant(l, 7, "n1", imgA, boot2, lease.PhaseReboot)
	l.add(Event{Kind: RollbackRun, Node: "n1", Image: imgA, BootID: boot2, GrantLease: "p-reboot-0", GrantRV: 7})
	l.add(Event{Kind: Reboot, Node: "n1", Image: imgA, BootID: boot2, GrantLease: "p-reboot-0", GrantRV: 7, Rollback: true})
	l.add(Event{Kind: Boot, Node: "n1", BootID: "boot-3", Image: imgA})
	grant(l, "p-reboot-0", 8, "", lease.KindReboot, "", "", "")
	l.add(Event{Kind: Uncordon, Node: "n1"})
	return l
}

func rollbackGrant(l *log, rv int64, node, img, boot string, phase lease.Phase) {
	l.add(Event{Kind: LeaseVersion, Lease: "p-reboot-0", RV: rv, Holder: node, Node: node, Slot: lease.KindReboot, Image: img, BootID: boot, Phase: phase, Rollback: true})
}

// finalRolledBack: the target was bad, so the node ends on the last good image.
func finalRolledBack() Final {
	return Final{Target: map[string]string{"p": imgA}, Halted: map[string]bool{},
		Nodes: map[string]FinalNode{"n1": {Pool: "p", Booted: imgA, Phase: "Idle", Healthy: true}}}
}

func TestRollbackRunHasNoViolations(t *testing.T) {
	if v := Check(rollbackRun().evs, pools, finalRolledBack()); len(v) != 0 {
		t.Fatalf("violations on a clean rollback: %v", v)
	}
	// A node whose reboot into the target was under way (phase Reboot)
	// when the target was quarantined finishes it: booting it is no
	// violation. Nor, once spec.image names another image, is a grant for
	// the same digest.
	l := rollbackRun()
	l.add(Event{Kind: LeaseVersion, Lease: "p-reboot-1", RV: 4, Holder: "n2", Node: "n2", Slot: lease.KindReboot, Image: imgB, BootID: boot1, Phase: lease.PhaseReboot})
	l.add(Event{Kind: Cordon, Node: "n2"})
	l.add(Event{Kind: Reboot, Node: "n2", Image: imgB, BootID: boot1, GrantLease: "p-reboot-1", GrantRV: 4})
	l.add(Event{Kind: Boot, Node: "n2", BootID: boot2, Image: imgB})
	l.add(Event{Kind: PoolImage, RV: 20, Detail: "q.io/os:v3"})
	grant(l, "p-stage-0", 21, "n1", lease.KindStage, imgB, "boot-3", "")
	pools2 := map[string]Pool{"p": {MaxUnavailable: 2, MaxStaging: 1, HaltAfter: 1}}
	if v := Check(l.evs, pools2, finalRolledBack()); len(v) != 0 {
		t.Fatalf("violations: %v", v)
	}
}

// TestRollbackViolations shows each rollback and quarantine check failing
// on a history that breaks it.
func TestRollbackViolations(t *testing.T) {
	// updateGranted: n1 holds an update grant for imgB in phase Reboot, cordoned.
	updateGranted := func() *log {
		l := &log{}
		grant(l, "p-reboot-0", 1, "n1", lease.KindReboot, imgB, boot1, lease.PhaseReboot)
		l.add(Event{Kind: Cordon, Node: "n1"})
		return l
	}
	// rollbackGranted: n1 holds a rollback grant to imgA in phase Reboot, cordoned.
	rollbackGranted := func() *log {
		l := &log{}
		rollbackGrant(l, 1, "n1", imgA, boot1, lease.PhaseReboot)
		l.add(Event{Kind: Cordon, Node: "n1"})
		return l
	}
	// quarantined: rollbackRun up to imgB's quarantine (pool version 5).
	quarantined := func() *log {
		l := rollbackRun()
		l.evs = l.evs[:11]
		if l.evs[10].Kind != Quarantine {
			panic(fmt.Sprintf("rollbackRun changed: %v", l.evs[10]))
		}
		return l
	}
	cases := []struct {
		name  string
		build func() *log
		want  string // invariant and a word of the message
	}{
		{"bootc rollback without a grant", func() *log {
			l := &log{}
			l.add(Event{Kind: RollbackRun, Node: "n1", Image: imgA, BootID: boot1})
			return l
		}, "I1 no grant named"},
		{"bootc rollback under an update grant", func() *log {
			l := updateGranted()
			l.add(Event{Kind: RollbackRun, Node: "n1", Image: imgB, BootID: boot1, GrantLease: "p-reboot-0", GrantRV: 1})
			return l
		}, "I1 bootc rollback under an update grant"},
		{"bootc rollback to another image than the grant's", func() *log {
			l := rollbackGranted()
			l.add(Event{Kind: RollbackRun, Node: "n1", Image: imgB, BootID: boot1, GrantLease: "p-reboot-0", GrantRV: 1})
			return l
		}, "I1 grant for image"},
		{"bootc rollback while the rollback grant is draining", func() *log {
			l := &log{}
			rollbackGrant(l, 1, "n1", imgA, boot1, lease.PhaseDraining)
			l.add(Event{Kind: RollbackRun, Node: "n1", Image: imgA, BootID: boot1, GrantLease: "p-reboot-0", GrantRV: 1})
			return l
		}, `I1 reboot grant in phase "Draining"`},
		{"reboot into the rollback deployment under an update grant", func() *log {
			l := updateGranted()
			l.add(Event{Kind: Reboot, Node: "n1", Image: imgB, BootID: boot1, GrantLease: "p-reboot-0", GrantRV: 1, Rollback: true})
			return l
		}, "I1 reboot into the rollback deployment under an update grant"},
		{"update reboot under a rollback grant", func() *log {
			l := rollbackGranted()
			l.add(Event{Kind: Reboot, Node: "n1", Image: imgA, BootID: boot1, GrantLease: "p-reboot-0", GrantRV: 1})
			return l
		}, "I1 update reboot under a rollback grant"},
		{"apply under a rollback grant", func() *log {
			l := rollbackGranted()
			l.add(Event{Kind: Apply, Node: "n1", Image: imgA, BootID: boot1, GrantLease: "p-reboot-0", GrantRV: 1})
			return l
		}, "I1 update applied under a rollback grant"},
		{"rollback reboot under the grant of the boot before", func() *log {
			l := rollbackRun()
			l.add(Event{Kind: Reboot, Node: "n1", Image: imgA, BootID: "boot-3", GrantLease: "p-reboot-0", GrantRV: 7, Rollback: true})
			return l
		}, "I1 grant issued in boot boot-2/0, node in boot boot-3/0"},
		{"one rollback grant spent on two reboots", func() *log {
			l := rollbackRun()
			l.evs = l.evs[:len(l.evs)-3] // before the new boot
			l.add(Event{Kind: Reboot, Node: "n1", Image: imgA, BootID: boot2, GrantLease: "p-reboot-0", GrantRV: 7, Rollback: true})
			return l
		}, "I3 one grant spent on two reboots"},
		{"rollback reboot of an uncordoned node", func() *log {
			l := &log{}
			rollbackGrant(l, 1, "n1", imgA, boot1, lease.PhaseReboot)
			l.add(Event{Kind: Reboot, Node: "n1", Image: imgA, BootID: boot1, GrantLease: "p-reboot-0", GrantRV: 1, Rollback: true})
			return l
		}, "I2 agent rebooted a node that was not cordoned"},
		{"rollback reboot beyond maxUnavailable", func() *log {
			l := rollbackGranted()
			l.add(Event{Kind: Cordon, Node: "n2"})
			l.add(Event{Kind: Reboot, Node: "n1", Image: imgA, BootID: boot1, GrantLease: "p-reboot-0", GrantRV: 1, Rollback: true})
			return l
		}, "I2 2 nodes of pool p cordoned"},
		{"stage grant for the quarantined digest", func() *log {
			l := quarantined()
			grant(l, "p-stage-0", 6, "n2", lease.KindStage, imgB, boot1, "")
			return l
		}, "I6 stage grant for quarantined"},
		{"reboot grant for the quarantined digest", func() *log {
			l := quarantined()
			grant(l, "p-reboot-1", 6, "n2", lease.KindReboot, imgB, boot1, lease.PhaseDraining)
			return l
		}, "I6 reboot grant for quarantined"},
		{"draining grant for the quarantined digest advanced", func() *log {
			l := rollbackRun()
			l.evs = l.evs[:10]
			grant(l, "p-reboot-1", 5, "n2", lease.KindReboot, imgB, boot1, lease.PhaseDraining)
			l.add(Event{Kind: Quarantine, RV: 6, Image: imgB, Detail: "q.io/os:v2"})
			grant(l, "p-reboot-1", 7, "n2", lease.KindReboot, imgB, boot1, lease.PhaseReboot)
			return l
		}, "I6 advanced to phase Reboot"},
		{"a node boots the quarantined digest", func() *log {
			l := quarantined()
			l.add(Event{Kind: Boot, Node: "n2", BootID: boot2, Image: imgB})
			return l
		}, "I6 booted quarantined"},
		{"a grant back to the same spec.image is still quarantined", func() *log {
			l := quarantined()
			l.add(Event{Kind: PoolImage, RV: 5, Detail: "q.io/os:v2"}) // the same image: no change
			grant(l, "p-stage-0", 6, "n2", lease.KindStage, imgB, boot1, "")
			return l
		}, "I6 stage grant for quarantined"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := Check(tc.build().evs, pools, finalRolledBack())
			inv, word, _ := strings.Cut(tc.want, " ")
			for _, v := range got {
				if v.Invariant == inv && strings.Contains(v.String(), word) {
					return
				}
			}
			t.Fatalf("want %s, got %v", tc.want, got)
		})
	}
}
