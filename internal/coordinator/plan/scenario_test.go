package plan

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
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

var update = flag.Bool("update", false, "rewrite the golden scenario logs under testdata/scenarios/")

// scenario is a rollout played pass by pass through Plan against the world
// of world_test.go (the controller's Lease writes, cordons, drains; agents
// that act under their grants). Its log, one block per pass, is a golden
// file: testdata/scenarios/<name>.txt.
type scenario struct {
	name, about string
	nodes       int
	// setup shapes the world before the first pass (the agents have
	// reported, on imgV0; the target is imgV1).
	setup func(w *world)
	// act plays the world between passes (default: idealWorld); pass is the
	// pass just planned, mem what act remembers between passes.
	act func(w *world, pass int, mem map[string]bool)
	// passes bounds the scenario; it ends earlier once a pass changes
	// nothing and the pool is UpToDate.
	passes int
}

func budget(w *world, maxUnavailable, maxStaging int) {
	w.pool.Spec.Rollout.MaxUnavailable = ptr.To(intstr.FromInt32(int32(maxUnavailable)))
	w.pool.Spec.Rollout.MaxStaging = ptr.To(intstr.FromInt32(int32(maxStaging)))
}

var scenarios = []scenario{
	{
		name:  "rollout",
		about: "6 nodes roll from v0 to v1 under maxUnavailable 2 and maxStaging 2; every agent, drain and reboot does what it may",
		nodes: 6, passes: 40,
		setup: func(w *world) { budget(w, 2, 2) },
	},
	{
		name: "failing-node",
		about: "3 nodes, maxUnavailable 1, rebootTimeout 2m, haltAfterFailures 1: node-00 reboots and does not come back Ready; " +
			"its slot is marked failed and the pool halts; at pass 20 it is repaired, comes back on v1, and the rollout goes on",
		nodes: 3, passes: 50,
		setup: func(w *world) {
			budget(w, 1, 3)
			w.pool.Spec.Rollout.RebootTimeout = &metav1.Duration{Duration: 2 * time.Minute}
		},
		act: func(w *world, pass int, _ map[string]bool) {
			n := w.nodes["node-00"]
			if s, ok := w.grantOf("node-00", lease.KindReboot); ok && s.Grant.Phase == lease.PhaseReboot && w.grantedInBoot("node-00", s.Grant) {
				w.reboot("node-00") // down, and stays down: NotReady, its agent silent
				n.Ready = false
			}
			if pass == 20 {
				n.Ready = true
			}
			if !n.Ready {
				// Its agent does not report; every other node's acts.
				saved := w.bns["node-00"]
				delete(w.bns, "node-00")
				w.idealWorld()
				w.bns["node-00"] = saved
				return
			}
			w.idealWorld()
		},
	},
	{
		name: "image-change",
		about: "6 nodes, maxUnavailable 2, maxStaging 2; after pass 4 the target changes from v1 to v2, with node-00 in phase Reboot, " +
			"node-01 Draining and node-02, node-03 staging v1: the stage grants and the Draining reboot grant are revoked, node-00's reboot " +
			"completes on v1, and every node ends on v2",
		nodes: 6, passes: 60,
		setup: func(w *world) { budget(w, 2, 2) },
		act: func(w *world, pass int, _ map[string]bool) {
			switch pass {
			case 3: // only node-00's drain finishes; nobody else acts
				d := w.drains["node-00"]
				d.State = DrainDone
				w.drains["node-00"] = d
			case 4: // the tag moves; nobody acts
				w.target = imgV2
			default:
				w.idealWorld()
			}
		},
	},
	{
		name: "malformed-slot",
		about: "3 nodes, maxUnavailable 1, maxStaging 1; someone wrote a holder into the free reboot slot without a grant, " +
			"and put a leftover image annotation on the free stage slot: both are reset to free, then the rollout runs",
		nodes: 3, passes: 40,
		setup: func(w *world) { budget(w, 1, 1) },
		act: func(w *world, pass int, _ map[string]bool) {
			if pass == 1 {
				w.leases["workers-reboot-0"].Spec.HolderIdentity = ptr.To("node-02")
				w.leases["workers-stage-0"].Annotations = map[string]string{lease.AnnotationImage: imgV1.String()}
				return
			}
			w.idealWorld()
		},
	},
	{
		name: "min-ready-blip",
		about: "2 nodes, maxUnavailable 1, minReadySeconds 30: node-00 comes back on v1 (Verifying), falls NotReady before 30s, " +
			"is back again, and only then is its slot released",
		nodes: 2, passes: 40,
		setup: func(w *world) {
			budget(w, 1, 2)
			w.pool.Spec.Rollout.MinReadySeconds = 30
		},
		act: func(w *world, _ int, mem map[string]bool) {
			n := w.nodes["node-00"]
			switch s, ok := w.grantOf("node-00", lease.KindReboot); {
			case ok && !s.BackSince.IsZero() && !mem["blipped"]:
				n.Ready, mem["blipped"] = false, true
			case mem["blipped"]:
				n.Ready = true
			}
			w.idealWorld()
		},
	},
}

