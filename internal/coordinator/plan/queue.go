package plan

import (
	"sort"
	"time"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// The order in which the planner offers free slots to waiting nodes. It is
// exported so that `kubectl bootc-fleet` reports queue positions in exactly
// the order the coordinator grants them.

// LastStageFailed reports whether a BootcNode reason says the node's last
// stage failed or timed out (amendment 19), which puts it behind the others.
func LastStageFailed(reason string) bool {
	return reason == fleetv1.ReasonStageFailed || reason == fleetv1.ReasonStageTimedOut
}

// StageOrder is the order stage slots are offered in: by name, except that
// nodes whose last stage failed wait behind the others, so one node whose
// download keeps failing cannot keep a slot from the rest.
func StageOrder(names []string, lastStageFailed func(name string) bool) []string {
	q := append([]string(nil), names...)
	sort.Strings(q)
	sort.SliceStable(q, func(i, j int) bool { return !lastStageFailed(q[i]) && lastStageFailed(q[j]) })
	return q
}

// RebootOrder is the order reboot slots are offered in: by name, except that
// nodes already unavailable for other reasons (NotReady, or cordoned, while
// holding no reboot slot) come first, since moving one of them into a slot
// costs no extra budget.
func RebootOrder(names []string, unavailable func(name string) bool) []string {
	q := append([]string(nil), names...)
	sort.Strings(q)
	sort.SliceStable(q, func(i, j int) bool { return unavailable(q[i]) && !unavailable(q[j]) })
	return q
}

// Waves is what the queue order needs of the rollout's waves (amendment
// 26).
type Waves struct {
	// Canary: name is a canary and the canaries still go alone.
	Canary func(name string) bool
	// Zone is the node's zone (ZoneOf: "" for all under zoneOrder Any).
	Zone func(name string) string
	// Rolling is the zone under way (a node of it holds a reboot slot),
	// which goes before the others; HasRolling says there is one.
	Rolling    string
	HasRolling bool
}

// WaveOrder puts q in the order of the rollout's waves, keeping q's order
// within a wave (a stable sort): the canaries first, then the zone under
// way, then each zone in name order, nodes without a zone last. Both
// queues are ordered so: a node the planner will not grant yet waits
// behind those it will.
func WaveOrder(q []string, w Waves) []string {
	out := append([]string(nil), q...)
	rank := func(name string) (canary, rolling bool, zone string) {
		z := w.Zone(name)
		return w.Canary(name), w.HasRolling && z == w.Rolling, z
	}
	sort.SliceStable(out, func(i, j int) bool {
		ci, ri, zi := rank(out[i])
		cj, rj, zj := rank(out[j])
		switch {
		case ci != cj:
			return ci
		case ri != rj:
			return ri
		}
		return ZoneBefore(zi, zj)
	})
	return out
}

// ZoneBefore reports whether zone a goes before zone b: in name order, ""
// (no zone label) last.
func ZoneBefore(a, b string) bool {
	if (a == "") != (b == "") {
		return b == ""
	}
	return a < b
}

// ZoneOf is the zone a node's zone label gives it under the pool's
// zoneOrder: the label under Sequential (the default), "" under Any.
func ZoneOf(order fleetv1.ZoneOrder, label string) string {
	if order == fleetv1.ZoneOrderAny {
		return ""
	}
	return label
}

// Windows is what a pool's maintenance windows say at one instant, as the
// planner evaluates them (for `kubectl bootc-fleet`, which shows the next
// opening live).
type Windows struct {
	Configured bool      // the pool has windows
	Open       bool      // a window is open (always true without windows)
	Until      time.Time // while open: when the last open window closes
	Next       time.Time // while closed: the next opening (zero: none within 8 days)
	Err        error     // a window that cannot be read: all count as closed
}

// WindowsAt evaluates ws at now.
func WindowsAt(ws []fleetv1.MaintenanceWindow, now time.Time) Windows {
	w := evalWindows(ws, now)
	return Windows{Configured: w.configured, Open: w.open, Until: w.until, Next: w.next, Err: w.err}
}
