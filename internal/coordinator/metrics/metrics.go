// Package metrics holds the coordinator's Prometheus collectors. They are
// registered once, on controller-runtime's registry, so the manager's
// /metrics endpoint serves them next to its own.
//
// Every series carries the pool's name; ForgetPool drops them all when a
// pool is deleted, so a deleted pool's gauges do not linger.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

const namespace = "bootc_fleet_coordinator"

// Label names.
const (
	LabelPool   = "pool"
	LabelKind   = "kind"   // slot kind: stage or reboot
	LabelPhase  = "phase"  // BootcNode phase: Idle, Waiting, Staging, ...
	LabelResult = "result" // drain outcome: see Drain* below
	LabelReason = "reason" // CamelCase reason, e.g. RebootTimeout
	LabelNode   = "node"   // Node name, only on series of nodes holding a slot
)

// Values of LabelResult on DrainDuration.
const (
	DrainSucceeded = "succeeded"
	DrainTimedOut  = "timed_out"
	DrainFailed    = "failed"
)

var (
	// SlotsHeld is the number of held slot Leases by pool and kind.
	SlotsHeld = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: namespace,
		Name:      "slots_held",
		Help:      "Slot Leases currently held by a node, by pool and slot kind (stage or reboot); a stage slot whose holder is done with it (Finished, released lazily) is not counted.",
	}, []string{LabelPool, LabelKind})

	// NodesByPhase is the number of a pool's nodes in each BootcNode phase.
	NodesByPhase = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: namespace,
		Name:      "nodes",
		Help:      "Nodes of a pool by the phase their agent reports.",
	}, []string{LabelPool, LabelPhase})

	// GrantLatency is the time from a node becoming eligible for a slot to
	// its grant.
	GrantLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: namespace,
		Name:      "grant_latency_seconds",
		Help:      "Seconds from a node becoming eligible for a slot to the grant of that slot, by pool and slot kind.",
		// From an immediate grant to a node waiting hours behind a slow rollout.
		Buckets: []float64{1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400},
	}, []string{LabelPool, LabelKind})

	// DrainDuration is how long cordon-and-drain took, by outcome.
	DrainDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: namespace,
		Name:      "drain_duration_seconds",
		Help:      "Seconds a node drain took, by pool and result (succeeded, timed_out, failed).",
		// drainTimeout defaults to 10m; the top buckets catch raised timeouts.
		Buckets: []float64{1, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600},
	}, []string{LabelPool, LabelResult})

	// Failures counts nodes that failed to come back on the target image.
	Failures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace,
		Name:      "failures_total",
		Help:      "Nodes that failed during a rollout, by pool and reason (e.g. RebootTimeout).",
	}, []string{LabelPool, LabelReason})

	// Grants counts slot grants.
	Grants = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace,
		Name:      "grants_total",
		Help:      "Slot grants issued, by pool and slot kind.",
	}, []string{LabelPool, LabelKind})

	// Revokes counts grants withdrawn before they were spent.
	Revokes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace,
		Name:      "revokes_total",
		Help:      "Slot grants revoked before completion, by pool and reason (e.g. ImageChanged).",
	}, []string{LabelPool, LabelReason})

	// Conflicts counts reconciles cut short because a Lease or the pool
	// changed between the read and the write (then the pool is planned
	// again from a fresh read). A high rate means agents and the
	// coordinator write the same Leases at once.
	Conflicts = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace,
		Name:      "conflicts_total",
		Help:      "Reconciles cut short by a write conflict and planned again, by pool.",
	}, []string{LabelPool})
)

// vecs lists every collector with a pool label, for registration and
// ForgetPool.
var vecs = []interface {
	prometheus.Collector
	DeletePartialMatch(prometheus.Labels) int
}{SlotsHeld, NodesByPhase, GrantLatency, DrainDuration, Failures, Grants, Revokes, Conflicts,
	PoolNodes, PoolNodesUpdated, PoolNodesQuiet, PoolHalted, PoolPaused, PoolInWindow, PoolSlots,
	PoolLastGrant, PoolLastProgress, NodeSlotHeldSince, NodeFailed}

func init() {
	for _, v := range vecs {
		crmetrics.Registry.MustRegister(v)
	}
	crmetrics.Registry.MustRegister(Leader)
}

// ForgetPool deletes every series of pool.
func ForgetPool(pool string) {
	for _, v := range vecs {
		v.DeletePartialMatch(prometheus.Labels{LabelPool: pool})
	}
}
