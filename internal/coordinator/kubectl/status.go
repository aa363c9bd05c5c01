package kubectl

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	"github.com/bootc-fleet/bootc-fleet/api/text"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/plan"
)

// StatusReport is `status [POOL] -o json|yaml`.
type StatusReport struct {
	Time  metav1.Time  `json:"time"` // when it was read
	Pools []PoolReport `json:"pools"`
	// Nodes are the nodes of POOL (only with a POOL argument), by name.
	Nodes []NodeReport `json:"nodes,omitempty"`
	// settled: every pool is up to date on its current target, or halted.
	settled bool
}

// PoolReport is one pool.
type PoolReport struct {
	Name        string `json:"name"`
	Image       string `json:"image"`
	TargetImage string `json:"targetImage,omitempty"`
	Nodes       int32  `json:"nodes"`
	Updated     int32  `json:"updated"`
	Held        int32  `json:"held"`
	Paused      bool   `json:"paused"`
	// RebootSlots: held against maxUnavailable; StageSlots: against maxStaging.
	RebootSlots SlotUse `json:"rebootSlots"`
	StageSlots  SlotUse `json:"stageSlots"`
	// Blocked is what keeps the pool from granting, from its spec and
	// conditions; Warnings are what an operator should fix but that blocks
	// nothing.
	Blocked  []Blocker `json:"blocked,omitempty"`
	Warnings []Blocker `json:"warnings,omitempty"`
}

// SlotUse is how much of one budget is held.
type SlotUse struct {
	Held    int          `json:"held"`
	Max     int          `json:"max"`
	Holders []SlotHolder `json:"holders,omitempty"`
	// Finished (stage slots): held by nodes done with them, counted in
	// neither Held nor against Max; the next stage grant hands each on
	// (amendment 31).
	Finished int `json:"finished,omitempty"`
}

