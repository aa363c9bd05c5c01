package fleet

import (
	"context"
	"fmt"
	"sort"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/sim"
	"github.com/bootc-fleet/bootc-fleet/internal/sim/invariant"
)

// ShiftableClock is a coordinator clock at a settable offset from the wall
// clock, so a test can put the coordinator just before a maintenance
// window's minute without waiting for it. No agent compares clocks.
type ShiftableClock struct{ off atomic.Int64 }

// Now is the real time shifted by the clock's offset.
func (c *ShiftableClock) Now() time.Time { return time.Now().Add(time.Duration(c.off.Load())) }

// SetNow makes the clock read t now.
func (c *ShiftableClock) SetNow(t time.Time) { c.off.Store(int64(time.Until(t))) }

// Offset is the clock's offset from the wall clock.
func (c *ShiftableClock) Offset() time.Duration { return time.Duration(c.off.Load()) }

// PacedRollout rolls out under a maintenance window that opens during the
// run, a held node, pauseBetweenBatches and minReadySeconds, with the
// coordinator on clock. The held node is never granted anything until its
// hold is removed; no reboot is granted before the window opens; each batch
// starts only with no reboot slot held and the pause over since the last
// release; no slot is released before its node stayed back minReadySeconds.
func PacedRollout(ctx context.Context, f *Fleet, clock *ShiftableClock) Result {
	const (
		pause    = 3 * time.Second
		minReady = 2 * time.Second
		untilWin = 5 * time.Second
	)
	start := time.Now()
	name := "paced"
	res := Result{Pool: name}
	opts := PoolOptions{Nodes: 5, MaxUnavailable: 2, MaxStaging: 5, HaltAfter: 1, RebootTimeout: time.Minute}
	opts.Behaviour = func(int) NodeBehaviour {
		return NodeBehaviour{BootTime: 500 * time.Millisecond, StageTime: 300 * time.Millisecond, StaleAfterReboot: 300 * time.Millisecond}
	}
	// The window opens at the next minute of the coordinator's clock, which
	// is set to untilWin before it just before the pool is created.
	opening := clock.Now().Add(time.Minute).Truncate(time.Minute)
	opts.Mutate = func(p *fleetv1.BootcNodePool) {
		p.Spec.Rollout.Windows = []fleetv1.MaintenanceWindow{{Start: opening.UTC().Format("15:04"), Duration: metav1.Duration{Duration: time.Hour}}}
		p.Spec.Rollout.PauseBetweenBatches = &metav1.Duration{Duration: pause}
		p.Spec.Rollout.MinReadySeconds = int32(minReady / time.Second)
	}
	p := f.AddPool(name, opts)
	v2 := p.Push("v2")
	held := p.Nodes[len(p.Nodes)-1].Name
	setHold := func(on bool) error {
		patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%s}}}`, fleetv1.AnnotationHold, map[bool]string{true: `"kernel bisect"`, false: "null"}[on])
		_, err := f.Kube.CoreV1().Nodes().Patch(ctx, held, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		return err
	}
	if err := setHold(true); err != nil {
		res.Problems = append(res.Problems, "holding "+held+": "+err.Error())
		return res
	}
	clock.SetNow(opening.Add(-untilWin))
	openWall := time.Now().Add(untilWin)
	p.Create("v2", opts)

	others := func() (bool, string) {
		for _, n := range p.Nodes {
			if n.Name == held {
				continue
			}
			if st := n.Machine.State(); st.Booted == nil || st.Booted.Image != v2 {
				return false, n.Name
			}
		}
		return true, ""
	}
	if !sim.WaitFor(ctx, 2*time.Minute, func() bool { ok, _ := others(); return ok && p.Status().Rebooting == 0 }) {
		_, w := others()
		res.Problems = append(res.Problems, fmt.Sprintf("the nodes not held did not all boot v2 within 2m (waiting for %s): %+v", w, p.Status()))
		return res
	}
	if st := p.Status(); st.Held != 1 {
		res.Problems = append(res.Problems, fmt.Sprintf("status.held %d, want 1", st.Held))
	}
	evs := p.Events()
	res.Problems = append(res.Problems, checkPacing(evs, held, openWall, clock.Offset(), pause, minReady)...)

	// Released, the held node is updated too.
	if err := setHold(false); err != nil {
		res.Problems = append(res.Problems, "releasing "+held+": "+err.Error())
	}
	if !sim.WaitFor(ctx, time.Minute, func() bool { ok, _ := p.Converged(v2); return ok }) {
		_, w := p.Converged(v2)
		res.Problems = append(res.Problems, fmt.Sprintf("not converged after the hold was lifted (waiting for %s)", w))
	}
	sim.WaitFor(ctx, 10*time.Second, func() bool { return p.Status().Rebooting == 0 })
	res.Violations = p.Check(v2, invariant.Pool{MaxUnavailable: opts.MaxUnavailable, MaxStaging: opts.MaxStaging, HaltAfter: opts.HaltAfter})
	res.Reboots = p.Reboots()
	res.Problems = append(res.Problems, rebootsMatchGrants(p, res.Reboots)...)
	res.Duration = time.Since(start)
	if !res.Failed() {
		p.Remove()
	}
	return res
}

// checkPacing judges the run from the recorded Lease versions (grants and
// releases on the coordinator's clock) and boots (the harness's clock; off
// converts them).
func checkPacing(evs []invariant.Event, held string, openWall time.Time, off, pause, minReady time.Duration) []string {
	var problems []string
	sort.Slice(evs, func(i, j int) bool { return evs[i].Seq < evs[j].Seq })
	holder := map[string]string{} // reboot slot -> holder, as recorded so far
	var lastRelease time.Time     // coordinator clock
	lastBoot := map[string]time.Time{}
	grants := 0
	for _, e := range evs {
		switch e.Kind {
		case invariant.Boot:
			lastBoot[e.Node] = e.At
		case invariant.LeaseVersion:
			if e.Holder == held && holder[e.Lease] != held && e.Slot == lease.KindReboot {
				problems = append(problems, fmt.Sprintf("held node %s was granted %s", held, e.Lease))
			}
			if e.Slot != lease.KindReboot {
				if e.Holder == held {
					problems = append(problems, fmt.Sprintf("held node %s was granted stage slot %s", held, e.Lease))
				}
				continue
			}
			prev := holder[e.Lease]
			switch {
			case prev == "" && e.Holder != "":
				grants++
				if e.At.Before(openWall) {
					problems = append(problems, fmt.Sprintf("reboot slot %s granted to %s at %s, before the window opened at %s", e.Lease, e.Holder, e.At.Format(time.RFC3339Nano), openWall.Format(time.RFC3339Nano)))
				}
				for s, h := range holder {
					// A grant in the same batch (the same pass) is fine:
					// the batch started with every slot free.
					if h != "" && s != e.Lease && !lastRelease.IsZero() && e.Acquired.Sub(lastRelease) < pause {
						problems = append(problems, fmt.Sprintf("reboot slot %s granted to %s while %s held %s", e.Lease, e.Holder, h, s))
					}
				}
				if !lastRelease.IsZero() && e.Acquired.Sub(lastRelease) < pause {
					problems = append(problems, fmt.Sprintf("reboot slot %s granted to %s %s after the last release, want at least pauseBetweenBatches %s", e.Lease, e.Holder, e.Acquired.Sub(lastRelease), pause))
				}
			case prev != "" && e.Holder == "" && !e.ReleasedAt.IsZero():
				if b, ok := lastBoot[prev]; !ok || e.ReleasedAt.Sub(b.Add(off)) < minReady {
					problems = append(problems, fmt.Sprintf("reboot slot %s of %s released %s after its boot, want at least minReadySeconds %s", e.Lease, prev, e.ReleasedAt.Sub(b.Add(off)), minReady))
				}
				if e.ReleasedAt.After(lastRelease) {
					lastRelease = e.ReleasedAt
				}
			}
			holder[e.Lease] = e.Holder
		}
	}
	if grants < 2 {
		problems = append(problems, fmt.Sprintf("%d reboot grants recorded, want the 4 nodes not held in batches of 2", grants))
	}
	return problems
}
