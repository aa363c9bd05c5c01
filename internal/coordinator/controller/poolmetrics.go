package controller

import (
	"regexp"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/meta"

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

// validReason bounds a failure reason read from a slot Lease before it
// becomes a label value: a CamelCase word, as the coordinator writes it.
var validReason = regexp.MustCompile(`^[A-Z][A-Za-z0-9]{0,62}$`)

// observePool sets the pool gauges from the status this pass computed and
// the slot Leases as read and written in it, and counts as progress more nodes updated and a new
// target (grants and releases are counted where they are written).
func (p *poolProgress) observePool(pool *fleetv1.BootcNodePool, st fleetv1.BootcNodePoolStatus, leases map[string]*coordinationv1.Lease, now time.Time) {
	name := pool.Name
	metrics.PoolNodes.WithLabelValues(name).Set(float64(st.Nodes))
	metrics.PoolNodesUpdated.WithLabelValues(name).Set(float64(st.Updated))
	metrics.PoolNodesQuiet.WithLabelValues(name).Set(float64(st.Quiet))
	metrics.PoolHalted.WithLabelValues(name).Set(metrics.Bool(meta.IsStatusConditionTrue(st.Conditions, fleetv1.PoolHalted)))
	metrics.PoolPaused.WithLabelValues(name).Set(metrics.Bool(pool.Spec.Rollout.Paused))
	w := meta.FindStatusCondition(st.Conditions, fleetv1.PoolMaintenanceWindow)
	metrics.PoolInWindow.WithLabelValues(name).Set(metrics.Bool(w == nil || w.Status == "True"))

	budget := map[lease.Kind]int{lease.KindReboot: 0, lease.KindStage: 0}
	held, failed := map[[3]string]bool{}, map[[3]string]bool{}
	for _, l := range leases {
		s, ok := plan.ParseSlot(name, l)
		if !ok {
			continue
		}
		budget[s.Kind]++
		if s.State != plan.SlotHeld {
			continue
		}
		k := [3]string{name, s.Holder, string(s.Kind)}
		held[k] = true
		metrics.NodeSlotHeldSince.WithLabelValues(k[:]...).Set(float64(s.Grant.Acquired.Unix()))
		if s.Grant.Failure != "" {
			reason := s.Grant.Failure
			if !validReason.MatchString(reason) {
				reason = "Invalid"
			}
			f := [3]string{name, s.Holder, reason}
			failed[f] = true
			metrics.NodeFailed.WithLabelValues(f[:]...).Set(1)
		}
	}
	for k, n := range budget {
		metrics.PoolSlots.WithLabelValues(name, string(k)).Set(float64(n))
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	m, seen := p.pools[name]
	if !seen {
		m = &progressMemo{}
		p.pools[name] = m
	}
	if !seen || st.Updated > m.updated || st.TargetImage != m.target {
		p.moved(name, now)
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
