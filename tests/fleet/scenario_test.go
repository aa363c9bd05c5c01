package fleet

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bootc-fleet/bootc-fleet/tests/envtest"
)

var (
	seedsFlag = flag.String("seeds", "", "seeds to run: a count N (seeds 1..N) or a list 3,17,42 (default: $SEEDS or 50)")
	batchFlag = flag.Int("batch", 10, "pools run at once in one cluster")
)

// seeds returns the seeds of this run: -seeds, else $SEEDS, else 1..def.
func seeds(def int) []int64 {
	spec := *seedsFlag
	if spec == "" {
		spec = os.Getenv("SEEDS")
	}
	if spec == "" {
		spec = strconv.Itoa(def)
	}
	if !strings.Contains(spec, ",") {
		if n, err := strconv.Atoi(spec); err == nil {
			out := make([]int64, n)
			for i := range out {
				out[i] = int64(i + 1)
			}
			return out
		}
	}
	var out []int64
	for _, f := range strings.Split(spec, ",") {
		v, err := strconv.ParseInt(strings.TrimSpace(f), 10, 64)
		if err == nil {
			out = append(out, v)
		}
	}
	return out
}

// TestImageChangeMidRollout runs the seed scenario over many seeds, a batch
// of pools at a time in one cluster with one coordinator. Replay one seed
// with: go test ./tests/fleet -run TestImageChangeMidRollout -seeds 17
func TestImageChangeMidRollout(t *testing.T) {
	envtest.SkipIfUnavailable(t)
	all := seeds(50)
	f := Start(t, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	var failed []string
	start := time.Now()
	for i := 0; i < len(all); i += *batchFlag {
		batch := all[i:min(i+*batchFlag, len(all))]
		results := make([]Result, len(batch))
		var wg sync.WaitGroup
		for j, seed := range batch {
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[j] = ImageChangeMidRollout(ctx, f, seed)
			}()
		}
		wg.Wait()
		for _, r := range results {
			if r.Failed() {
				t.Errorf("%s\nreplay: go test ./tests/fleet -run TestImageChangeMidRollout -seeds %d", r, r.Seed)
				failed = append(failed, fmt.Sprint(r.Seed))
			} else {
				t.Logf("seed %d: ok in %s, reboots %v", r.Seed, r.Duration.Round(time.Millisecond), r.Reboots)
			}
		}
	}
	t.Logf("%d seeds, %d failed %v, in %s", len(all), len(failed), failed, time.Since(start).Round(time.Second))
}

func TestNodeThatNeverReturnsHaltsPool(t *testing.T) {
	envtest.SkipIfUnavailable(t)
	f := Start(t, Options{})
	if r := NodeNeverReturns(context.Background(), f, 1); r.Failed() {
		t.Fatal(r)
	} else {
		t.Logf("%s; reboots %v", r, r.Reboots)
	}
}

func TestCoordinatorRestartMidRollout(t *testing.T) {
	envtest.SkipIfUnavailable(t)
	f := Start(t, Options{})
	if r := CoordinatorRestart(context.Background(), f, 1); r.Failed() {
		t.Fatal(r)
	} else {
		t.Logf("%s; reboots %v", r, r.Reboots)
	}
}

// TestChaos runs the randomized fault campaign (make chaos SEEDS=500). In
// make test it runs a few seeds; each failing seed prints its fault plan.
// Replay: go test ./tests/fleet -run TestChaos -seeds 123 -v
func TestChaos(t *testing.T) {
	envtest.SkipIfUnavailable(t)
	all := seeds(4)
	if *seedsFlag == "" && os.Getenv("SEEDS") == "" && testing.Short() {
		all = all[:1]
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Minute)
	defer cancel()
	start := time.Now()
	var failed []string
	// Seeds share one coordinator, -batch of them at a time; seeds that
	// crash the coordinator run in TestChaosCoordinatorCrash.
	f := Start(t, Options{})
	// A pool of workers: a new seed starts as soon as one finishes.
	work := make(chan int64)
	type out struct {
		r      Result
		faults []Fault
	}
	results := make(chan out)
	var wg sync.WaitGroup
	for w := 0; w < *batchFlag; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seed := range work {
				r, faults := Chaos(ctx, f, seed, false)
				results <- out{r, faults}
			}
		}()
	}
	go func() {
		for _, seed := range all {
			work <- seed
		}
		close(work)
		wg.Wait()
		close(results)
	}()
	for o := range results {
		fmt.Printf("chaos seed %d: %d violations, %d problems (%s)\n", o.r.Seed, len(o.r.Violations), len(o.r.Problems), o.r.Duration.Round(time.Millisecond))
		if o.r.Failed() {
			t.Errorf("%s\n  faults:%s\nreplay: go test ./tests/fleet -run TestChaos -seeds %d -v", o.r, FaultString(o.faults), o.r.Seed)
			failed = append(failed, fmt.Sprint(o.r.Seed))
		}
	}
	t.Logf("chaos: %d seeds, %d failed %v, in %s", len(all), len(failed), failed, time.Since(start).Round(time.Second))
}

// TestChaosCoordinatorCrash runs chaos seeds that also crash and restart
// the coordinator, each with a fleet of its own.
func TestChaosCoordinatorCrash(t *testing.T) {
	envtest.SkipIfUnavailable(t)
	f := Start(t, Options{})
	r, faults := Chaos(context.Background(), f, 1001, true)
	if r.Failed() {
		t.Fatalf("%s\n  faults:%s", r, FaultString(faults))
	}
	t.Logf("%s faults:%s", r, FaultString(faults))
}
