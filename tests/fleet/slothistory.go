package fleet

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	"github.com/bootc-fleet/bootc-fleet/internal/sim/invariant"
)

// slotHistory is every version of one pool's reboot slot Leases, from one
// watch (the API server's order), read with the protocol's codec: which
// grant each version carries, and of what purpose (update or rollback).
type slotHistory struct {
	mu       sync.Mutex
	versions []slotVersion
	err      string // the watch could not start
}

type slotVersion struct {
	Lease string
	RV    int64
	Grant lease.Grant // Holder "": free (or not a grant the codec reads)
}

// grantRecord is one reboot grant: its versions from first to released.
type grantRecord struct {
	ID       lease.ID
	Holder   string
	Image    string
	Rollback bool
	Phases   []lease.Phase
	// First and Released index the history; Released is -1 while held.
	First, Released int
}

func (g grantRecord) String() string {
	purpose := "update"
	if g.Rollback {
		purpose = "rollback"
	}
	return fmt.Sprintf("%s#%d %s %s %s %v", g.ID.Lease, g.ID.Transitions, g.Holder, purpose, short(g.Image), g.Phases)
}

func short(ref string) string {
	if i := strings.LastIndex(ref, ":"); i >= 0 && len(ref)-i > 12 {
		return ref[:i+13]
	}
	return ref
}

// watchSlots starts recording p's reboot slot Leases until ctx ends.
func watchSlots(ctx context.Context, f *Fleet, p *Pool) *slotHistory {
	h := &slotHistory{}
	c := f.Kube.CoordinationV1().Leases(lease.Namespace)
	sel := metav1.ListOptions{LabelSelector: lease.LabelPool + "=" + p.Name}
	list, err := c.List(ctx, sel)
	if err != nil {
		h.err = "listing the slot Leases: " + err.Error()
		return h
	}
	for i := range list.Items {
		h.add(&list.Items[i])
	}
	w, err := watchtools.NewRetryWatcherWithContext(ctx, list.ResourceVersion, &cache.ListWatch{
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = sel.LabelSelector
			return c.Watch(ctx, o)
		}})
	if err != nil {
		h.err = "watching the slot Leases: " + err.Error()
		return h
	}
	go func() {
		defer w.Stop()
		for ev := range w.ResultChan() {
			if l, ok := ev.Object.(*coordinationv1.Lease); ok && (ev.Type == watch.Added || ev.Type == watch.Modified) {
				h.add(l)
			}
		}
	}()
	return h
}

func (h *slotHistory) add(l *coordinationv1.Lease) {
	_, kind, _, err := lease.ParseSlotName(l.Name)
	if err != nil || kind != lease.KindReboot {
		return
	}
	rv, _ := strconv.ParseInt(l.ResourceVersion, 10, 64)
	v := slotVersion{Lease: l.Name, RV: rv}
	if g, err := lease.Parse(l); err == nil {
		v.Grant = g
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.versions = append(h.versions, v)
}

func (h *slotHistory) snapshot() []slotVersion {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]slotVersion(nil), h.versions...)
}

// grants lists the reboot grants in the order they were first seen: a new
// grant is a version whose holder, lease UID or transition count differs
// from the slot's last version.
func (h *slotHistory) grants() []grantRecord {
	var out []grantRecord
	open := map[string]int{} // lease -> index in out of the grant it holds
	for i, v := range h.snapshot() {
		k, held := open[v.Lease]
		if held && (v.Grant.Holder == "" || v.Grant.ID != out[k].ID || v.Grant.Holder != out[k].Holder) {
			out[k].Released = i
			delete(open, v.Lease)
			held = false
		}
		if v.Grant.Holder == "" {
			continue
		}
		if !held {
			open[v.Lease] = len(out)
			out = append(out, grantRecord{ID: v.Grant.ID, Holder: v.Grant.Holder, Image: v.Grant.Image.String(), Rollback: v.Grant.Rollback, First: i, Released: -1})
			k = open[v.Lease]
		}
		if ph := out[k].Phases; len(ph) == 0 || ph[len(ph)-1] != v.Grant.Phase {
			out[k].Phases = append(out[k].Phases, v.Grant.Phase)
		}
	}
	return out
}

