package controller

import (
	"testing"

	"github.com/go-logr/logr"
)

func wakeUps(s *undecodables) []string {
	var out []string
	for {
		select {
		case ev := <-s.events:
			out = append(out, ev.Object.Name)
		default:
			return out
		}
	}
}

// The set wakes a pool only when what it says changes: a new resourceVersion
// alone (the coordinator's own condition write on an undecodable pool, or
// a node rewriting the same bad value) neither wakes it nor repeats an Event.
func TestUndecodablesWakeAndReportOnlyOnChange(t *testing.T) {
	s := newUndecodables(logr.Discard())
	bad := undecodable{kind: kindBootcNode, name: "n1", rv: "1", pool: "p", err: "cannot parse"}
	s.set(bad)
	if got := wakeUps(s); len(got) != 1 || got[0] != "p" {
		t.Fatalf("set: woke %v, want [p]", got)
	}
	if !s.unreported(bad) {
		t.Fatal("a new object is not reported")
	}
	again := bad
	again.rv = "2"
	s.set(again)
	if got := wakeUps(s); len(got) != 0 {
		t.Fatalf("a new resourceVersion alone woke %v", got)
	}
	if s.unreported(again) {
		t.Fatal("a new resourceVersion alone is reported again")
	}
	worse := again
	worse.err = "another error"
	s.set(worse)
	if got := wakeUps(s); len(got) != 1 || !s.unreported(worse) {
		t.Fatalf("a new error: woke %v, want the pool woken and reported", got)
	}
	if us := s.ofPool("p"); len(us) != 1 || us[0].name != "n1" {
		t.Fatalf("ofPool(p) = %v", us)
	}
	if us := s.ofPool("q"); len(us) != 0 {
		t.Fatalf("ofPool(q) = %v", us)
	}
	s.clear(kindBootcNode, "n1")
	if got := wakeUps(s); len(got) != 1 || len(s.ofPool("p")) != 0 {
		t.Fatalf("clear: woke %v, left %v", got, s.ofPool("p"))
	}
	s.clear(kindBootcNode, "n1")
	if got := wakeUps(s); len(got) != 0 {
		t.Fatalf("clearing what is not set aside woke %v", got)
	}
	s.set(undecodable{kind: kindPool, name: "gone", pool: "gone", err: "x"})
	s.set(undecodable{kind: kindPool, name: "kept", pool: "kept", err: "x"})
	wakeUps(s)
	s.keepOnly(kindPool, map[string]bool{"kept": true})
	if _, ok := s.get(kindPool, "gone"); ok {
		t.Fatal("keepOnly kept a pool no longer listed")
	}
	if _, ok := s.get(kindPool, "kept"); !ok {
		t.Fatal("keepOnly dropped a listed pool")
	}
}

// A full buffer drops a wake-up instead of blocking the watch that found
// the object.
func TestUndecodablesNeverBlock(t *testing.T) {
	s := newUndecodables(logr.Discard())
	for i := range 3 * cap(s.events) {
		s.set(undecodable{kind: kindBootcNode, name: string(rune('a' + i%26)), pool: "p", err: string(rune('a' + i))})
	}
	if n := len(wakeUps(s)); n != cap(s.events) {
		t.Fatalf("%d wake-ups queued, want the buffer's %d", n, cap(s.events))
	}
}
