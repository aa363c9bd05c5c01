package fleet

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/bootc-fleet/bootc-fleet/tests/envtest"
)

// TestRollbackInterrupted is scenario (d) of issue 27: a canary's rollback
// interrupted by a coordinator restart at each point from its gate failure
// to the release of its rollback grant, and by an agent crash between
// `bootc rollback` and the reboot. Each interruption runs in a pool of its
// own, all in one cluster (a restart meant for one pool hits every pool),
// all at once (not capped by -parallel: they mostly wait). Each is reported
// in a subtest of its own. Replay: go test ./tests/fleet -run
// TestRollbackInterrupted -v (every interruption).
func TestRollbackInterrupted(t *testing.T) {
	envtest.SkipIfUnavailable(t)
	f := Start(t, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	results := make([]Result, len(RollbackFaults))
	var wg sync.WaitGroup
	for i, fault := range RollbackFaults {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = InterruptedRollback(ctx, f, int64(i+1), fault)
		}()
	}
	wg.Wait()
	for i, fault := range RollbackFaults {
		t.Run(string(fault), func(t *testing.T) {
			r := results[i]
			if r.Failed() {
				t.Fatal(r)
			}
			t.Logf("ok in %s, reboots %v; %v", r.Duration.Round(time.Millisecond), r.Reboots, r.Notes)
		})
	}
}