// grantsOf lists node's reboot grants (only rollback grants with
// rollbackOnly), in order.
func (h *slotHistory) grantsOf(node string, rollbackOnly bool) []grantRecord {
	var out []grantRecord
	for _, g := range h.grants() {
		if g.Holder == node && (g.Rollback || !rollbackOnly) {
			out = append(out, g)
		}
	}
	return out
}

// holdersOf names, sorted, the nodes that got a reboot grant for image of
// that purpose.
func (h *slotHistory) holdersOf(image string, rollback bool) []string {
	set := map[string]bool{}
	for _, g := range h.grants() {
		if g.Image == image && g.Rollback == rollback {
			set[g.Holder] = true
		}
	}
	return sortedSet(set)
}

// released: every rollback grant of node was released.
func (h *slotHistory) rollbackReleased(node string) bool {
	gs := h.grantsOf(node, true)
	for _, g := range gs {
		if g.Released < 0 {
			return false
		}
	}
	return len(gs) > 0
}

// rebootsUnderGrants matches every reboot of p's nodes to the grant version
// its agent confirmed before it: a reboot grant the node held, and no grant
// spent on two reboots.
func (h *slotHistory) rebootsUnderGrants(p *Pool) []string {
	if h.err != "" {
		return []string{h.err}
	}
	byVersion := map[string]lease.ID{}
	for _, v := range h.snapshot() {
		if v.Grant.Holder != "" {
			byVersion[fmt.Sprintf("%s@%d", v.Lease, v.RV)] = v.Grant.ID
		}
	}
	holder := map[lease.ID]string{}
	for _, g := range h.grants() {
		holder[g.ID] = g.Holder
	}
	var out []string
	spent := map[lease.ID]int{}
	for _, e := range p.Events() {
		if e.Kind != invariant.Reboot {
			continue
		}
		id, ok := byVersion[fmt.Sprintf("%s@%d", e.GrantLease, e.GrantRV)]
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("node %s rebooted under %s@%d, not a reboot grant's version", e.Node, e.GrantLease, e.GrantRV))
		case holder[id] != e.Node:
			out = append(out, fmt.Sprintf("node %s rebooted under %s#%d, held by %s", e.Node, id.Lease, id.Transitions, holder[id]))
		default:
			if spent[id]++; spent[id] > 1 {
				out = append(out, fmt.Sprintf("node %s rebooted twice under grant %s#%d", e.Node, id.Lease, id.Transitions))
			}
		}
	}
	return out
}

// zoneOrder checks the grant timeline of a rollout of target: the first
// update grant (the canary's) goes alone until released, and an update
// grant to a node of zone z is given only while no node of another zone
// holds a reboot slot and every node of an earlier zone is done (its update
// grant released).
func (h *slotHistory) zoneOrder(zoneOf map[string]string, target string) []string {
	var out []string
	grants := h.grants()
	done := map[string]bool{}
	canary := -1
	for i, g := range grants {
		if g.Rollback || g.Image != target {
			continue
		}
		if canary < 0 {
			canary = i
		} else if c := grants[canary]; c.Released < 0 || c.Released > g.First {
			out = append(out, fmt.Sprintf("update grant %s before the canary's %s was released", g, c))
		}
		for _, o := range grants[:i] {
			if o.Released < 0 || o.Released > g.First {
				if zoneOf[o.Holder] != zoneOf[g.Holder] {
					out = append(out, fmt.Sprintf("update grant %s in zone %s while %s in zone %s held its slot", g, zoneOf[g.Holder], o, zoneOf[o.Holder]))
				}
			} else if !o.Rollback && o.Image == target {
				done[o.Holder] = true
			}
		}
		for node, z := range zoneOf {
			if z < zoneOf[g.Holder] && !done[node] {
				out = append(out, fmt.Sprintf("update grant %s in zone %s before node %s of zone %s was done", g, zoneOf[g.Holder], node, z))
			}
		}
	}
	sort.Strings(out)
	return out
}

func (h *slotHistory) String() string {
	var b strings.Builder
	for _, g := range h.grants() {
		fmt.Fprintf(&b, "  %s\n", g)
	}
	return b.String()
}
