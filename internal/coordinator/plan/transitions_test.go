package plan

import (
	"bufio"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
)

// diagramEdges reads the slot lifecycle's mermaid stateDiagram in
// docs/coordinator.md: one Transition per cause of each edge ("From --> To:
// Op Why / Why"). Edges from or to [*] (a slot Lease created or deleted)
// are no phase change and are left out.
func diagramEdges(t *testing.T) []Transition {
	t.Helper()
	f, err := os.Open("../../../docs/coordinator.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	edge := regexp.MustCompile(`^\s*(\S+)\s+-->\s+(\S+)\s*:\s*(\S+)\s+(.+?)\s*$`)
	var out []Transition
	section, inDiagram, diagrams := false, false, 0
	for sc := bufio.NewScanner(f); sc.Scan(); {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "## "):
			section = line == "## Slot lifecycle"
		case section && strings.TrimSpace(line) == "stateDiagram-v2":
			inDiagram = true
			diagrams++
		case inDiagram && strings.HasPrefix(line, "```"):
			inDiagram = false
		case inDiagram && strings.TrimSpace(line) != "":
			m := edge.FindStringSubmatch(line)
			if m == nil {
				t.Fatalf("docs/coordinator.md: diagram line %q is not `From --> To: Op Why[ / Why...]`", line)
			}
			if m[1] == "[*]" || m[2] == "[*]" {
				continue
			}
			for _, why := range strings.Split(m[4], " / ") {
				out = append(out, Transition{From: SlotPhase(m[1]), Op: Op(m[3]), Why: strings.TrimSpace(why), To: SlotPhase(m[2])})
			}
		}
	}
	if diagrams != 1 {
		t.Fatalf("docs/coordinator.md: %d stateDiagram-v2 blocks under \"## Slot lifecycle\", want 1", diagrams)
	}
	return out
}

// TestSlotDiagramIsTheTransitionTable: the state diagram in
// docs/coordinator.md has an edge for every transition the planner makes
// (Transitions), and none it does not make.
func TestSlotDiagramIsTheTransitionTable(t *testing.T) {
	inDiagram := map[Transition]bool{}
	for _, e := range diagramEdges(t) {
		if inDiagram[e] {
			t.Errorf("docs/coordinator.md names the edge %s twice", e)
		}
		inDiagram[e] = true
		if !e.Allowed() {
			t.Errorf("docs/coordinator.md has the edge %s, which the planner does not make (plan.Transitions)", e)
		}
	}
	for _, e := range Transitions {
		if !inDiagram[e] {
			t.Errorf("the planner makes the transition %s, which the diagram in docs/coordinator.md lacks", e)
		}
	}
}

// TestTransitionTable: the table names phases and causes that exist, once
// each.
func TestTransitionTable(t *testing.T) {
	phases := map[SlotPhase]bool{}
	for _, ph := range SlotPhases {
		phases[ph] = true
	}
	seen := map[Transition]bool{}
	for _, e := range Transitions {
		if !phases[e.From] || !phases[e.To] || e.Op == "" || e.Why == "" || strings.ContainsAny(e.Why, " /") {
			t.Errorf("transition %s: unknown phase, or an empty or unprintable cause", e)
		}
		if seen[e] {
			t.Errorf("transition %s listed twice", e)
		}
		seen[e] = true
	}
}

func (t Transition) String() string {
	return fmt.Sprintf("%s --> %s: %s %s", t.From, t.To, t.Op, t.Why)
}

// slotTransitions applies out's slot changes, in order, to copies of
// leases (the Leases Plan read) as the controller does, and reads back each
// change's phase change (a stage grant's from its holder's report in w);
// after holds the phase each changed slot ends in.
func slotTransitions(w *world, leases map[string]*coordinationv1.Lease, out Output, now time.Time) (seen []Transition, after map[string]SlotPhase) {
	cur := map[string]*coordinationv1.Lease{}
	after = map[string]SlotPhase{}
	for _, c := range out.Changes {
		l := cur[c.Slot]
		if l == nil {
			if leases[c.Slot] == nil {
				continue
			}
			l = leases[c.Slot].DeepCopy()
			cur[c.Slot] = l
		}
		before, _ := w.slot(l)
		ApplyToLease(l, c, now, time.Minute)
		s, _ := w.slot(l)
		e := Transition{From: before.Phase, Op: c.Op, Why: c.Why, To: s.Phase}
		seen = append(seen, e)
		after[c.Slot] = e.To
	}
	return seen, after
}

// checkTransitions fails when a change of out is not in Transitions, or
// when a slot's phase changed across the pass (world before, w after)
// other than by its changes.
func checkTransitions(fatalf func(string, ...any), before map[string]*coordinationv1.Lease, out Output, now time.Time, w *world) {
	seen, after := slotTransitions(w, before, out, now)
	for _, e := range seen {
		if !e.Allowed() {
			fatalf("the planner made the transition %s, which is not in plan.Transitions", e)
		}
	}
	var names []string
	for name := range before {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		l := w.leases[name]
		if l == nil {
			continue // deleted: a free surplus slot, or by a person
		}
		was, _ := w.slot(before[name])
		now, _ := w.slot(l)
		want, changed := after[name]
		if !changed {
			want = was.Phase
		}
		if got := now.Phase; got != want {
			fatalf("slot %s went from %s to %s across the pass; its changes end in %s", name, was.Phase, got, want)
		}
	}
}

// leaseCopies snapshots the world's slot Leases.
func leaseCopies(w *world) map[string]*coordinationv1.Lease {
	out := map[string]*coordinationv1.Lease{}
	for name, l := range w.leases {
		out[name] = l.DeepCopy()
	}
	return out
}
