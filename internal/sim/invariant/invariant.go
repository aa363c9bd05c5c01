// Package invariant checks the invariants I1-I5 of docs/design.md over the
// log of one whole run of a fleet. It is pure: the harness records what
// happened, in an order that respects causality, and Check says what broke.
//
// Ordering. Lease versions are ordered by the API server (resourceVersion).
// Every disruptive agent action names the lease version the agent confirmed
// right before acting (the agent's optimistic-concurrency renew), so I1 is
// checked against the exact grant the API server saw, whatever the order in
// which the harness logged things. Node cordons come from one watch of all
// Nodes and are therefore ordered among themselves; each carries the Node's
// resourceVersion, so a reboot is also checked against the cordons written
// before the grant version it names, which that watch may deliver late.
package invariant

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	"github.com/bootc-fleet/bootc-fleet/api/text"
)

// Kind is what happened.
type Kind string

const (
	// LeaseVersion is a new version of a slot Lease (from a watch).
	LeaseVersion Kind = "LeaseVersion"
	// Cordon is a Node's spec.unschedulable turning true (from a watch; RV:
	// the Node's resourceVersion that says so).
	Cordon Kind = "Cordon"
	// Uncordon is a Node's spec.unschedulable turning false (from a watch).
	Uncordon Kind = "Uncordon"
	// StageStart is bootc switch --download-only beginning.
	StageStart Kind = "StageStart"
	// StageEnd is bootc switch --download-only ending.
	StageEnd Kind = "StageEnd"
	// Apply is a run of bootc upgrade --from-downloaded.
	Apply Kind = "Apply"
	// Unlocked means that after a bootc command the node has an unlocked
	// staged deployment of Image (a shutdown would apply it). It must be
	// under a grant (stage or reboot) for that image and boot.
	Unlocked Kind = "Unlocked"
	// Reboot is the agent asking logind to reboot; Soft marks a soft reboot
	// (RebootWithFlags with SD_LOGIND_SOFT_REBOOT), which is a reboot for
	// every invariant: gated, cordoned, one per grant.
	Reboot Kind = "Reboot"
	// UnplannedReboot is the harness rebooting a node on its own (power
	// loss).
	UnplannedReboot Kind = "UnplannedReboot"
	// Boot is the node coming up in a new boot (BootID, SoftRebootCount;
	// Soft for a soft reboot, which keeps the boot ID; Image, when known,
	// the image it booted).
	Boot Kind = "Boot"
	// RollbackRun is a run of `bootc rollback` (Image: the rollback
	// deployment it queues for the next boot). It must be under a rollback
	// grant for that image and boot, in phase Reboot.
	RollbackRun Kind = "Rollback"
	// Quarantine is a pool's status.quarantine naming a new digest (Image,
	// repo@sha256) failed while spec.image was Detail; RV is the pool
	// version that says so (from a watch).
	Quarantine Kind = "Quarantine"
	// PoolImage is a pool's spec.image becoming Detail at pool version RV
	// (from the same watch as Quarantine).
	PoolImage Kind = "PoolImage"
)

// Event is one thing that happened. Fields not relevant to a kind are empty.
type Event struct {
	Seq  int64 // order in which the harness logged it
	At   time.Time
	Kind Kind
	Pool string
	Node string

	// LeaseVersion
	Lease  string
	RV     int64 // resourceVersion
	Holder string
	Slot   lease.Kind
	Phase  lease.Phase
	// Acquired (a grant) and ReleasedAt (a free reboot slot's
	// fleet.bootc.dev/released-at): on the coordinator's clock.
	Acquired, ReleasedAt time.Time

	// Actions and grants; Boot: the image booted, when the harness knows it
	Image  string // repo@sha256
	BootID string // grant: the grant's boot; action: the node's current boot; Boot: the new boot
	// SoftRebootCount completes BootID as a boot identity: a grant's
	// recorded count, the node's count when it acted, or the new boot's.
	SoftRebootCount uint32
	// CurrentBoot is the node's boot (boot ID and soft-reboot count) when it
	// acted; ContentBoot is the boot whose state the status the action was
	// based on describes. They differ only when the status was stale.
	CurrentBoot string
	ContentBoot string
	// GrantLease/GrantRV: the lease version the agent confirmed before acting.
	GrantLease string
	GrantRV    int64
	Soft       bool
	// Rollback: on a LeaseVersion, a rollback grant (purpose Rollback,
	// amendment 25); on a Reboot, the reboot enters the rollback
	// deployment `bootc rollback` queued, not a staged one.
	Rollback bool
	Detail   string
}

