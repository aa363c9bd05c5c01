package plan

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"pgregory.net/rapid"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

func canaries(w *world, nodes intstr.IntOrString, soak time.Duration) {
	w.pool.Spec.Rollout.Canary = &fleetv1.CanarySpec{Nodes: &nodes, Soak: &metav1.Duration{Duration: soak}}
}

// zones puts the nodes named in each zone ("name=zone ...").
func zones(w *world, spec string) {
	for _, f := range strings.Fields(spec) {
		name, zone, _ := strings.Cut(f, "=")
		w.nodes[name].Zone = zone
	}
}

// The golden scenarios of the rollout's waves (amendment 26).
func init() {
	scenarios = append(scenarios,
		scenario{
			name:  "canary-first",
			about: "4 nodes, maxUnavailable 2, maxStaging 4, canary.nodes 1, no soak: node-00 (first in the queue) is rolled alone; once its slot is released the rest go two at a time",
			nodes: 4, passes: 40,
			setup: func(w *world) {
				budget(w, 2, 4)
				canaries(w, intstr.FromInt32(1), 0)
			},
		},
		scenario{
			name:  "canary-soak",
			about: "3 nodes, maxUnavailable 2, canary.nodes 34% (rounds up to 2 of 3), soak 1m: node-00 and node-01 go first; node-02 gets no reboot grant until 1m after the last canary's slot was released",
			nodes: 3, passes: 40,
			setup: func(w *world) {
				budget(w, 2, 3)
				canaries(w, intstr.FromString("34%"), time.Minute)
			},
		},
		scenario{
			name:  "canary-labelled",
			about: "4 nodes, maxUnavailable 1, maxStaging 4, canary.nodes 1: node-02 and node-03 are labelled fleet.bootc.dev/canary, so they are the canaries (both, the label wins over the count) and go first, one at a time",
			nodes: 4, passes: 40,
			setup: func(w *world) {
				budget(w, 1, 4)
				canaries(w, intstr.FromInt32(1), 0)
				w.nodes["node-02"].Canary, w.nodes["node-03"].Canary = true, true
			},
		},
		scenario{
			name:  "zones",
			about: "6 nodes, maxUnavailable 2, maxStaging 6, zoneOrder Sequential (default): zone a (node-01, node-03, node-05) rolls first, then zone b (node-00, node-02), then node-04 without a zone; never two zones at once",
			nodes: 6, passes: 40,
			setup: func(w *world) {
				budget(w, 2, 6)
				zones(w, "node-00=b node-01=a node-02=b node-03=a node-05=a")
			},
		},
		scenario{
			name: "zone-held",
			about: "4 nodes, maxUnavailable 2, maxStaging 4, zones a (node-00, node-01), b (node-02), c (node-03): node-00 is held (staged before the hold), so zone a is done once node-01 is, " +
				"and zone b goes, alone although two slots are free; the hold is lifted after pass 6, while zone b is under way: node-00 waits for zone b to finish, then zone a goes again, then zone c",
			nodes: 4, passes: 40,
			setup: func(w *world) {
				budget(w, 2, 4)
				zones(w, "node-00=a node-01=a node-02=b node-03=c")
				w.nodes["node-00"].Held, w.nodes["node-00"].HoldReason = true, "disk check"
				w.agentReports("node-00", imgV0, imgV1, fleetv1.PhaseStaged)
			},
			act: func(w *world, pass int, _ map[string]bool) {
				if pass == 6 {
					w.nodes["node-00"].Held, w.nodes["node-00"].HoldReason = false, ""
				}
				w.idealWorld()
			},
		},
	)
}

