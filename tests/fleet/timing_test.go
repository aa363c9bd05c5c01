package fleet

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	"github.com/bootc-fleet/bootc-fleet/internal/sim/invariant"
)

func TestExtractTiming(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(msec int) time.Time { return t0.Add(time.Duration(msec) * time.Millisecond) }
	grant := func(msec int, slot, node string, ph lease.Phase) invariant.Event {
		return invariant.Event{At: at(msec), Kind: invariant.LeaseVersion, Pool: "p", Lease: slot, Slot: lease.KindReboot, Holder: node, Phase: ph}
	}
	free := func(msec int, slot string) invariant.Event {
		return invariant.Event{At: at(msec), Kind: invariant.LeaseVersion, Pool: "p", Lease: slot, Slot: lease.KindReboot}
	}
	node := func(msec int, kind invariant.Kind, node string) invariant.Event {
		return invariant.Event{At: at(msec), Kind: kind, Pool: "p", Node: node}
	}
	// One cycle of node a on slot 0, then node b on the same slot.
	cycle := func(start int, slot, n string) []invariant.Event {
		return []invariant.Event{
			grant(start, slot, n, lease.PhaseDraining),
			node(start+10, invariant.Cordon, n),
			grant(start+15, slot, n, lease.PhaseDraining), // cordoned-by-us recorded: no step
			grant(start+30, slot, n, lease.PhaseReboot),
			node(start+100, invariant.Apply, n),
			node(start+120, invariant.Reboot, n),
			node(start+3120, invariant.Boot, n),
			free(start+3400, slot),
		}
	}
	tests := []struct {
		name       string
		events     []invariant.Event
		makespan   time.Duration
		firstGrant time.Duration
		hops       map[string][]time.Duration
		stage      map[string][]time.Duration
		incomplete int
		waves      []int
	}{
		{
			name: "two waves on one slot",
			events: append(append([]invariant.Event{
				{At: at(500), Kind: invariant.LeaseVersion, Pool: "p", Lease: "p-stage-0", Slot: lease.KindStage, Holder: "a"},
				node(520, invariant.StageStart, "a"),
				node(900, invariant.StageEnd, "a"),
			}, cycle(1000, "p-reboot-0", "a")...), cycle(4600, "p-reboot-0", "b")...),
			stage: map[string][]time.Duration{
				StageCreatedGrant: {500 * time.Millisecond}, StageGrantStart: {20 * time.Millisecond},
				StageStartEnd: {380 * time.Millisecond}, StageEndGrant: {100 * time.Millisecond},
			},
			// b's release at 4600+3400.
			makespan: 8000 * time.Millisecond, firstGrant: time.Second,
			hops: map[string][]time.Duration{
				HopGrantCordon:   {10 * time.Millisecond, 10 * time.Millisecond},
				HopCordonDrained: {20 * time.Millisecond, 20 * time.Millisecond},
				HopDrainedUnlock: {70 * time.Millisecond, 70 * time.Millisecond},
				HopUnlockRequest: {20 * time.Millisecond, 20 * time.Millisecond},
				HopRequestBoot:   {3 * time.Second, 3 * time.Second},
				HopBootRelease:   {280 * time.Millisecond, 280 * time.Millisecond},
				HopReleaseGrant:  {200 * time.Millisecond},
			},
			waves: []int{0, 1},
		},
		{
			name: "other pools and events before the grant are ignored",
			events: append([]invariant.Event{
				node(900, invariant.Apply, "a"), // an earlier apply is not this cycle's
				{At: at(950), Kind: invariant.LeaseVersion, Pool: "q", Lease: "q-reboot-0", Slot: lease.KindReboot, Holder: "x"},
			}, cycle(1000, "p-reboot-0", "a")...),
			makespan: 4400 * time.Millisecond, firstGrant: time.Second,
			hops: map[string][]time.Duration{
				HopGrantCordon: {10 * time.Millisecond}, HopCordonDrained: {20 * time.Millisecond},
				HopDrainedUnlock: {70 * time.Millisecond}, HopUnlockRequest: {20 * time.Millisecond},
				HopRequestBoot: {3 * time.Second}, HopBootRelease: {280 * time.Millisecond},
			},
			waves: []int{0},
		},
		{
			name: "a cordon seen just before its grant (two watches) counts as 0",
			events: []invariant.Event{
				node(995, invariant.Cordon, "d"),
				grant(1000, "p-reboot-2", "d", lease.PhaseDraining),
				grant(1030, "p-reboot-2", "d", lease.PhaseReboot),
				node(1100, invariant.Apply, "d"),
				node(1120, invariant.Reboot, "d"),
				node(4120, invariant.Boot, "d"),
				free(4400, "p-reboot-2"),
			},
			makespan: 4400 * time.Millisecond, firstGrant: time.Second,
			hops: map[string][]time.Duration{
				HopGrantCordon: {0}, HopCordonDrained: {35 * time.Millisecond},
				HopDrainedUnlock: {70 * time.Millisecond}, HopUnlockRequest: {20 * time.Millisecond},
				HopRequestBoot: {3 * time.Second}, HopBootRelease: {280 * time.Millisecond},
			},
			waves: []int{0},
		},
		{
			name: "a cycle without a boot is incomplete",
			events: []invariant.Event{
				grant(1000, "p-reboot-1", "c", lease.PhaseDraining),
				node(1010, invariant.Cordon, "c"),
				grant(1030, "p-reboot-1", "c", lease.PhaseReboot),
				node(1100, invariant.Apply, "c"),
				node(1120, invariant.Reboot, "c"),
				free(2000, "p-reboot-1"), // e.g. revoked
			},
			makespan: 2 * time.Second, firstGrant: time.Second,
			hops: map[string][]time.Duration{
				HopGrantCordon: {10 * time.Millisecond}, HopCordonDrained: {20 * time.Millisecond},
				HopDrainedUnlock: {70 * time.Millisecond}, HopUnlockRequest: {20 * time.Millisecond},
			},
			incomplete: 1, waves: []int{0},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := ExtractTiming(tc.events, "p", t0)
			if got.Makespan() != tc.makespan {
				t.Errorf("makespan %s, want %s", got.Makespan(), tc.makespan)
			}
			if d := got.FirstGrant.Sub(t0); d != tc.firstGrant {
				t.Errorf("first grant +%s, want +%s", d, tc.firstGrant)
			}
			for _, h := range HopOrder {
				if g, w := got.Hops[h], tc.hops[h]; len(g) != len(w) {
					t.Errorf("%s: %v, want %v", h, g, w)
				} else {
					for i := range g {
						if g[i] != w[i] {
							t.Errorf("%s: %v, want %v", h, g, w)
							break
						}
					}
				}
			}
			if tc.stage != nil {
				for _, h := range StageOrder {
					if g, w := got.Stage[h], tc.stage[h]; fmt.Sprint(g) != fmt.Sprint(w) {
						t.Errorf("%s: %v, want %v", h, g, w)
					}
				}
			}
			if got.Incomplete != tc.incomplete {
				t.Errorf("incomplete %d, want %d", got.Incomplete, tc.incomplete)
			}
			var waves []int
			for _, c := range got.Cycles {
				waves = append(waves, c.Wave)
			}
			if len(waves) != len(tc.waves) {
				t.Errorf("waves %v, want %v", waves, tc.waves)
			}
		})
	}
}