func (e Event) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "#%d %s %s", e.Seq, e.At.Format("15:04:05.000"), e.Kind)
	add := func(k, v string) {
		if v != "" {
			fmt.Fprintf(&b, " %s=%s", k, v)
		}
	}
	add("node", e.Node)
	add("lease", e.Lease)
	if e.RV != 0 {
		add("rv", fmt.Sprint(e.RV))
	}
	add("holder", e.Holder)
	add("phase", string(e.Phase))
	add("image", short(e.Image))
	add("boot", short(e.BootID))
	if e.SoftRebootCount != 0 {
		add("softReboots", fmt.Sprint(e.SoftRebootCount))
	}
	if e.Soft {
		add("soft", "true")
	}
	if e.Rollback {
		add("rollback", "true")
	}
	if e.ContentBoot != e.CurrentBoot {
		add("contentBoot", short(e.ContentBoot))
	}
	if e.GrantLease != "" {
		add("grant", fmt.Sprintf("%s@%d", e.GrantLease, e.GrantRV))
	}
	add("detail", e.Detail)
	return b.String()
}

// short keeps an image or boot ID readable in an event line: through 12
// characters after the last colon (a digest's), else the first 13, cut at
// a rune boundary by text.Truncate like every other cut text.
func short(s string) string {
	if at := strings.LastIndex(s, ":"); at >= 0 && len(s)-at > 12 {
		return text.Truncate(s, at+13+len(text.Ellipsis))
	}
	return text.Truncate(s, 13+len(text.Ellipsis))
}

// Pool is the budget of one pool.
type Pool struct {
	MaxUnavailable int
	MaxStaging     int
	HaltAfter      int
}

// FinalNode is a node's state at the end of the run.
type FinalNode struct {
	Pool   string
	Booted string // repo@sha256 booted
	// Target, when set, is the image this node must end on instead of its
	// pool's target: for a multi-arch index, the image of the node's
	// platform (bootc never boots, nor reports, the index itself). The
	// harness sets it from what it pushed, never from the coordinator.
	Target  string
	Phase   string
	Reason  string
	Healthy bool // the harness let it come back (not a never-returning node)
	// CannotStage: the harness made its downloads fail; it never reboots,
	// so it is no failure haltAfterFailures counts, but it must say why.
	CannotStage bool
}

// Final is the state at the end of the run.
type Final struct {
	Target map[string]string // pool -> target repo@sha256
	Halted map[string]bool   // pool -> Halted condition True
	Nodes  map[string]FinalNode
}

// Violation is one broken invariant.
type Violation struct {
	Invariant string // I1..I5
	Node      string
	Message   string
	Events    []Event // the events that show it
}

func (v Violation) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s violated on node %s: %s", v.Invariant, v.Node, v.Message)
	for _, e := range v.Events {
		fmt.Fprintf(&b, "\n    %s", e)
	}
	return b.String()
}

// Check checks I1-I6 over a run.
func Check(events []Event, pools map[string]Pool, final Final) []Violation {
	evs := append([]Event(nil), events...)
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].Seq < evs[j].Seq })
	var out []Violation
	out = append(out, checkGated(evs)...)
	out = append(out, checkBudget(evs, pools)...)
	out = append(out, checkOneRebootPerGrant(evs)...)
	out = append(out, checkConvergence(evs, pools, final)...)
	out = append(out, checkFreshness(evs)...)
	out = append(out, checkQuarantine(evs)...)
	return out
}

type leaseKey struct {
	name string
	rv   int64
}

