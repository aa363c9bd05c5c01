package fleet

import (
	"bytes"
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// APIRequests returns the API server's request counts so far
// (apiserver_request_total), summed by "verb resource[/subresource]" and
// sorted, most first: where a run's load on the API server came from.
func (f *Fleet) APIRequests(ctx context.Context) ([]RequestCount, error) {
	raw, err := f.Kube.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading the API server's /metrics: %w", err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("parsing the API server's /metrics: %w", err)
	}
	sums := map[string]float64{}
	if fam := families["apiserver_request_total"]; fam != nil {
		for _, m := range fam.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			key := l["verb"] + " " + l["resource"]
			if l["subresource"] != "" {
				key += "/" + l["subresource"]
			}
			sums[key] += m.GetCounter().GetValue()
		}
	}
	out := make([]RequestCount, 0, len(sums))
	for k, v := range sums {
		out = append(out, RequestCount{What: k, Count: int64(v)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Count > out[j].Count })
	return out, nil
}

// RequestCount is how many requests of one verb and resource were served.
type RequestCount struct {
	What  string
	Count int64
}

// FormatRequests renders the first n counts on one line.
func FormatRequests(cs []RequestCount, n int) string {
	parts := make([]string, 0, n)
	for i, c := range cs {
		if i == n {
			break
		}
		parts = append(parts, fmt.Sprintf("%s %d", c.What, c.Count))
	}
	return strings.Join(parts, ", ")
}

// CoordinatorCounts sums, over this process's coordinators so far, the
// pool reconciles and those cut short by a write conflict.
func CoordinatorCounts() (reconciles, conflicts int64, err error) {
	families, err := crmetrics.Registry.Gather()
	if err != nil {
		return 0, 0, err
	}
	for _, fam := range families {
		for _, m := range fam.GetMetric() {
			switch fam.GetName() {
			case "controller_runtime_reconcile_total":
				for _, l := range m.GetLabel() {
					if l.GetName() == "controller" && l.GetValue() == "bootcnodepool" {
						reconciles += int64(m.GetCounter().GetValue())
					}
				}
			case "bootc_fleet_coordinator_conflicts_total":
				conflicts += int64(m.GetCounter().GetValue())
			}
		}
	}
	return reconciles, conflicts, nil
}
