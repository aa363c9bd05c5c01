package fleet

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bootc-fleet/bootc-fleet/internal/agent"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/controller"
	"github.com/bootc-fleet/bootc-fleet/tests/envtest"
)

var (
	seedsFlag = flag.String("seeds", "", "seeds to run: a count N (seeds 1..N) or a list 3,17,42 (default: $SEEDS or 50)")
	batchFlag = flag.Int("batch", 10, "pools in flight at once in one cluster")
)

// seeds returns the seeds of this run: -seeds, else $SEEDS, else 1..def.
// A spec is a count N (seeds 1..N), or a comma list of seeds and ranges
// (3,17,40-59). A spec that is neither ends the test.
func seeds(t *testing.T, def int) []int64 {
	t.Helper()
	spec := *seedsFlag
	if spec == "" {
		spec = os.Getenv("SEEDS")
	}
	if spec == "" {
		spec = strconv.Itoa(def)
	}
	out, err := parseSeeds(spec)
	if err != nil {
		t.Fatalf("seeds %q: %v", spec, err)
	}
	return out
}

func parseSeeds(spec string) ([]int64, error) {
	if n, err := strconv.Atoi(spec); err == nil {
		if n < 1 {
			return nil, fmt.Errorf("a count must be at least 1")
		}
		out := make([]int64, n)
		for i := range out {
			out[i] = int64(i + 1)
		}
		return out, nil
	}
	var out []int64
	for _, f := range strings.Split(spec, ",") {
		f = strings.TrimSpace(f)
		lo, hi, isRange := strings.Cut(f, "-")
		a, errA := strconv.ParseInt(lo, 10, 64)
		b, errB := a, error(nil)
		if isRange {
			b, errB = strconv.ParseInt(hi, 10, 64)
		}
		if errA != nil || errB != nil || b < a {
			return nil, fmt.Errorf("%q is not a seed or a range A-B with A <= B", f)
		}
		for v := a; v <= b; v++ {
			out = append(out, v)
		}
	}
	return out, nil
}