func TestWaveOrder(t *testing.T) {
	tests := []struct {
		name, in, canary, zones, rolling, want string
	}{
		{"no waves: as given", "c a b", "", "", "", "c a b"},
		{"canaries first, in the given order", "a b c d", "d b", "", "", "b d a c"},
		{"zones in name order, no zone last", "a b c d e", "", "a=z2 b=z1 d=z1 e=z2", "", "b d a e c"},
		{"the zone under way first", "a b c d e", "", "a=z2 b=z1 d=z1 e=z2", "z2", "a e b d c"},
		{"the nodes without a zone under way first", "a b c", "", "a=z2 b=z1", "-", "c b a"},
		{"canaries before zones", "a b c", "c", "a=z1 c=z9", "z1", "c a b"},
		{"empty", "", "", "", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			zone := map[string]string{}
			for _, f := range strings.Fields(tt.zones) {
				n, z, _ := strings.Cut(f, "=")
				zone[n] = z
			}
			in := strings.Fields(tt.in)
			keep := append([]string(nil), in...)
			waves := Waves{Canary: nameSet(tt.canary), Zone: func(n string) string { return zone[n] }, Rolling: strings.TrimPrefix(tt.rolling, "-"), HasRolling: tt.rolling != ""}
			got := WaveOrder(in, waves)
			if want := strings.Fields(tt.want); !slices.Equal(got, want) {
				t.Errorf("WaveOrder(%q, canary %q, zones %q) = %q, want %q", tt.in, tt.canary, tt.zones, got, want)
			}
			if !slices.Equal(in, keep) {
				t.Errorf("WaveOrder changed its input to %q", in)
			}
		})
	}
}

func TestZoneOf(t *testing.T) {
	for _, tt := range []struct {
		order       fleetv1.ZoneOrder
		label, want string
	}{
		{fleetv1.ZoneOrderSequential, "eu-1a", "eu-1a"},
		{"", "eu-1a", "eu-1a"},
		{fleetv1.ZoneOrderAny, "eu-1a", ""},
		{fleetv1.ZoneOrderSequential, "", ""},
	} {
		if got := ZoneOf(tt.order, tt.label); got != tt.want {
			t.Errorf("ZoneOf(%q, %q) = %q, want %q", tt.order, tt.label, got, tt.want)
		}
	}
}

// wavesWorld: every node's agent report the target staged, locked.
func wavesWorld(n int) *world {
	w := newWorld(n, n, n)
	for _, name := range sortedKeys(w.nodes) {
		w.agentReports(name, imgV0, imgV1, fleetv1.PhaseStaged)
		w.bns[name].Spec.DesiredImage = imgV1.String()
	}
	return w
}

func rebootGrants(out Output) []string {
	var got []string
	for _, c := range changes(out, OpGrant, lease.KindReboot) {
		got = append(got, c.Node)
	}
	return got
}

func TestCanarySelection(t *testing.T) {
	tests := []struct {
		name  string
		nodes int
		count intstr.IntOrString
		setup func(w *world)
		want  string // status.canary.nodes and the only reboot grants
	}{
		{"the first node of the queue", 4, intstr.FromInt32(1), nil, "node-00"},
		{"a percentage rounds up", 5, intstr.FromString("30%"), nil, "node-00 node-01"},
		{"labelled nodes, all of them, whatever the count", 4, intstr.FromInt32(1), func(w *world) {
			w.nodes["node-01"].Canary, w.nodes["node-03"].Canary = true, true
		}, "node-01 node-03"},
		{"queue order is zone order: the first zone's nodes", 4, intstr.FromInt32(2), func(w *world) {
			zones(w, "node-00=b node-01=b node-02=a node-03=a")
		}, "node-02 node-03"},
		{"a held node is never picked", 3, intstr.FromInt32(1), func(w *world) { w.nodes["node-00"].Held = true }, "node-01"},
		{"a node on the target already is not picked", 3, intstr.FromInt32(1), func(w *world) {
			w.agentReports("node-00", imgV1, imgV1, fleetv1.PhaseIdle)
		}, "node-01"},
		{"a conflicting node is not picked", 3, intstr.FromInt32(1), func(w *world) { w.nodes["node-00"].OtherPools = []string{"other"} }, "node-01"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := wavesWorld(tt.nodes)
			canaries(w, tt.count, 0)
			if tt.setup != nil {
				tt.setup(w)
			}
			w.step() // creates the slots
			out := w.plan()
			if out.Status.Canary == nil {
				t.Fatalf("no status.canary: %+v", out.Status)
			}
			if got := strings.Join(out.Status.Canary.Nodes, " "); got != tt.want {
				t.Errorf("canaries %q, want %q", got, tt.want)
			}
			if out.Status.Canary.Target != imgV1.String() || out.Status.Canary.PassedTime != nil {
				t.Errorf("status.canary %+v: want target %s, not passed", out.Status.Canary, imgV1)
			}
			if got := strings.Join(rebootGrants(out), " "); got != tt.want {
				t.Errorf("reboot grants to %q, want only the canaries %q", got, tt.want)
			}
			if c := cond(out, fleetv1.PoolProgressing); c.Reason != fleetv1.ReasonCanaryWaiting || !strings.Contains(c.Message, "still to pass") {
				t.Errorf("Progressing %s %q, want CanaryWaiting naming the canaries still to pass", c.Reason, c.Message)
			}
		})
	}
}

