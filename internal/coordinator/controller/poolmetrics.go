package controller

import (
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/metrics"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/plan"
)

// poolProgress remembers, per pool, what the progress gauges compare with:
// the updated count and target of the last pass, and the per-node series
// set then (so a slot no longer held drops its series and no other).
type poolProgress struct {
	mu    sync.Mutex
	pools map[string]*progressMemo
}

type progressMemo struct {
	updated int32
	target  string
	held    map[[3]string]bool // pool, node, kind of NodeSlotHeldSince
	failed  map[[3]string]bool // pool, node, reason of NodeFailed
}

func newPoolProgress() *poolProgress { return &poolProgress{pools: map[string]*progressMemo{}} }

// moved records that pool progressed at now.
func (p *poolProgress) moved(pool string, now time.Time) {
	metrics.PoolLastProgress.WithLabelValues(pool).Set(float64(now.Unix()))
}

func (p *poolProgress) forget(pool string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.pools, pool)
}

// maxReportedFailedSeries bounds the NodeFailed series of nodes whose own
// agent reports the failure (SignatureRejected), which any number of a
// pool's nodes may do; slot-marked failures are bounded by the slot count.
const maxReportedFailedSeries = 100

// observePool sets the pool gauges from the status this pass computed, the
// slot Leases as read and written in it and the nodes it planned with, and
// counts as progress more nodes updated and a new target (grants and
// releases are counted where they are written). finished is as for
// observeMetrics.
func (p *poolProgress) observePool(pool *fleetv1.BootcNodePool, st fleetv1.BootcNodePoolStatus, leases map[string]*coordinationv1.Lease, in plan.Input, finished map[lease.ID]bool) {
	name := pool.Name
	metrics.PoolNodes.WithLabelValues(name).Set(float64(st.Nodes))
	metrics.PoolNodesUpdated.WithLabelValues(name).Set(float64(st.Updated))
	metrics.PoolNodesQuiet.WithLabelValues(name).Set(float64(st.Quiet))
	metrics.PoolHalted.WithLabelValues(name).Set(metrics.Bool(meta.IsStatusConditionTrue(st.Conditions, fleetv1.PoolHalted)))
	metrics.PoolPaused.WithLabelValues(name).Set(metrics.Bool(pool.Spec.Rollout.Paused))
	w := meta.FindStatusCondition(st.Conditions, fleetv1.PoolMaintenanceWindow)
	metrics.PoolInWindow.WithLabelValues(name).Set(metrics.Bool(w == nil || w.Status == metav1.ConditionTrue))
	held, failed := slotSeries(name, leases, finished)
	reportedFailures(name, in, failed)

	p.mu.Lock()
	defer p.mu.Unlock()
	m, seen := p.pools[name]
	if !seen {
		m = &progressMemo{}
		p.pools[name] = m
	}
	if !seen || st.Updated > m.updated || st.TargetImage != m.target {
		p.moved(name, in.Now)
	}
	m.updated, m.target = st.Updated, st.TargetImage
	for k := range m.held {
		if !held[k] {
			metrics.NodeSlotHeldSince.DeleteLabelValues(k[:]...)
		}
	}
	for k := range m.failed {
		if !failed[k] {
			metrics.NodeFailed.DeleteLabelValues(k[:]...)
		}
	}
	m.held, m.failed = held, failed
}

// slotSeries sets the slot budget, and a held-since series per held slot
// (but a finished stage slot, whose holder is done with it: amendment 31)
// and a failed series per slot marked failed; it returns the label sets of
// the last two.
func slotSeries(pool string, leases map[string]*coordinationv1.Lease, finished map[lease.ID]bool) (held, failed map[[3]string]bool) {
	budget := map[lease.Kind]int{lease.KindReboot: 0, lease.KindStage: 0}
	held, failed = map[[3]string]bool{}, map[[3]string]bool{}
	for _, l := range leases {
		s, ok := plan.ParseSlot(pool, l)
		if !ok {
			continue
		}
		budget[s.Kind]++
		if s.State != plan.SlotHeld || finished[s.Grant.ID] {
			continue
		}
		k := [3]string{pool, s.Holder, string(s.Kind)}
		held[k] = true
		metrics.NodeSlotHeldSince.WithLabelValues(k[:]...).Set(float64(s.Grant.Acquired.Unix()))
		// The codec takes only a CamelCase reason as a failure mark
		// (a slot with another is malformed, not held): a bounded label.
		if s.Grant.Failure != "" {
			f := [3]string{pool, s.Holder, s.Grant.Failure}
			failed[f] = true
			metrics.NodeFailed.WithLabelValues(f[:]...).Set(1)
		}
	}
	for k, n := range budget {
		metrics.PoolSlots.WithLabelValues(pool, string(k)).Set(float64(n))
	}
	return held, failed
}

// reportedFailures adds to failed (and sets) a series for each node of the
// pool whose agent reports, in the node's current boot, that bootc refused
// its desired image under the signature policy (amendment 14), at most
// maxReportedFailedSeries of them.
func reportedFailures(pool string, in plan.Input, failed map[[3]string]bool) {
	boot := map[string]string{}
	for _, n := range in.Nodes {
		if n.InPool {
			boot[n.Name] = n.BootID
		}
	}
	n := 0
	for _, bn := range in.BootcNodes {
		st := bn.Status
		if b, ok := boot[bn.Name]; !ok || b == "" || st.BootID != b || bn.Spec.DesiredImage == "" ||
			st.Phase != fleetv1.PhaseDegraded || st.Reason != fleetv1.ReasonSignatureRejected {
			continue
		}
		if n++; n > maxReportedFailedSeries {
			return
		}
		f := [3]string{pool, bn.Name, fleetv1.ReasonSignatureRejected}
		failed[f] = true
		metrics.NodeFailed.WithLabelValues(f[:]...).Set(1)
	}
}
