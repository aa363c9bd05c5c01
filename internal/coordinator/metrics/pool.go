package metrics

import (
	"regexp"

	"github.com/prometheus/client_golang/prometheus"
)

// The gauges below are set on every pass from the same values the pool's
// status is written from (the plan's status, the slot Leases as read), so an
// alert and `kubectl get bnp` never disagree for longer than a pass.
var (
	// PoolNodes is status.nodes: the nodes of the pool.
	PoolNodes = poolGauge("pool_nodes", "Nodes in the pool (status.nodes).")
	// PoolNodesUpdated is status.updated.
	PoolNodesUpdated = poolGauge("pool_nodes_updated", "Nodes of the pool booted on their target image (status.updated).")
	// PoolNodesQuiet is status.quiet.
	PoolNodesQuiet = poolGauge("pool_nodes_quiet", "Nodes with rollout work whose agent has not reported for a while (status.quiet; condition AgentsReporting names them).")
	// PoolHalted is 1 while the pool's Halted condition is True.
	PoolHalted = poolGauge("pool_halted", "1 while the pool is halted (condition Halted True: failures reached haltAfterFailures), else 0.")
	// PoolPaused is 1 while spec.rollout.paused is set.
	PoolPaused = poolGauge("pool_paused", "1 while spec.rollout.paused stops new grants, else 0.")
	// PoolInWindow is 1 while new reboot grants may be given by the pool's
	// maintenance windows (always, without windows).
	PoolInWindow = poolGauge("pool_in_window", "1 while the pool's maintenance windows allow new reboot grants (always without windows), else 0.")
	// PoolLastGrant is when the coordinator last granted a slot of the pool.
	PoolLastGrant = poolGauge("pool_last_grant_timestamp_seconds", "Unix time of the pool's last slot grant by this coordinator process.")
	// PoolLastProgress is when the pool last moved towards its target: a
	// grant, a release, more nodes updated, a new target (and the
	// coordinator's first sight of the pool).
	PoolLastProgress = poolGauge("pool_last_progress_timestamp_seconds",
		"Unix time the pool last progressed: a slot granted or released, more nodes updated, a new target, or this process's first sight of the pool.")

	// PoolSlots is the budget: the pool's slot Leases by kind (maxStaging
	// stage slots, maxUnavailable reboot slots), held or free.
	PoolSlots = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: namespace,
		Name:      "pool_slots",
		Help:      "Slot Leases of the pool by slot kind, held or free: the budget (maxStaging, maxUnavailable) slots_held counts against.",
	}, []string{LabelPool, LabelKind})

	// NodeSlotHeldSince has one series per held slot: at most the pool's
	// slot count, whatever the pool's size.
	NodeSlotHeldSince = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: namespace,
		Name:      "node_slot_held_since_timestamp_seconds",
		Help:      "Unix time a node's slot grant was acquired, one series per held slot (pool, node, slot kind).",
	}, []string{LabelPool, LabelNode, LabelKind})

	// NodeFailed has one series per slot marked failed (the slot stays held
	// until the node is back), at most the pool's slot count, and one per
	// node whose agent reports SignatureRejected, at most 100 a pool.
	NodeFailed = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: namespace,
		Name:      "node_failed",
		Help:      "1 for each node that failed on its target: its slot marked failed by the coordinator (e.g. RebootTimeout), or its agent reporting SignatureRejected; by pool, node and reason.",
	}, []string{LabelPool, LabelNode, LabelReason})

	// Leader is 1 in the replica that leads (and reconciles), 0 in the
	// others.
	Leader = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: namespace,
		Name:      "leader",
		Help:      "1 while this coordinator replica is the elected leader, else 0.",
	})
)

func poolGauge(name, help string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: name, Help: help}, []string{LabelPool})
}

// Bool is 1 for true, 0 for false.
func Bool(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// fqName is the name in a Desc's String form (the Desc has no getter).
var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

// Names lists the names of every metric this package registers, with or
// without series: what alert rules and dashboards may use.
func Names() []string {
	ch := make(chan *prometheus.Desc, 64)
	go func() {
		for _, v := range vecs {
			v.Describe(ch)
		}
		Leader.Describe(ch)
		close(ch)
	}()
	var names []string
	for d := range ch {
		if m := fqName.FindStringSubmatch(d.String()); m != nil {
			names = append(names, m[1])
		}
	}
	return names
}