func TestNoCanaries(t *testing.T) {
	for _, tt := range []struct {
		name  string
		setup func(w *world)
	}{
		{"no canary spec", func(*world) {}},
		{"canary.nodes 0, even with labelled nodes", func(w *world) {
			canaries(w, intstr.FromInt32(0), time.Hour)
			w.nodes["node-01"].Canary = true
		}},
		{"canary.nodes 0%", func(w *world) { canaries(w, intstr.FromString("0%"), time.Hour) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			w := wavesWorld(3)
			tt.setup(w)
			w.step()
			out := w.plan()
			if out.Status.Canary != nil {
				t.Errorf("status.canary %+v, want none", out.Status.Canary)
			}
			if got := len(rebootGrants(out)); got != 3 {
				t.Errorf("%d reboot grants, want 3 (maxUnavailable 3, no canaries)", got)
			}
		})
	}
}

// passCanary plays the canary's reboot through to its slot's release.
func passCanary(t *testing.T, w *world, name string) Output {
	t.Helper()
	for range 10 {
		out := w.step()
		for _, c := range out.Changes {
			if c.Node == name && c.Op == OpRelease && c.Why == WhyVerified {
				return out
			}
		}
		w.idealWorld()
		w.now = w.now.Add(10 * time.Second)
	}
	t.Fatalf("canary %s was not released", name)
	return Output{}
}

func TestCanarySoak(t *testing.T) {
	w := wavesWorld(3)
	canaries(w, intstr.FromInt32(1), 5*time.Minute)
	w.now = t0.Add(500 * time.Millisecond)
	out := passCanary(t, w, "node-00")
	c := out.Status.Canary
	if c == nil || c.PassedTime == nil {
		t.Fatalf("status.canary %+v: want passedTime set in the pass that released the last canary", c)
	}
	if c.PassedTime.Time.Before(w.now) || c.PassedTime.Nanosecond() != 0 {
		t.Errorf("passedTime %s: want whole seconds, never before the pass (%s)", c.PassedTime, w.now)
	}
	if !hasEvent(out, fleetv1.EventCanariesPassed, "") {
		t.Errorf("no CanariesPassed Event: %+v", out.Events)
	}
	if g := rebootGrants(out); len(g) != 0 {
		t.Errorf("reboot grants %v during the soak", g)
	}
	if p := cond(out, fleetv1.PoolProgressing); p.Reason != fleetv1.ReasonCanaryWaiting || !strings.Contains(p.Message, "soaking for 5m0s, until") {
		t.Errorf("Progressing %s %q, want CanaryWaiting with the soak's end", p.Reason, p.Message)
	}
	if out.RequeueAfter <= 0 || out.RequeueAfter > 5*time.Minute+time.Second {
		t.Errorf("RequeueAfter %s, want at most the soak", out.RequeueAfter)
	}
	passed := c.PassedTime.Time
	w.now = passed.Add(5*time.Minute - time.Second)
	w.idealWorld()
	if out := w.step(); len(rebootGrants(out)) != 0 || hasEvent(out, fleetv1.EventCanariesPassed, "") {
		t.Errorf("a second before the soak ends: grants %v, events %+v", rebootGrants(out), out.Events)
	}
	w.now = passed.Add(5 * time.Minute)
	out = w.step()
	if got := strings.Join(rebootGrants(out), " "); got != "node-01 node-02" {
		t.Errorf("at the soak's end: reboot grants %q, want node-01 node-02", got)
	}
	if p := cond(out, fleetv1.PoolProgressing); p.Reason != fleetv1.ReasonRollingOut {
		t.Errorf("after the soak Progressing is %s", p.Reason)
	}
	if out.Status.Canary == nil || !out.Status.Canary.PassedTime.Equal(&metav1.Time{Time: passed}) {
		t.Errorf("status.canary after the soak: %+v, want passedTime kept", out.Status.Canary)
	}
}

