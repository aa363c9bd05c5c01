package health

import (
	"time"

	"github.com/prometheus/common/model"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// Observed is what the gate reads of one node; the controller gathers it.
type Observed struct {
	Node string
	// Host is the BootcNode's status.host; KubeletBootID is the Node's
	// status.nodeInfo.bootID and SoftRebootCount the BootcNode's
	// status.softRebootCount: together they name the node's current boot.
	Host            *fleetv1.HostHealth
	KubeletBootID   string
	SoftRebootCount int64
	// NodeReady is the Node's Ready condition; Pods the pods bound to the
	// node that the workloads check's podSelector matches.
	NodeReady bool
	Pods      []Pod
	// Metrics is the pool's query result, or MetricsErr why there is none;
	// MetricsAt is when that answer was taken.
	Metrics    model.Vector
	MetricsErr error
	MetricsAt  time.Time
	Now        time.Time
}

// Evaluate runs every check spec configures, in Check order. A nil spec
// (no gate) gives the zero Verdict, which passes.
func Evaluate(spec *fleetv1.HealthSpec, o Observed) Verdict {
	var v Verdict
	if spec == nil {
		return v
	}
	if spec.Host != nil {
		v.Results = append(v.Results, Host(spec.Host, o.Host, o.KubeletBootID, o.SoftRebootCount))
	}
	if spec.Workloads != nil {
		v.Results = append(v.Results, Workloads(spec.Workloads, o.NodeReady, o.Pods, o.Now))
	}
	if spec.Metrics != nil {
		v.Results = append(v.Results, Metrics(spec.Metrics.NodeLabel, o.Node, o.Metrics, o.MetricsErr))
		v.MetricsAt = o.MetricsAt
	}
	return v
}
