package fleet

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	"github.com/bootc-fleet/bootc-fleet/internal/sim/invariant"
)

// Hop names, in the order one reboot slot goes through them.
const (
	HopGrantCordon   = "grant→cordon"
	HopCordonDrained = "cordon→drained (phase Reboot)"
	HopDrainedUnlock = "drained→unlock"
	HopUnlockRequest = "unlock→reboot request"
	HopRequestBoot   = "reboot request→boot"
	HopBootRelease   = "boot→verified release"
	HopReleaseGrant  = "release→next grant (same slot)"
)

// Hops before the first wave (each node's stage), by the node's first
// stage grant: creation to it, to the node's StageStart, to its StageEnd,
// and, for the nodes of wave 0, from StageEnd to their reboot grant.
const (
	StageCreatedGrant = "change→stage grant"
	StageGrantStart   = "stage grant→stage start"
	StageStartEnd     = "stage start→stage end"
	StageEndGrant     = "stage end→reboot grant (wave 0)"
)

// StageOrder lists the stage hops as Timing prints them.
var StageOrder = []string{StageCreatedGrant, StageGrantStart, StageStartEnd, StageEndGrant}

// HopOrder lists the hops as Timing prints them.
var HopOrder = []string{HopGrantCordon, HopCordonDrained, HopDrainedUnlock, HopUnlockRequest, HopRequestBoot, HopBootRelease, HopReleaseGrant}

// Cycle is one reboot grant followed from grant to release; a zero time is
// a step the log does not show.
type Cycle struct {
	Slot, Node                                                        string
	Wave                                                              int // 0 for the slot's first grant, 1 for its second, ...
	Grant, Cordon, Drained, Unlock, Request, Boot, Release, NextGrant time.Time
}

// Timing is what a rollout's event log says about its pace.
type Timing struct {
	Created    time.Time
	FirstGrant time.Time // first reboot grant of the pool
	End        time.Time // last verified release of a reboot slot
	Cycles     []Cycle
	Hops       map[string][]time.Duration
	Stage      map[string][]time.Duration
	Incomplete int // cycles missing a step
}

// Makespan is the pool's image change (Created) to the last verified release.
func (t Timing) Makespan() time.Duration { return t.End.Sub(t.Created) }