// A restarted coordinator (or one whose status write was lost) that finds
// every canary done and passedTime unset sets it to now: the soak runs
// from then, later, never earlier.
func TestCanaryPassedTimeAfterRestart(t *testing.T) {
	w := wavesWorld(2)
	canaries(w, intstr.FromInt32(1), time.Minute)
	passCanary(t, w, "node-00")
	w.pool.Status.Canary.PassedTime = nil // the write was lost
	w.now = w.now.Add(time.Hour)
	out := w.step()
	c := out.Status.Canary
	if c == nil || c.PassedTime == nil || c.PassedTime.Time.Before(w.now) {
		t.Fatalf("status.canary %+v: want passedTime now (%s)", c, w.now)
	}
	if len(rebootGrants(out)) != 0 {
		t.Errorf("reboot grants %v before the soak from the new passedTime", rebootGrants(out))
	}
}

// A new target picks its canaries again.
func TestCanariesPerTarget(t *testing.T) {
	w := wavesWorld(2)
	canaries(w, intstr.FromInt32(1), 0)
	w.converge(20, nil)
	if c := w.pool.Status.Canary; c == nil || c.Target != imgV1.String() || c.PassedTime == nil {
		t.Fatalf("after v1: status.canary %+v", c)
	}
	w.target = imgV2
	out := w.step()
	if c := out.Status.Canary; c == nil || c.Target != imgV2.String() || c.PassedTime != nil || strings.Join(c.Nodes, " ") != "node-00" {
		t.Errorf("after the target changed: status.canary %+v, want node-00 for v2, not passed", c)
	}
}

// A canary that is held is replaced while the canaries have not passed;
// one under way is kept.
func TestCanaryHeldIsReplaced(t *testing.T) {
	w := wavesWorld(3)
	canaries(w, intstr.FromInt32(1), 0)
	w.step()
	if got := strings.Join(rebootGrants(w.step()), " "); got != "node-00" {
		t.Fatalf("setup: reboot grants %q, want the canary node-00", got)
	}
	w.nodes["node-00"].Held = true
	// node-00 holds its reboot grant from the first pass: still a canary.
	if out := w.step(); strings.Join(out.Status.Canary.Nodes, " ") != "node-00" {
		t.Errorf("canary under way: %+v, want node-00 kept", out.Status.Canary)
	}
	// Its grant goes (the node left the pool and came back): held, it is replaced.
	for name, l := range w.leases {
		if ptr.Deref(l.Spec.HolderIdentity, "") == "node-00" {
			delete(w.leases, name)
		}
	}
	w.nodes["node-00"].Unschedulable = false
	w.step()
	out := w.step()
	if got := strings.Join(out.Status.Canary.Nodes, " "); got != "node-01" {
		t.Errorf("canaries %q, want node-01 in place of the held node-00", got)
	}
}

func TestZoneOrderAny(t *testing.T) {
	w := wavesWorld(4)
	w.pool.Spec.Rollout.ZoneOrder = fleetv1.ZoneOrderAny
	zones(w, "node-00=a node-01=b node-02=c node-03=d")
	w.step()
	if got := len(rebootGrants(w.plan())); got != 4 {
		t.Errorf("zoneOrder Any: %d reboot grants, want 4 across the zones", got)
	}
}

func TestZoneSequentialGrants(t *testing.T) {
	w := wavesWorld(4)
	zones(w, "node-00=b node-01=a node-02=b node-03=")
	w.step()
	if got := strings.Join(rebootGrants(w.plan()), " "); got != "node-01" {
		t.Errorf("reboot grants %q, want only zone a's node-01", got)
	}
}

