package plan

import (
	"flag"
	"fmt"
	"os"
	"sort"
	"sync"
	"testing"
)

// made collects every slot transition the world of world_test.go carried
// out for any test of the package (world.apply reads each Lease back after
// each change).
var made = &madeTransitions{seen: map[Transition]int{}}

type madeTransitions struct {
	mu   sync.Mutex
	seen map[Transition]int
}

func (m *madeTransitions) record(t Transition) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.seen[t]++
}

// TestMain checks the transition table against what the package's tests
// made the planner do: every transition made is in plan.Transitions (on
// any run), and, when the whole package ran, every transition of the table
// was made by some test, so the table lists no edge the code does not make.
func TestMain(m *testing.M) {
	flag.Parse()
	code := m.Run()
	var bad []string
	made.mu.Lock()
	for t := range made.seen {
		if !t.Allowed() {
			bad = append(bad, "made, but not in plan.Transitions: "+t.String())
		}
	}
	if f := flag.Lookup("test.run"); code == 0 && f != nil && f.Value.String() == "" {
		for _, t := range Transitions {
			if made.seen[t] == 0 {
				bad = append(bad, "in plan.Transitions, but no test made it: "+t.String())
			}
		}
	}
	made.mu.Unlock()
	sort.Strings(bad)
	for _, b := range bad {
		fmt.Fprintln(os.Stderr, "slot transitions:", b)
	}
	if len(bad) > 0 && code == 0 {
		code = 1
	}
	os.Exit(code)
}