func TestLowerBoundAndQuantile(t *testing.T) {
	for _, tc := range []struct{ n, m, want int }{{100, 10, 32}, {1000, 100, 32}, {5000, 500, 32}, {101, 10, 35}} {
		if got := LowerBound(2*time.Second, 3*time.Second, tc.n, tc.m); got != time.Duration(tc.want)*time.Second {
			t.Errorf("LB(%d, %d) = %s, want %ds", tc.n, tc.m, got, tc.want)
		}
	}
	ds := []time.Duration{5, 1, 4, 2, 3, 6, 7, 8, 9, 10}
	if got := Quantile(ds, 0.5); got != 5 {
		t.Errorf("median %d, want 5", got)
	}
	if got := Quantile(ds, 0.95); got != 10 {
		t.Errorf("p95 %d, want 10", got)
	}
	if got := Quantile(nil, 0.5); got != 0 {
		t.Errorf("empty median %d", got)
	}
}

// A wave's overhead is the slot's cycle, grant to the next grant, less the
// reboot; a cycle no grant follows has none yet.
func TestOverheadIsTheCycleLessTheReboot(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tm := Timing{Cycles: []Cycle{
		{Grant: t0, NextGrant: t0.Add(3400 * time.Millisecond)},
		{Grant: t0.Add(3400 * time.Millisecond), NextGrant: t0.Add(6700 * time.Millisecond)},
		{Grant: t0.Add(6700 * time.Millisecond)},
	}}
	got := tm.Overhead(3 * time.Second)
	want := []time.Duration{400 * time.Millisecond, 300 * time.Millisecond}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("Overhead(3s) = %v, want %v", got, want)
	}
}

func TestLastSlotIsTheOneThatEndsTheRollout(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	tm := Timing{Cycles: []Cycle{
		{Slot: "p-reboot-1", Node: "b", Wave: 1, Grant: at(3300), Release: at(6500)},
		{Slot: "p-reboot-0", Node: "a", Wave: 0, Grant: at(0), Cordon: at(10), Drained: at(40), Unlock: at(60), Request: at(65),
			Boot: at(3070), Release: at(3120), NextGrant: at(3120)},
		{Slot: "p-reboot-0", Node: "c", Wave: 1, Grant: at(3120), Release: at(6400)},
		{Slot: "p-reboot-1", Node: "d", Wave: 0, Grant: at(0), Release: at(3200), NextGrant: at(3300)},
	}}
	slot, cycles := tm.LastSlot()
	if slot != "p-reboot-1" || len(cycles) != 2 || cycles[0].Node != "d" || cycles[1].Node != "b" {
		t.Fatalf("LastSlot = %s %+v, want p-reboot-1 with d then b", slot, cycles)
	}
	tm.Cycles = tm.Cycles[1:3]
	got := tm.LastSlotReport(3 * time.Second)
	for _, want := range []string{"p-reboot-0", "wave  0 a                10 30 20 5 3005 50 0  overhead 120ms", "wave  1 c                - - - - - - -  overhead -"} {
		if !strings.Contains(got, want) {
			t.Errorf("LastSlotReport lacks %q:\n%s", want, got)
		}
	}
}