// TestScenarios plays each scenario and compares its log with
// testdata/scenarios/<name>.txt; -update rewrites them. Every slot write is
// also checked against the transition table.
func TestScenarios(t *testing.T) {
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			got := sc.play(t)
			path := filepath.Join("testdata", "scenarios", sc.name+".txt")
			if *update {
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to write it)", err)
			}
			if got != string(want) {
				t.Fatalf("the log of scenario %s differs from %s (run with -update to rewrite it, and review the diff):\n%s", sc.name, path, firstDiff(string(want), got))
			}
		})
	}
}

func (sc scenario) play(t *testing.T) string {
	w := newWorld(sc.nodes, 1, 1)
	for _, name := range sortedKeys(w.nodes) {
		w.agentReports(name, imgV0, imageref.Pinned{}, fleetv1.PhaseWaiting)
	}
	if sc.setup != nil {
		sc.setup(w)
	}
	act := sc.act
	if act == nil {
		act = func(w *world, _ int, _ map[string]bool) { w.idealWorld() }
	}
	mem := map[string]bool{}
	var b strings.Builder
	fmt.Fprintf(&b, "# scenario %s: %s.\n", sc.name, sc.about)
	fmt.Fprintf(&b, "# Per pass: the input (target, slots, nodes: Ready, cordoned, booted/staged, agent phase, rollout state), the grants, the writes in order (slot changes with the phase change they make), the Events and the pool status.\n")
	for pass := 1; pass <= sc.passes; pass++ {
		in := w.input()
		before := leaseCopies(w)
		out := Plan(in)
		seen, _ := slotTransitions(w, before, out, in.Now)
		for _, e := range seen {
			if !e.Allowed() {
				t.Errorf("pass %d: transition %s is not in plan.Transitions", pass, e)
			}
		}
		writePass(&b, pass, w, in, out, seen)
		w.apply(out)
		if len(out.Changes) == 0 && len(out.StartDrains) == 0 && cond(out, fleetv1.PoolUpToDate).Status == metav1.ConditionTrue {
			fmt.Fprintf(&b, "\ndone: every node runs %s\n", imgLabel(w.target.String()))
			return b.String()
		}
		act(w, pass, mem)
		w.now = w.now.Add(10 * time.Second)
	}
	fmt.Fprintf(&b, "\nstopped after %d passes\n", sc.passes)
	return b.String()
}