// ExtractTiming follows every reboot slot of pool in a run's log (pure).
// Grant, drained (phase Reboot), release and next grant are the recorder's
// Lease versions; cordon its Node watch; unlock (Apply), reboot request and
// boot the node's own events. Each node step is the first of its kind after
// the previous step of the same cycle.
func ExtractTiming(events []invariant.Event, pool string, created time.Time) Timing {
	t := Timing{Created: created, Hops: map[string][]time.Duration{}, Stage: map[string][]time.Duration{}}
	stageGrant := map[string]time.Time{}
	byNode := map[string][]invariant.Event{}
	type slotState struct {
		holder string
		cur    *Cycle
		waves  int
	}
	slots := map[string]*slotState{}
	var cycles []*Cycle
	for _, e := range events {
		if e.Pool != pool {
			continue
		}
		if e.Kind != invariant.LeaseVersion {
			if e.Node != "" {
				byNode[e.Node] = append(byNode[e.Node], e)
			}
			continue
		}
		if e.Slot == lease.KindStage && e.Holder != "" {
			if _, ok := stageGrant[e.Holder]; !ok {
				stageGrant[e.Holder] = e.At
			}
		}
		if e.Slot != lease.KindReboot {
			continue
		}
		s := slots[e.Lease]
		if s == nil {
			s = &slotState{}
			slots[e.Lease] = s
		}
		switch {
		case e.Holder != "" && e.Holder != s.holder:
			if s.cur != nil && s.cur.Release.IsZero() {
				s.cur.Release = e.At // handed over without a free version in between
			}
			if s.cur != nil {
				s.cur.NextGrant = e.At
			}
			c := &Cycle{Slot: e.Lease, Node: e.Holder, Wave: s.waves, Grant: e.At}
			s.waves++
			s.cur, s.holder = c, e.Holder
			cycles = append(cycles, c)
			if t.FirstGrant.IsZero() || e.At.Before(t.FirstGrant) {
				t.FirstGrant = e.At
			}
		case e.Holder != "" && e.Phase == lease.PhaseReboot && s.cur != nil && s.cur.Drained.IsZero():
			s.cur.Drained = e.At
		case e.Holder == "" && s.holder != "":
			if s.cur != nil {
				s.cur.Release = e.At
				if e.At.After(t.End) {
					t.End = e.At
				}
			}
			s.holder = ""
		}
	}
	for _, c := range cycles {
		after := func(kind invariant.Kind, from time.Time) time.Time {
			if from.IsZero() {
				return time.Time{}
			}
			for _, e := range byNode[c.Node] {
				if e.Kind == kind && !e.At.Before(from) && (c.Release.IsZero() || !e.At.After(c.Release)) {
					return e.At
				}
			}
			return time.Time{}
		}
		// The cordon comes from the Node watch, the grant from the Lease
		// watch: their receipt order can flip by a few milliseconds, so a
		// cordon up to watchSlack before the grant is this cycle's (a node
		// goes through one cycle per rollout), and its hop counts as 0.
		early := func(at time.Time) time.Time {
			if at.IsZero() {
				return at
			}
			return at.Add(-watchSlack)
		}
		c.Cordon = after(invariant.Cordon, early(c.Grant))
		// Likewise an agent acting on its informer's copy of phase Reboot
		// can log its unlock before the recorder's watch delivers it.
		c.Unlock = after(invariant.Apply, early(c.Drained))
		if !c.Unlock.IsZero() && c.Unlock.Before(c.Grant) {
			c.Unlock = after(invariant.Apply, c.Grant) // not before this cycle's grant
		}
		c.Request = after(invariant.Reboot, c.Unlock)
		c.Boot = after(invariant.Boot, c.Request)
		steps := []time.Time{c.Grant, c.Cordon, c.Drained, c.Unlock, c.Request, c.Boot, c.Release}
		complete := true
		for i, name := range HopOrder[:6] {
			if steps[i].IsZero() || steps[i+1].IsZero() {
				complete = false
				continue
			}
			t.Hops[name] = append(t.Hops[name], max(0, steps[i+1].Sub(steps[i])))
		}
		if !c.NextGrant.IsZero() && !c.Release.IsZero() {
			t.Hops[HopReleaseGrant] = append(t.Hops[HopReleaseGrant], c.NextGrant.Sub(c.Release))
		}
		if !complete {
			t.Incomplete++
		}
		t.Cycles = append(t.Cycles, *c)
	}
	nodes := make([]string, 0, len(stageGrant))
	for node := range stageGrant {
		nodes = append(nodes, node)
	}
	sort.Strings(nodes)
	wave0 := map[string]time.Time{}
	for _, c := range t.Cycles {
		if c.Wave == 0 {
			wave0[c.Node] = c.Grant
		}
	}
	for _, node := range nodes {
		g := stageGrant[node]
		t.Stage[StageCreatedGrant] = append(t.Stage[StageCreatedGrant], g.Sub(created))
		first := func(kind invariant.Kind, from time.Time) time.Time {
			for _, e := range byNode[node] {
				if e.Kind == kind && !from.IsZero() && !e.At.Before(from) {
					return e.At
				}
			}
			return time.Time{}
		}
		start := first(invariant.StageStart, g)
		end := first(invariant.StageEnd, start)
		if !start.IsZero() {
			t.Stage[StageGrantStart] = append(t.Stage[StageGrantStart], start.Sub(g))
		}
		if !end.IsZero() {
			t.Stage[StageStartEnd] = append(t.Stage[StageStartEnd], end.Sub(start))
			if rg, ok := wave0[node]; ok {
				t.Stage[StageEndGrant] = append(t.Stage[StageEndGrant], max(0, rg.Sub(end)))
			}
		}
	}
	return t
}

// Overhead is, for each reboot slot cycle followed by the slot's next
// grant, the cycle (grant to next grant) less the reboot itself (reboot, the
// time a node is down): what the control plane adds to each wave. The
// hops (HopOrder) break it down.
func (t Timing) Overhead(reboot time.Duration) []time.Duration {
	var out []time.Duration
	for _, c := range t.Cycles {
		if !c.Grant.IsZero() && !c.NextGrant.IsZero() {
			out = append(out, c.NextGrant.Sub(c.Grant)-reboot)
		}
	}
	return out
}