// checkGated is I1: every stage and every reboot happened under a valid grant
// for that node, that image and that boot; a rollback (`bootc rollback` and
// the reboot into the deployment it queued) only under a rollback grant, an
// update (apply and reboot into a staged deployment) never under one.
func checkGated(evs []Event) []Violation {
	versions := map[leaseKey]Event{}
	for _, e := range evs {
		if e.Kind == LeaseVersion {
			versions[leaseKey{e.Lease, e.RV}] = e
		}
	}
	var out []Violation
	for _, e := range evs {
		var want lease.Kind
		switch e.Kind {
		case StageStart:
			want = lease.KindStage
		case Apply, Reboot, RollbackRun:
			want = lease.KindReboot
		case Unlocked:
			want = "" // either slot
		default:
			continue
		}
		g, ok := versions[leaseKey{e.GrantLease, e.GrantRV}]
		var why string
		switch {
		case e.GrantLease == "":
			why = "no grant named"
		case !ok:
			why = fmt.Sprintf("grant %s@%d never seen", e.GrantLease, e.GrantRV)
		case g.Holder != e.Node:
			why = fmt.Sprintf("grant held by %q", g.Holder)
		case want != "" && g.Slot != want:
			why = fmt.Sprintf("%s slot used for %s", g.Slot, e.Kind)
		case g.Image != e.Image:
			why = fmt.Sprintf("grant for image %s", g.Image)
		case g.BootID != e.BootID || g.SoftRebootCount != e.SoftRebootCount:
			why = fmt.Sprintf("grant issued in boot %s/%d, node in boot %s/%d", g.BootID, g.SoftRebootCount, e.BootID, e.SoftRebootCount)
		case want == lease.KindReboot && g.Phase != lease.PhaseReboot:
			why = fmt.Sprintf("reboot grant in phase %q", g.Phase)
		default:
			why = purposeMismatch(e, g)
		}
		if why != "" {
			evidence := []Event{e}
			if ok {
				evidence = append([]Event{g}, e)
			}
			out = append(out, Violation{"I1", e.Node, fmt.Sprintf("%s not gated: %s", e.Kind, why), evidence})
		}
	}
	return out
}

// checkBudget is I2: nodes of a pool cordoned by us (which covers draining
// and rebooting: an agent reboot must happen while cordoned) are at most
// maxUnavailable; nodes staging are at most maxStaging.
func checkBudget(evs []Event, pools map[string]Pool) []Violation {
	var out []Violation
	cordoned := map[string]map[string]bool{} // pool -> node
	staging := map[string]map[string]bool{}
	var window []Event // recent events, for evidence
	set := func(m map[string]map[string]bool, pool, node string, on bool) int {
		if m[pool] == nil {
			m[pool] = map[string]bool{}
		}
		if on {
			m[pool][node] = true
		} else {
			delete(m[pool], node)
		}
		return len(m[pool])
	}
	reported := map[string]bool{}
	history := cordonHistory(evs)
	for _, e := range evs {
		window = append(window, e)
		if len(window) > 12 {
			window = window[1:]
		}
		p := pools[e.Pool]
		switch e.Kind {
		case Cordon, Uncordon:
			n := set(cordoned, e.Pool, e.Node, e.Kind == Cordon)
			if n > p.MaxUnavailable && !reported["u"+e.Pool] {
				reported["u"+e.Pool] = true
				out = append(out, Violation{"I2", e.Node, fmt.Sprintf("%d nodes of pool %s cordoned at once (%s), maxUnavailable %d",
					n, e.Pool, keys(cordoned[e.Pool]), p.MaxUnavailable), append([]Event(nil), window...)})
			}
		case StageStart, StageEnd:
			n := set(staging, e.Pool, e.Node, e.Kind == StageStart)
			if n > p.MaxStaging && !reported["s"+e.Pool] {
				reported["s"+e.Pool] = true
				out = append(out, Violation{"I2", e.Node, fmt.Sprintf("%d nodes of pool %s staging at once (%s), maxStaging %d",
					n, e.Pool, keys(staging[e.Pool]), p.MaxStaging), append([]Event(nil), window...)})
			}
		case Reboot:
			if h := history[e.Node]; !cordonedAtReboot(h, e) {
				evidence := append(slices.Clone(h[max(0, len(h)-4):]), e)
				out = append(out, Violation{"I2", e.Node, "agent rebooted a node that was not cordoned", evidence})
			}
		}
	}
	return out
}

// cordonHistory is one node's Cordon and Uncordon events in the order of
// the one Node watch they came from, which is the API server's order.
func cordonHistory(evs []Event) map[string][]Event {
	out := map[string][]Event{}
	for _, e := range evs {
		if e.Kind == Cordon || e.Kind == Uncordon {
			out[e.Node] = append(out[e.Node], e)
		}
	}
	return out
}

// cordonedAtReboot says whether the node was cordoned when it rebooted.
// What the harness had received of the Node watch before the reboot is
// one prefix of the node's history; every change whose resourceVersion is
// below the grant version the agent confirmed before rebooting is another
// (it was written before that version, so before the reboot), which a
// lagging watch may not have delivered yet: the coordinator's cordon comes
// back through the watch after it wrote the advance the agent acted on.
// The longer prefix's last change is the node's state at the reboot.
func cordonedAtReboot(hist []Event, reboot Event) bool {
	received, written := 0, 0
	for i, c := range hist {
		if c.Seq < reboot.Seq {
			received = i + 1
		}
		if reboot.GrantRV > 0 && c.RV > 0 && c.RV < reboot.GrantRV {
			written = i + 1
		}
	}
	k := max(received, written)
	return k > 0 && hist[k-1].Kind == Cordon
}