func writePass(b *strings.Builder, pass int, w *world, in Input, out Output, seen []Transition) {
	fmt.Fprintf(b, "\npass %d at +%s, target %s\n", pass, in.Now.Sub(t0), imgLabel(in.Target.String()))
	var slots []string
	for _, s := range InputSlots(in) {
		desc := fmt.Sprintf("%s %s", strings.TrimPrefix(s.Name, poolName+"-"), s.Phase)
		if s.Holder != "" {
			desc += " " + s.Holder
		}
		slots = append(slots, desc)
	}
	fmt.Fprintf(b, "  slots: %s\n", orNone(strings.Join(slots, ", ")))
	for _, n := range in.Nodes {
		fmt.Fprintf(b, "  %s\n", nodeLine(w, n))
	}
	var grants, writes []string
	for i, c := range out.Changes {
		e := seen[i]
		if c.Op == OpGrant {
			grants = append(grants, fmt.Sprintf("%s to %s (%s)", c.Kind, c.Node, imgLabel(c.Image.String())))
		}
		w := fmt.Sprintf("%s %s --> %s: %s %s", strings.TrimPrefix(c.Slot, poolName+"-"), e.From, e.To, c.Op, c.Why)
		if c.Node != "" {
			w += " (" + c.Node + ")"
		}
		if c.Uncordon {
			w += ", uncordon"
		}
		writes = append(writes, w)
	}
	for _, r := range out.CreateSlots {
		writes = append(writes, "create "+strings.TrimPrefix(r.Name, poolName+"-"))
	}
	for _, name := range out.DeleteSlots {
		writes = append(writes, "delete "+strings.TrimPrefix(name, poolName+"-"))
	}
	for _, d := range out.StartDrains {
		writes = append(writes, "start drain "+d.Node)
	}
	for _, n := range out.StopDrains {
		writes = append(writes, "stop drain "+n)
	}
	for _, c := range append(append([]BootcNodeChange(nil), out.CreateBootcNodes...), out.UpdateBootcNodes...) {
		slots := make([]string, len(c.Slots))
		for i, s := range c.Slots {
			slots[i] = strings.TrimPrefix(s, poolName+"-")
		}
		writes = append(writes, fmt.Sprintf("bootcnode %s: desired %s, %s, slots [%s]", c.Name, imgLabel(c.Spec.DesiredImage), c.RolloutState, strings.Join(slots, " ")))
	}
	fmt.Fprintf(b, "  grants: %s\n", orNone(strings.Join(grants, "; ")))
	for i, wr := range writes {
		if i == 0 {
			fmt.Fprintf(b, "  writes:\n")
		}
		fmt.Fprintf(b, "    %s\n", wr)
	}
	var evs []string
	for _, e := range out.Events {
		ev := e.Reason
		if e.Node != "" {
			ev += " " + e.Node
		}
		evs = append(evs, ev)
	}
	if len(evs) > 0 {
		fmt.Fprintf(b, "  events: %s\n", strings.Join(evs, ", "))
	}
	st := out.Status
	fmt.Fprintf(b, "  status: %d nodes, %d updated, %d staging, %d staged, %d rebooting, %d degraded, %d waiting, %d failures;",
		st.Nodes, st.Updated, st.Staging, st.Staged, st.Rebooting, st.Degraded, st.Waiting, st.Failures)
	for _, typ := range []string{fleetv1.PoolProgressing, fleetv1.PoolUpToDate, fleetv1.PoolHalted, fleetv1.PoolDegraded} {
		if c := meta.FindStatusCondition(st.Conditions, typ); c != nil {
			fmt.Fprintf(b, " %s=%s %s", typ, c.Status, c.Reason)
		}
	}
	fmt.Fprintln(b)
	if c := st.Canary; c != nil {
		passed := "not yet"
		if c.PassedTime != nil {
			passed = "at +" + c.PassedTime.Sub(t0).String()
		}
		fmt.Fprintf(b, "  canary: target %s, nodes %s, passed %s\n", imgLabel(c.Target), orNone(strings.Join(c.Nodes, " ")), passed)
	}
	if c := meta.FindStatusCondition(st.Conditions, fleetv1.PoolProgressing); c != nil && c.Reason == fleetv1.ReasonCanaryWaiting {
		fmt.Fprintf(b, "  progressing: %s\n", c.Message)
	}
}

func nodeLine(w *world, n Node) string {
	line := n.Name
	if !n.Ready {
		line += " NotReady"
	}
	if n.Unschedulable {
		line += " cordoned"
	}
	if n.Zone != "" {
		line += " zone " + n.Zone
	}
	if n.Canary {
		line += " canary-labelled"
	}
	line += fmt.Sprintf(" boot %d", w.boots[n.Name])
	bn := w.bns[n.Name]
	if bn == nil {
		return line + ", no BootcNode"
	}
	st := bn.Status
	booted, staged := "-", "-"
	if st.Booted != nil {
		booted = imgLabel(st.Booted.Image)
	}
	if st.Staged != nil {
		staged = imgLabel(st.Staged.Image)
	}
	line += fmt.Sprintf(", booted %s, staged %s, agent %s", booted, staged, orUnknown(string(st.Phase)))
	if st.BootID != n.BootID {
		line += " (from an earlier boot)"
	}
	if r := bn.Annotations[fleetv1.AnnotationRolloutState]; r != "" {
		line += ", rollout " + r
	}
	return line
}

// imgLabel names the test images v0..v3.
func imgLabel(ref string) string {
	for i, img := range []imageref.Pinned{imgV0, imgV1, imgV2, imgV3} {
		if ref == img.String() {
			return fmt.Sprintf("v%d", i)
		}
	}
	if ref == "" {
		return "none"
	}
	return shortImage(ref)
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// firstDiff shows the first line where two logs differ, with context.
func firstDiff(want, got string) string {
	wl, gl := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < len(wl) || i < len(gl); i++ {
		var a, b string
		if i < len(wl) {
			a = wl[i]
		}
		if i < len(gl) {
			b = gl[i]
		}
		if a != b {
			return fmt.Sprintf("line %d:\n  want: %s\n  got:  %s", i+1, a, b)
		}
	}
	return ""
}