// watchSlack: see ExtractTiming.
const watchSlack = time.Second

// Quantile is the q-quantile (nearest rank) of ds; 0 when empty.
func Quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// LowerBound is S + ceil(N/M)·R: all nodes stage at once, then each reboot
// slot passes on only when its node is back.
func LowerBound(stage, reboot time.Duration, nodes, maxUnavailable int) time.Duration {
	waves := (nodes + maxUnavailable - 1) / maxUnavailable
	return stage + time.Duration(waves)*reboot
}

// Report renders the breakdown: one line per hop (median, p95, count), the
// time to the first grant, and each wave's span (first grant to last
// release of the wave's cycles) for at most maxWaves waves.
func (t Timing) Report(maxWaves int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "  image change→first reboot grant %s\n", ms(t.FirstGrant.Sub(t.Created)))
	for _, h := range StageOrder {
		ds := t.Stage[h]
		fmt.Fprintf(&b, "  %-32s median %8s  p95 %8s  (n=%d)\n", h, ms(Quantile(ds, 0.5)), ms(Quantile(ds, 0.95)), len(ds))
	}
	for _, h := range HopOrder {
		ds := t.Hops[h]
		fmt.Fprintf(&b, "  %-32s median %8s  p95 %8s  (n=%d)\n", h, ms(Quantile(ds, 0.5)), ms(Quantile(ds, 0.95)), len(ds))
	}
	if t.Incomplete > 0 {
		fmt.Fprintf(&b, "  %d cycle(s) miss a step in the log\n", t.Incomplete)
	}
	waves := map[int][2]time.Time{}
	top := -1
	for _, c := range t.Cycles {
		w := waves[c.Wave]
		if w[0].IsZero() || c.Grant.Before(w[0]) {
			w[0] = c.Grant
		}
		if c.Release.After(w[1]) {
			w[1] = c.Release
		}
		waves[c.Wave] = w
		top = max(top, c.Wave)
	}
	for i := 0; i <= top && i < maxWaves; i++ {
		w := waves[i]
		fmt.Fprintf(&b, "  wave %2d: first grant +%s, last release +%s\n", i, ms(w[0].Sub(t.Created)), ms(w[1].Sub(t.Created)))
	}
	return b.String()
}

// LastSlot is the reboot slot whose last release ends the rollout, with its
// cycles in order: the makespan is the first grant plus these cycles, so
// they show where the excess over the bound goes.
func (t Timing) LastSlot() (string, []Cycle) {
	var slot string
	var end time.Time
	for _, c := range t.Cycles {
		if c.Release.After(end) {
			slot, end = c.Slot, c.Release
		}
	}
	var out []Cycle
	for _, c := range t.Cycles {
		if c.Slot == slot {
			out = append(out, c)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Wave < out[j].Wave })
	return slot, out
}

// LastSlotReport renders LastSlot: per cycle, each hop in milliseconds
// (HopOrder; "-" where the log misses a step) and the cycle less reboot.
func (t Timing) LastSlotReport(reboot time.Duration) string {
	slot, cycles := t.LastSlot()
	if slot == "" {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "  slot that ends the rollout, %s: hops in ms (grant→cordon→drained→unlock→request→boot→release→next grant), overhead\n", slot)
	for _, c := range cycles {
		steps := []time.Time{c.Grant, c.Cordon, c.Drained, c.Unlock, c.Request, c.Boot, c.Release, c.NextGrant}
		hops := make([]string, 0, len(steps)-1)
		for i := range steps[:len(steps)-1] {
			if steps[i].IsZero() || steps[i+1].IsZero() {
				hops = append(hops, "-")
				continue
			}
			hops = append(hops, fmt.Sprint(max(0, steps[i+1].Sub(steps[i])).Milliseconds()))
		}
		over := "-"
		if !c.Grant.IsZero() && !c.NextGrant.IsZero() {
			over = ms(c.NextGrant.Sub(c.Grant) - reboot)
		}
		fmt.Fprintf(&b, "    wave %2d %-16s %s  overhead %s\n", c.Wave, c.Node, strings.Join(hops, " "), over)
	}
	return b.String()
}

func ms(d time.Duration) string { return d.Round(time.Millisecond).String() }