// drawWaves gives a property-test pool canaries (or none) and its nodes
// zones and canary labels (amendment 26).
func drawWaves(rt *rapid.T, w *world) {
	switch rapid.IntRange(0, 3).Draw(rt, "canaryKind") {
	case 1:
		canaries(w, intstr.FromInt32(int32(rapid.IntRange(0, 3).Draw(rt, "canaryNodes"))), time.Duration(rapid.IntRange(0, 180).Draw(rt, "soakSeconds"))*time.Second)
	case 2:
		canaries(w, intstr.FromString(fmt.Sprintf("%d%%", rapid.IntRange(0, 100).Draw(rt, "canaryPct"))), time.Duration(rapid.IntRange(0, 180).Draw(rt, "soakSeconds"))*time.Second)
	case 3:
		w.pool.Spec.Rollout.Canary = &fleetv1.CanarySpec{} // the defaults: 1, no soak
	}
	w.pool.Spec.Rollout.ZoneOrder = rapid.SampledFrom([]fleetv1.ZoneOrder{"", fleetv1.ZoneOrderSequential, fleetv1.ZoneOrderAny}).Draw(rt, "zoneOrder")
	for _, name := range sortedKeys(w.nodes) {
		drawWaveLabels(rt, w, name)
	}
}

func drawWaveLabels(rt *rapid.T, w *world, name string) {
	w.nodes[name].Zone = rapid.SampledFrom([]string{"", "zone-a", "zone-b"}).Draw(rt, "zone")
	w.nodes[name].Canary = rapid.IntRange(0, 4).Draw(rt, "canaryLabel") == 0
}

// checkWaves checks one pass against the waves, independently of the
// planner: no reboot grant to a node that is not a canary before every
// canary is on its target with its slot released and the soak has passed;
// under zoneOrder Sequential, never reboot slots under way in two zones
// after a pass that granted one.
func checkWaves(rt *rapid.T, w *world, in Input, out Output) {
	// A rollback grant re-issues a failed node's own slot: no wave's grant.
	var grants []string
	for _, c := range changes(out, OpGrant, lease.KindReboot) {
		if !c.Rollback {
			grants = append(grants, c.Node)
		}
	}
	cs := out.Status.Canary
	spec := in.Pool.Spec.Rollout.Canary
	if cs != nil && cs.Target != w.target.String() {
		rt.Fatalf("status.canary for %s, target %s", cs.Target, w.target)
	}
	if cs != nil && cs.PassedTime != nil && (in.Pool.Status.Canary == nil || in.Pool.Status.Canary.PassedTime == nil || in.Pool.Status.Canary.Target != cs.Target) {
		// Passed in this pass: every canary is on its target, slot released.
		if len(cs.Nodes) == 0 || cs.PassedTime.Time.Before(in.Now) {
			rt.Fatalf("canaries %v passed at %s (pass at %s)", cs.Nodes, cs.PassedTime, in.Now)
		}
		for _, name := range cs.Nodes {
			bn := w.bns[name]
			want, _ := expectedFor(w, name)
			_, holds := w.grantOf(name, lease.KindReboot)
			if n := w.nodes[name]; n == nil || bn == nil || bn.Status.BootID != n.BootID || bn.Status.Booted == nil || bn.Status.Booted.Digest != want.Digest || holds {
				rt.Fatalf("canary %s counted as passed: node %+v status %+v, reboot slot held %v", name, n, bn, holds)
			}
		}
	}
	if spec != nil && len(grants) > 0 && in.Target.Digest != "" {
		members := 0
		for _, n := range in.Nodes {
			if n.InPool {
				members++
			}
		}
		count, _ := intstr.GetScaledValueFromIntOrPercent(intstr.ValueOrDefault(spec.Nodes, intstr.FromInt32(1)), members, true)
		if cs == nil && count > 0 {
			rt.Fatalf("reboot grants %v with canaries asked for (%+v) and no status.canary", grants, spec)
		}
		soak := time.Duration(0)
		if spec.Soak != nil {
			soak = spec.Soak.Duration
		}
		soaked := cs == nil || (cs.PassedTime != nil && !in.Now.Before(cs.PassedTime.Add(soak)))
		for _, g := range grants {
			if !soaked && !slices.Contains(cs.Nodes, g) {
				rt.Fatalf("reboot grant to %s, not a canary (%v), before the canaries passed and the soak %s (passed %v, now %s)\nnodes %s", g, cs.Nodes, soak, cs.PassedTime, in.Now, describeNodes(w))
			}
		}
	}
	// The pass that releases the last canary's slot grants no other node:
	// that grant would be written beside the release.
	newly := cs != nil && cs.PassedTime != nil && (in.Pool.Status.Canary == nil || in.Pool.Status.Canary.PassedTime == nil)
	for _, s := range WithPhases(in.Slots) {
		if !newly || s.Kind != lease.KindReboot || s.State == SlotFree || !slices.Contains(cs.Nodes, s.Grant.Holder) {
			continue
		}
		for _, g := range grants {
			if !slices.Contains(cs.Nodes, g) {
				rt.Fatalf("reboot grant to %s, not a canary, in the pass that released canary %s's slot %s", g, s.Grant.Holder, s.Name)
			}
		}
	}
	if len(grants) == 0 || in.Pool.Spec.Rollout.ZoneOrder == fleetv1.ZoneOrderAny {
		return
	}
	// A slot under way as read is released in this pass at the earliest:
	// a grant in another zone would be written beside that release.
	for _, s := range WithPhases(in.Slots) {
		h := w.nodes[s.Grant.Holder]
		if s.Kind != lease.KindReboot || s.State == SlotFree || s.Phase == PhaseFailed || h == nil || !h.InPool {
			continue
		}
		for _, g := range grants {
			if w.nodes[g].Zone != h.Zone {
				rt.Fatalf("reboot grant to %s (zone %q) while %s (zone %q) held %s as read: written beside its release", g, w.nodes[g].Zone, h.Name, h.Zone, s.Name)
			}
		}
	}
	busy := map[string][]string{}
	for _, name := range sortedKeys(w.nodes) {
		if s, ok := w.grantOf(name, lease.KindReboot); ok && s.Grant.Failure == "" && w.nodes[name].InPool {
			busy[w.nodes[name].Zone] = append(busy[w.nodes[name].Zone], name)
		}
	}
	if len(busy) > 1 {
		rt.Fatalf("zoneOrder Sequential: reboot grants %v leave reboot slots under way in %d zones: %v", grants, len(busy), busy)
	}
}

