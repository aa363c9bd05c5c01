// Package health evaluates a pool's health gate for one node (docs/design.md,
// amendment 24): the host check from what the node's agent reported, the
// workloads check from the pods bound to it, the metrics check from a
// Prometheus query. Evaluation is pure; the controller gathers the inputs
// and hands the planner one Verdict per node.
package health

import "time"

// Check names one check of the gate.
type Check string

// The checks of the gate, in the order they are evaluated and reported.
const (
	CheckHost      Check = "Host"
	CheckWorkloads Check = "Workloads"
	CheckMetrics   Check = "Metrics"
)

// Result is one check's outcome for one node.
type Result struct {
	Check Check
	Pass  bool
	// Reason is one of the fleetv1.ReasonHost*, ReasonWorkloadsNotReady,
	// ReasonMetrics* values when Pass is false.
	Reason string
	// Message names the unit, pod or series (bounded, for a person).
	Message string
}

// Verdict is every configured check's result for one node, in Check order.
// The zero Verdict (no checks) passes: a pool without spec.health.
type Verdict struct {
	Results []Result
	// MetricsAt is when the query answer the metrics check judged was
	// taken, on the coordinator's clock (zero: no metrics check). The
	// planner passes a node only on an answer taken since the node was
	// found back: an earlier one says nothing about its new boot.
	MetricsAt time.Time
}

// Passed reports whether every check passed.
func (v Verdict) Passed() bool {
	for _, r := range v.Results {
		if !r.Pass {
			return false
		}
	}
	return true
}

// FirstFailure is the first check that did not pass (ok false: none).
func (v Verdict) FirstFailure() (r Result, ok bool) {
	for _, r := range v.Results {
		if !r.Pass {
			return r, true
		}
	}
	return Result{}, false
}