// TestImageChangeMidRollout runs the seed scenario over many seeds, a batch
// of pools at a time in one cluster with one coordinator. Replay one seed
// with: go test ./tests/fleet -run TestImageChangeMidRollout -seeds 17
func TestImageChangeMidRollout(t *testing.T) {
	envtest.SkipIfUnavailable(t)
	all := seeds(t, 50)
	f := Start(t, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	var failed []string
	start := time.Now()
	for r := range runSeeds(all, *batchFlag, func(seed int64) (Result, []Fault) { return ImageChangeMidRollout(ctx, f, seed), nil }) {
		if r.Failed() {
			t.Errorf("%s\nreplay: go test ./tests/fleet -run TestImageChangeMidRollout -seeds %d", r, r.Seed)
			failed = append(failed, fmt.Sprint(r.Seed))
		} else {
			t.Logf("seed %d: ok in %s, reboots %v", r.Seed, r.Duration.Round(time.Millisecond), r.Reboots)
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
	all := seeds(t, 4)
	if *seedsFlag == "" && os.Getenv("SEEDS") == "" && testing.Short() {
		all = all[:1]
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Minute)
	defer cancel()
	start := time.Now()
	var failed []string
	// Seeds share one cluster and coordinator, -batch of them at a time.
	// One seed in five also crashes the coordinator or cuts the API
	// server, which every pool in flight then lives through.
	f := Start(t, Options{})
	faultsOf := map[int64][]Fault{}
	var mu sync.Mutex
	results := runSeeds(all, *batchFlag, func(seed int64) (Result, []Fault) {
		r, faults := Chaos(ctx, f, seed, SomeClusterFaults)
		mu.Lock()
		faultsOf[seed] = faults
		mu.Unlock()
		return r, faults
	})
	tally := map[FaultKind]int{}
	var slowestFirst time.Duration
	for r := range results {
		slowestFirst = max(slowestFirst, r.FirstReconcile)
		mu.Lock()
		faults := faultsOf[r.Seed]
		mu.Unlock()
		fmt.Printf("chaos seed %d: %d violations, %d problems (%s, %d faults)\n", r.Seed, len(r.Violations), len(r.Problems), r.Duration.Round(time.Millisecond), len(faults))
		for _, n := range r.Notes {
			fmt.Printf("chaos seed %d: %s\n", r.Seed, n)
		}
		for _, f := range faults {
			tally[f.Kind]++
		}
		if r.Failed() {
			t.Errorf("%s\n  faults:%s\nreplay: go test ./tests/fleet -run TestChaos -seeds %d -v", r, FaultString(faults), r.Seed)
			failed = append(failed, fmt.Sprint(r.Seed))
		}
	}
	kinds := make([]string, 0, len(tally))
	for k, n := range tally {
		kinds = append(kinds, fmt.Sprintf("%s %d", k, n))
	}
	sort.Strings(kinds)
	fmt.Printf("chaos: %d seeds, %d failed %v, in %s; longest wait of a new pool for its first reconcile %s\nchaos: faults injected: %s\n",
		len(all), len(failed), failed, time.Since(start).Round(time.Second), slowestFirst.Round(time.Millisecond), strings.Join(kinds, ", "))
}

// TestChaosClusterFaults runs chaos seeds that may also crash the
// coordinator and cut the API server, each seed with a fleet of its own.
func TestChaosClusterFaults(t *testing.T) {
	envtest.SkipIfUnavailable(t)
	for _, seed := range []int64{1001, 1002} {
		f := Start(t, Options{})
		r, faults := Chaos(context.Background(), f, seed, ClusterFaultsOn)
		if r.Failed() {
			t.Errorf("%s\n  faults:%s\nreplay: go test ./tests/fleet -run TestChaosClusterFaults -v", r, FaultString(faults))
		} else {
			t.Logf("%s faults:%s", r, FaultString(faults))
		}
		for _, n := range r.Notes {
			t.Log(n)
		}
		f.Stop()
	}
}

func TestClockSkewedNodes(t *testing.T) {
	envtest.SkipIfUnavailable(t)
	f := Start(t, Options{})
	if r := ClockSkew(context.Background(), f, 1); r.Failed() {
		t.Fatal(r)
	} else {
		t.Logf("%s; reboots %v", r, r.Reboots)
	}
}

func TestAPIServerOutageMidRollout(t *testing.T) {
	envtest.SkipIfUnavailable(t)
	f := Start(t, Options{})
	if r := APIServerOutage(context.Background(), f, 1); r.Failed() {
		t.Fatal(r)
	} else {
		t.Logf("%s; reboots %v", r, r.Reboots)
	}
}

// runSeeds runs fn for every seed with a pool of workers (a new seed starts
// as soon as one finishes) and delivers the results as they come.
func runSeeds(all []int64, workers int, fn func(seed int64) (Result, []Fault)) <-chan Result {
	work := make(chan int64)
	results := make(chan Result)
	var wg sync.WaitGroup
	for w := 0; w < max(workers, 1); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seed := range work {
				r, _ := fn(seed)
				results <- r
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
	return results
}

func TestFailingDownloadGivesItsSlotOn(t *testing.T) {
	envtest.SkipIfUnavailable(t)
	f := Start(t, Options{})
	if r := FailingDownload(context.Background(), f, 1); r.Failed() {
		t.Fatal(r)
	} else {
		t.Logf("%s; reboots %v", r, r.Reboots)
	}
}

func TestQuietAgentIsNamedOnThePool(t *testing.T) {
	envtest.SkipIfUnavailable(t)
	const quietAfter = 5 * time.Second
	f := Start(t, Options{
		Coordinator: func(o *controller.Options) { o.QuietAfter = quietAfter },
		Agent:       func(c *agent.Config) { c.ActiveReportInterval = time.Second },
	})
	if r := QuietAgent(context.Background(), f, quietAfter); r.Failed() {
		t.Fatal(r)
	} else {
		t.Logf("%s; reboots %v", r, r.Reboots)
	}
}

// A node that loses power while staged loses its download-only deployment,
// is staged again under a new grant, and still reboots exactly once under a
// grant; in both bootc generations that can stage locked, waiting for a
// reboot slot or holding one it had not used yet.
func TestLostStageIsStagedAgain(t *testing.T) {
	envtest.SkipIfUnavailable(t)
	f := Start(t, Options{})
	for _, tc := range []struct {
		seed             int64
		underRebootGrant bool
	}{{1, false}, {2, false}, {3, true}, {4, true}} {
		t.Run(fmt.Sprintf("%s/underRebootGrant=%v", generationFor(tc.seed), tc.underRebootGrant), func(t *testing.T) {
			if r := LostStage(context.Background(), f, tc.seed, tc.underRebootGrant); r.Failed() {
				t.Fatal(r)
			} else {
				t.Logf("%s; reboots %v", r, r.Reboots)
			}
		})
	}
}

// TestMultiArchIndexRollout: a pool of amd64 and arm64 nodes rolls out a
// multi-arch index, then a second one mid-rollout; each node ends on its
// own platform's image (docs/design.md, amendment 12).
// Replay: go test ./tests/fleet -run TestMultiArchIndexRollout -seeds 3 -v
func TestMultiArchIndexRollout(t *testing.T) {
	envtest.SkipIfUnavailable(t)
	all := seeds(t, 2)
	f := Start(t, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	for r := range runSeeds(all, *batchFlag, func(seed int64) (Result, []Fault) { return MultiArchIndex(ctx, f, seed), nil }) {
		if r.Failed() {
			t.Errorf("%s\nreplay: go test ./tests/fleet -run TestMultiArchIndexRollout -seeds %d", r, r.Seed)
		} else {
			t.Logf("seed %d: ok in %s, reboots %v", r.Seed, r.Duration.Round(time.Millisecond), r.Reboots)
		}
	}
}

// TestSoftRebootRollout: an AllowSoftReboot pool converges by one soft
// reboot per node (no full reboot), every slot and cordon released.
func TestSoftRebootRollout(t *testing.T) {
	envtest.SkipIfUnavailable(t)
	f := Start(t, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for _, r := range []Result{SoftRebootRollout(ctx, f, 1), SoftRebootFallback(ctx, f, 1)} {
		if r.Failed() {
			t.Error(r)
		} else {
			t.Logf("%s; reboots %v", r, r.Reboots)
		}
	}
}

// A maintenance window that opens during the run, a held node,
// pauseBetweenBatches and minReadySeconds, against the real coordinator.
func TestPacedRollout(t *testing.T) {
	envtest.SkipIfUnavailable(t)
	clock := &ShiftableClock{}
	f := Start(t, Options{Coordinator: func(o *controller.Options) { o.Clock = clock.Now }})
	if r := PacedRollout(context.Background(), f, clock); r.Failed() {
		t.Fatal(r)
	} else {
		t.Logf("%s; reboots %v", r, r.Reboots)
	}
}