// checkOneRebootPerGrant is I3: reboots of a node, soft or full, never
// exceed the reboot grants it got, and no grant is spent twice. A boot is a
// boot ID and a soft-reboot count: a soft reboot keeps the boot ID.
func checkOneRebootPerGrant(evs []Event) []Violation {
	grants := map[string]map[string]bool{} // node -> lease#transition identity (lease+boot)
	spent := map[string]Event{}            // grant identity -> the reboot that spent it
	reboots := map[string][]Event{}
	lastHolder := map[string]string{}
	var out []Violation
	for _, e := range evs {
		switch e.Kind {
		case LeaseVersion:
			// A new grant: the holder changed to a node, or the boot it was issued in changed.
			id := fmt.Sprintf("%s/%s/%d/%s/%v", e.Lease, e.BootID, e.SoftRebootCount, e.Image, e.Rollback)
			if e.Slot == lease.KindReboot && e.Holder != "" && lastHolder[e.Lease] != e.Holder+id {
				if grants[e.Holder] == nil {
					grants[e.Holder] = map[string]bool{}
				}
				grants[e.Holder][id] = true
			}
			lastHolder[e.Lease] = e.Holder + id
		case Reboot:
			reboots[e.Node] = append(reboots[e.Node], e)
			id := fmt.Sprintf("%s@boot %s/%d", e.GrantLease, e.BootID, e.SoftRebootCount)
			if first, dup := spent[id]; dup {
				out = append(out, Violation{"I3", e.Node, "one grant spent on two reboots", []Event{first, e}})
			}
			spent[id] = e
		}
	}
	for node, rs := range reboots {
		if len(rs) > len(grants[node]) {
			out = append(out, Violation{"I3", node, fmt.Sprintf("%d reboots, %d reboot grants", len(rs), len(grants[node])), rs})
		}
	}
	return out
}

// checkConvergence is I4: every healthy node ends booted on its pool's
// target (or its own, FinalNode.Target); a node that cannot is Degraded with a reason; the pool halts after
// haltAfterFailures such nodes.
func checkConvergence(evs []Event, pools map[string]Pool, final Final) []Violation {
	var out []Violation
	failures := map[string]int{}
	for _, name := range sortedKeys(final.Nodes) {
		n := final.Nodes[name]
		target := final.Target[n.Pool]
		if n.Target != "" {
			target = n.Target
		}
		switch {
		case n.Healthy && n.Booted != target:
			out = append(out, Violation{"I4", name, fmt.Sprintf("healthy node ended booted on %s, target %s (phase %s %s)", n.Booted, target, n.Phase, n.Reason), lastOf(evs, name, 8)})
		case !n.Healthy && n.Booted != target && n.CannotStage:
			if n.Reason == "" {
				out = append(out, Violation{"I4", name, fmt.Sprintf("node that cannot stage reports no reason (phase %s)", n.Phase), lastOf(evs, name, 8)})
			}
		case !n.Healthy && n.Booted != target:
			failures[n.Pool]++
		}
	}
	for pool, p := range pools {
		if p.HaltAfter > 0 && failures[pool] >= p.HaltAfter && !final.Halted[pool] {
			out = append(out, Violation{"I4", "-", fmt.Sprintf("pool %s has %d failed nodes, haltAfterFailures %d, but is not Halted", pool, failures[pool], p.HaltAfter), nil})
		}
	}
	return out
}

// checkFreshness is I5: no disruptive action used a status read in an earlier boot.
func checkFreshness(evs []Event) []Violation {
	var out []Violation
	for _, e := range evs {
		switch e.Kind {
		case StageStart, Apply, Reboot:
			if e.ContentBoot != e.CurrentBoot {
				out = append(out, Violation{"I5", e.Node, fmt.Sprintf("%s based on status from boot %s in boot %s", e.Kind, e.ContentBoot, e.CurrentBoot), []Event{e}})
			}
		}
	}
	return out
}

func lastOf(evs []Event, node string, n int) []Event {
	var out []Event
	for i := len(evs) - 1; i >= 0 && len(out) < n; i-- {
		if evs[i].Node == node || evs[i].Holder == node {
			out = append([]Event{evs[i]}, out...)
		}
	}
	return out
}

func keys(m map[string]bool) string { return strings.Join(sortedKeys(m), ",") }

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
