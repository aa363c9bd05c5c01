package decide

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// diagramEdge is one `From --> To: label` line of a mermaid stateDiagram.
var diagramEdge = regexp.MustCompile(`^\s*(\w+)\s*-->\s*(\w+)\s*(?::.*)?$`)

// TestAgentDiagramIsTransitions reads the Step's state diagram in
// docs/agent.md (the mermaid block marked `%% decide.Transitions`) and
// fails when it has an edge Step does not make, or lacks one it makes.
func TestAgentDiagramIsTransitions(t *testing.T) {
	doc, err := os.ReadFile("../../../docs/agent.md")
	if err != nil {
		t.Fatal(err)
	}
	drawn := map[[2]Phase]bool{}
	in := false
	for _, line := range strings.Split(string(doc), "\n") {
		switch {
		case strings.Contains(line, "%% decide.Transitions"):
			in = true
		case in && strings.HasPrefix(strings.TrimSpace(line), "```"):
			in = false
		case in:
			if m := diagramEdge.FindStringSubmatch(line); m != nil && m[1] != "[*]" {
				drawn[[2]Phase{Phase(m[1]), Phase(m[2])}] = true
			}
		}
	}
	if len(drawn) == 0 {
		t.Fatal("docs/agent.md has no mermaid block marked %% decide.Transitions")
	}
	made := map[[2]Phase]bool{}
	for _, tr := range Transitions {
		made[[2]Phase{tr.From, tr.To}] = true
		if !drawn[[2]Phase{tr.From, tr.To}] {
			t.Errorf("docs/agent.md lacks %s --> %s: %s", tr.From, tr.To, tr.By)
		}
	}
	for e := range drawn {
		if !made[e] {
			t.Errorf("docs/agent.md draws %s --> %s, which Step does not make (decide.Transitions)", e[0], e[1])
		}
	}
}