// A wave's end and the next wave's start are two passes: the pass that
// releases the last slot of zone a grants nothing, so zone b's grants are
// written after that release, never beside it (the controller writes a
// release that hands its slot on together with that grant, and other
// slots' grants in the same round); the next pass grants zone b. The same
// for the last canary and the rest of the pool.
func TestTheNextWaveStartsInThePassAfterTheLastRelease(t *testing.T) {
	for _, c := range []struct {
		name  string
		setup func(w *world)
	}{
		{"zones", func(w *world) { zones(w, "node-00=a node-01=b node-02=b") }},
		{"canary", func(w *world) { canaries(w, intstr.FromInt32(1), 0) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := wavesWorld(3)
			c.setup(w)
			w.step() // the slots
			if got := strings.Join(rebootGrants(w.step()), " "); got != "node-00" {
				t.Fatalf("first wave: reboot grants %q, want node-00 alone", got)
			}
			rebootAndReturn(t, w, "node-00")
			out := w.step()
			if r := changes(out, OpRelease, lease.KindReboot); len(r) != 1 || r[0].Node != "node-00" {
				t.Fatalf("node-00 not released: %+v", out.Changes)
			}
			if g := rebootGrants(out); len(g) != 0 || out.RequeueAfter <= 0 || out.RequeueAfter > time.Second {
				t.Fatalf("the pass that ends the wave: reboot grants %v (want none), requeue after %s (want within 1s)", g, out.RequeueAfter)
			}
			w.now = w.now.Add(time.Second)
			if got := strings.Join(rebootGrants(w.step()), " "); got != "node-01 node-02" {
				t.Fatalf("the pass after: reboot grants %q, want node-01 node-02", got)
			}
		})
	}
}
