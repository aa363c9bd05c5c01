package fleet

import (
	"context"
	"testing"
	"time"

	"github.com/bootc-fleet/bootc-fleet/tests/envtest"
)

// The bad-image scenarios (issue 27, (a)-(c)), each over a few seeds that
// run side by side in one fleet. A seed fixes the timings, the bootc
// generation and, in (a), whether the pool has zones. Replay one with e.g.
// go test ./tests/fleet -run TestBadImageCaughtByTheCanary -seeds 3 -v
func TestBadImageCaughtByTheCanary(t *testing.T) {
	runBadImage(t, BadImageCanary)
}

func TestBadImageStopsAfterTheFirstWave(t *testing.T) {
	runBadImage(t, BadImageFirstWave)
}

func TestBadImageInTheLastZoneRollsBackThatZone(t *testing.T) {
	runBadImage(t, BadImageLastZone)
}

func runBadImage(t *testing.T, scenario func(context.Context, *Fleet, int64) Result) {
	t.Helper()
	envtest.SkipIfUnavailable(t)
	all := seeds(t, 2)
	f := Start(t, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	for r := range runSeeds(all, *batchFlag, func(seed int64) (Result, []Fault) { return scenario(ctx, f, seed), nil }) {
		if r.Failed() {
			t.Errorf("%s\nreplay: go test ./tests/fleet -run %s -seeds %d -v", r, t.Name(), r.Seed)
		} else {
			t.Logf("seed %d: ok in %s, reboots %v", r.Seed, r.Duration.Round(time.Millisecond), r.Reboots)
		}
	}
}
