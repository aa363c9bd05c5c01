package controller

import (
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/plan"
)

// Grants wait for a BootcNode to ask for the target, so a wish that changes
// a node's spec is written before every wish that only explains, even ones
// queued earlier and ready; among equals the queue is first come, first
// served. (The workers are not started: the test takes the queue's order.)
func TestBootcNodeWriterWritesSpecChangesFirst(t *testing.T) {
	b := newBootcNodeWriter(nil, nil, logr.Discard())
	defer b.queue.ShutDown()
	for _, n := range []string{"notes-a", "notes-b", "notes-c"} {
		b.set("pool", plan.BootcNodeChange{Name: n}, true)
	}
	time.Sleep(annotationDelay + 100*time.Millisecond) // the notes are ready now
	for _, n := range []string{"spec-a", "spec-b"} {
		b.set("pool", plan.BootcNodeChange{Name: n}, false)
	}
	// A node with notes queued that then needs a spec change moves up.
	b.set("pool", plan.BootcNodeChange{Name: "notes-c"}, false)

	want := []string{"spec-a", "spec-b", "notes-c", "notes-a", "notes-b"}
	for i, w := range want {
		got, prio, shut := b.queue.GetWithPriority()
		if shut {
			t.Fatal("queue shut down")
		}
		b.queue.Done(got)
		if got != w {
			t.Fatalf("write %d: got %s (priority %d), want %s; order wanted %v", i, got, prio, w, want)
		}
	}
}