// Blocker is one thing that blocks (or warns about) a pool.
type Blocker struct {
	// Type: Paused, Halted, Degraded, MaintenanceWindow or
	// NodeSelectorRestricted.
	Type    string `json:"type"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// NextWindow: for a closed MaintenanceWindow, when the next opens.
	NextWindow *metav1.Time `json:"nextWindow,omitempty"`
}

// Status reads the status of every pool, or of pool and its nodes.
func Status(ctx context.Context, c client.Client, pool string, now time.Time) (*StatusReport, error) {
	return (&reader{c: c, now: now.UTC()}).status(ctx, pool)
}

func (r *reader) status(ctx context.Context, pool string) (*StatusReport, error) {
	if pool != "" {
		v, err := r.poolWithNodes(ctx, pool)
		if err != nil {
			return nil, err
		}
		return v.report(), nil
	}
	rep := &StatusReport{Time: metav1.Time{Time: r.now}, Pools: []PoolReport{}}
	pools, err := r.pools(ctx)
	if err != nil {
		return nil, err
	}
	leases, err := r.slotLeases(ctx)
	if err != nil {
		return nil, err
	}
	rep.settled = len(pools) > 0
	for i := range pools {
		rep.Pools = append(rep.Pools, r.view(&pools[i], leases[pools[i].Name]).poolReport())
		rep.settled = rep.settled && settled(&pools[i])
	}
	return rep, nil
}

// report is `status POOL` of the view.
func (v *poolView) report() *StatusReport {
	rep := &StatusReport{Time: metav1.Time{Time: v.now}, Pools: []PoolReport{v.poolReport()}, settled: settled(v.pool)}
	for _, name := range v.members {
		rep.Nodes = append(rep.Nodes, v.nodeReport(name))
	}
	return rep
}

// PoolRead is one pool read once: the objects and the report composed
// from them, so that a caller showing both shows one moment.
type PoolRead struct {
	Report     *StatusReport
	Pool       *fleetv1.BootcNodePool
	Nodes      map[string]*corev1.Node // the pool's members by name
	BootcNodes map[string]*fleetv1.BootcNode
	Leases     []coordinationv1.Lease // the pool's slot Leases
}

// ReadPool reads pool, its members and its slots once, and composes
// `status POOL` from them.
func ReadPool(ctx context.Context, c client.Client, pool string, now time.Time) (*PoolRead, error) {
	v, err := (&reader{c: c, now: now.UTC()}).poolWithNodes(ctx, pool)
	if err != nil {
		return nil, err
	}
	return &PoolRead{Report: v.report(), Pool: v.pool, Nodes: v.nodes, BootcNodes: v.bns, Leases: v.leases}, nil
}

// poolWithNodes reads pool, its members, then its slots: in this order, so
// that the slots are never older than the coordinator's notes on the
// members (see current).
func (r *reader) poolWithNodes(ctx context.Context, pool string) (*poolView, error) {
	p, err := r.pool(ctx, pool)
	if err != nil {
		return nil, err
	}
	v := r.newView(p)
	if err := r.withNodes(ctx, v); err != nil {
		return nil, err
	}
	leases, err := r.slotLeases(ctx)
	if err != nil {
		return nil, err
	}
	v.setSlots(leases[p.Name])
	return v, nil
}

func (v *poolView) poolReport() PoolReport {
	p := v.pool
	pr := PoolReport{
		Name: p.Name, Image: p.Spec.Image, TargetImage: p.Status.TargetImage,
		Nodes: p.Status.Nodes, Updated: p.Status.Updated, Held: p.Status.Held, Paused: p.Spec.Rollout.Paused,
		RebootSlots: SlotUse{Max: v.budget.MaxUnavailable, Holders: v.holders(lease.KindReboot)},
		StageSlots:  SlotUse{Max: v.budget.MaxStaging, Holders: v.holders(lease.KindStage)},
	}
	pr.RebootSlots.Held, pr.StageSlots.Held = len(pr.RebootSlots.Holders), len(pr.StageSlots.Holders)
	pr.StageSlots.Finished = v.finished()
	if p.Spec.Rollout.Paused {
		pr.Blocked = append(pr.Blocked, Blocker{Type: "Paused", Message: "spec.rollout.paused is true: no new grants"})
	}
	for _, t := range []string{fleetv1.PoolHalted, fleetv1.PoolDegraded} {
		if c := meta.FindStatusCondition(p.Status.Conditions, t); c != nil && c.Status == metav1.ConditionTrue {
			pr.Blocked = append(pr.Blocked, Blocker{Type: t, Reason: c.Reason, Message: c.Message})
		}
	}
	// Windows are evaluated live, as the coordinator does, so the next
	// opening is exact even between the coordinator's status writes.
	if w := plan.WindowsAt(p.Spec.Rollout.Windows, v.now); w.Err != nil {
		pr.Blocked = append(pr.Blocked, Blocker{Type: fleetv1.PoolMaintenanceWindow, Reason: fleetv1.ReasonInvalidWindow, Message: w.Err.Error()})
	} else if w.Configured && !w.Open {
		b := Blocker{Type: fleetv1.PoolMaintenanceWindow, Reason: fleetv1.ReasonWindowClosed, Message: "outside the maintenance windows; none opens in the next 8 days"}
		if !w.Next.IsZero() {
			b.NextWindow = &metav1.Time{Time: w.Next.UTC()}
			b.Message = fmt.Sprintf("outside the maintenance windows; the next opens at %s (in %s)", w.Next.UTC().Format(time.RFC3339), age(w.Next.Sub(v.now)))
		}
		pr.Blocked = append(pr.Blocked, b)
	}
	// A node holding staging capacity without a grant (amendment 20): the
	// coordinator's condition names it.
	if c := meta.FindStatusCondition(p.Status.Conditions, fleetv1.PoolAgentsReporting); c != nil && c.Status == metav1.ConditionFalse && c.Reason == fleetv1.ReasonStagingWithoutGrant {
		pr.Warnings = append(pr.Warnings, Blocker{Type: fleetv1.PoolAgentsReporting, Reason: c.Reason, Message: c.Message})
	}
	if c := meta.FindStatusCondition(p.Status.Conditions, fleetv1.PoolNodeSelectorRestricted); c != nil && c.Status == metav1.ConditionFalse {
		pr.Warnings = append(pr.Warnings, Blocker{Type: fleetv1.PoolNodeSelectorRestricted, Reason: c.Reason, Message: c.Message})
	}
	return pr
}

// WriteStatus prints r as tables, as kubectl prints them.
func WriteStatus(w io.Writer, r *StatusReport) { writeStatus(w, r) }

func writeStatus(w io.Writer, r *StatusReport) {
	if len(r.Pools) == 0 {
		fmt.Fprintln(w, "No BootcNodePools found.")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	fmt.Fprintln(tw, "NAME\tTARGET\tPROGRESS\tREBOOT SLOTS\tSTAGE SLOTS\tHELD\tBLOCKED")
	for _, p := range r.Pools {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%d\t%d/%d\t%d\t%s\n", p.Name, shortDigest(p.TargetImage), bar(p.Updated, p.Nodes),
			p.RebootSlots.Held, p.RebootSlots.Max, p.StageSlots.Held, p.StageSlots.Max, p.Held, blockedText(p, r.Time.Time))
	}
	_ = tw.Flush()
	if len(r.Pools) != 1 || r.Nodes == nil {
		return
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	// The wave column only for a pool with zones or canaries (amendment 26).
	waves := false
	for _, n := range r.Nodes {
		waves = waves || n.Zone != "" || n.Canary
	}
	if !waves {
		fmt.Fprintln(tw, "NODE\tROLLOUT\tWHY")
	} else {
		fmt.Fprintln(tw, "NODE\tWAVE\tROLLOUT\tWHY")
	}
	for _, n := range r.Nodes {
		if waves {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", n.Name, waveColumn(n), orNone(n.State), orNone(n.Reason))
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", n.Name, orNone(n.State), orNone(n.Reason))
	}
	_ = tw.Flush()
}

func blockedText(p PoolReport, now time.Time) string {
	var parts []string
	for _, b := range p.Blocked {
		switch {
		case b.Type == "Paused":
			parts = append(parts, "Paused")
		case b.Type == fleetv1.PoolMaintenanceWindow && b.NextWindow != nil:
			parts = append(parts, fmt.Sprintf("window closed, next opens %s (in %s)", b.NextWindow.UTC().Format(time.RFC3339), age(b.NextWindow.Sub(now))))
		case b.Type == fleetv1.PoolMaintenanceWindow:
			parts = append(parts, "window "+strings.TrimPrefix(b.Reason, "Window")+": "+b.Message)
		default:
			parts = append(parts, b.Type+" ("+b.Reason+")")
		}
	}
	for _, b := range p.Warnings {
		parts = append(parts, "warning: "+b.Type+" ("+b.Reason+")")
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, "; ")
}

// bar is a text progress bar of updated of nodes: [####------] 4/10.
func bar(updated, nodes int32) string {
	const width = 10
	filled := 0
	if nodes > 0 {
		filled = int(updated) * width / int(nodes)
	}
	filled = min(max(filled, 0), width)
	return "[" + strings.Repeat("#", filled) + strings.Repeat("-", width-filled) + fmt.Sprintf("] %d/%d", updated, nodes)
}

// shortDigest is the first 12 hex digits of a pinned image's digest.
func shortDigest(ref string) string {
	if ref == "" {
		return "<none>"
	}
	if at := strings.LastIndex(ref, "@sha256:"); at >= 0 {
		// A table column: the short digest without its ellipsis.
		return strings.TrimSuffix(text.ShortDigest(ref[at+1:]), text.Ellipsis)
	}
	return ref
}

func orNone(s string) string {
	if s == "" {
		return "<none>"
	}
	return s
}

// waveColumn is a node's wave: canary and its zone.
func waveColumn(n NodeReport) string {
	var parts []string
	if n.Canary {
		parts = append(parts, "canary")
	}
	if n.Zone != "" {
		parts = append(parts, n.Zone)
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}
