package health

import (
	"fmt"
	"sort"

	"github.com/prometheus/common/model"

	"github.com/bootc-fleet/bootc-fleet/api/text"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// DefaultNodeLabel is the series label that names a node when the pool's
// metrics check names none.
const DefaultNodeLabel = "node"

// maxSeriesText bounds how much of one series a message shows.
const maxSeriesText = 256

// Metrics evaluates the metrics check for node from the pool's query
// result v (or the error that query ended in): no series whose nodeLabel
// is node passes.
func Metrics(nodeLabel, node string, v model.Vector, err error) Result {
	r := Result{Check: CheckMetrics}
	if err != nil {
		r.Reason, r.Message = fleetv1.ReasonMetricsQueryFailed, text.Truncate(err.Error(), MaxMessage)
		return r
	}
	if msg, firing := Firing(nodeLabel, v)[node]; firing {
		r.Reason, r.Message = fleetv1.ReasonMetricsFiring, msg
		return r
	}
	r.Pass = true
	return r
}

// Firing names, by node, the series of v whose nodeLabel names that node
// (a bounded message per node); series without the label name no node.
func Firing(nodeLabel string, v model.Vector) map[string]string {
	if nodeLabel == "" {
		nodeLabel = DefaultNodeLabel
	}
	series := map[string][]string{}
	for _, s := range v {
		if s == nil {
			continue
		}
		node := string(s.Metric[model.LabelName(nodeLabel)])
		if node == "" {
			continue
		}
		series[node] = append(series[node], text.Truncate(s.Metric.String(), maxSeriesText))
	}
	out := make(map[string]string, len(series))
	for node, ss := range series {
		sort.Strings(ss)
		out[node] = text.Truncate(fmt.Sprintf("the query returned %d series for the node: %s", len(ss), listed(ss, len(ss))), MaxMessage)
	}
	return out
}
