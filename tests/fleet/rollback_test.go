package fleet

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/bootc-fleet/bootc-fleet/tests/envtest"
)

// badImageScenarios are the bad-image scenarios (issue 27, (a)-(c)) by name.
var badImageScenarios = []struct {
	name string
	run  func(context.Context, *Fleet, int64) Result
}{
	{"CaughtByTheCanary", BadImageCanary},
	{"StopsAfterTheFirstWave", BadImageFirstWave},
	{"InTheLastZoneRollsBackThatZone", BadImageLastZone},
}

// TestBadImage runs the bad-image scenarios over a few seeds, every
// scenario and seed side by side in one fleet (their pools and nodes are
// named apart): most of a scenario is waiting for reboots and the gate's
// timeout, so running them at once costs little more than the longest. A
// seed fixes the timings, the bootc generation and, in (a), whether the pool
// has zones. Replay: go test ./tests/fleet -run TestBadImage -seeds 3 -v
// (every scenario, that seed).
func TestBadImage(t *testing.T) {
	envtest.SkipIfUnavailable(t)
	all := seeds(t, 2)
	f := Start(t, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	results := make([][]Result, len(badImageScenarios))
	var wg sync.WaitGroup
	for i, sc := range badImageScenarios {
		results[i] = make([]Result, len(all))
		for j, seed := range all {
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[i][j] = sc.run(ctx, f, seed)
			}()
		}
	}
	wg.Wait()
	for i, sc := range badImageScenarios {
		t.Run(sc.name, func(t *testing.T) {
			for _, r := range results[i] {
				if r.Failed() {
					t.Errorf("%s\nreplay: go test ./tests/fleet -run TestBadImage -seeds %d -v", r, r.Seed)
				} else {
					t.Logf("seed %d: ok in %s, reboots %v", r.Seed, r.Duration.Round(time.Millisecond), r.Reboots)
				}
			}
		})
	}
}
