package agent

import (
	"context"
	"testing"
	"time"

	"github.com/bootc-fleet/bootc-fleet/tests/envtest"
)

// The view tells the loop when it has synced, even when it lists nothing:
// the loop waits for Changed before it looks at Synced again, so without a
// word at the sync the agent's first decision waited for a timer.
func TestViewPokesOnceSynced(t *testing.T) {
	e := envtest.Start(t)
	k, err := newKube(e.Config, "node-without-objects")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	k.Start(ctx)
	// Nothing is listed, so no handler runs: the only word can be the sync's.
	deadline := time.After(30 * time.Second) // a bound, not a measurement
	for woke := false; !woke || !k.Synced(); {
		select {
		case <-k.Changed():
			woke = true
		case <-deadline:
			t.Fatalf("no word from the view once both informers synced (synced now: %v)", k.Synced())
		}
	}
	if k.BootcNode() != nil {
		t.Fatalf("a BootcNode for a node that has none: %+v", k.BootcNode())
	}
}
