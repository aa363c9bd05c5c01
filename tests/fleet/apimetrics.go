package fleet

import (
	"bytes"
	"context"
	"fmt"
	"sort"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/client-go/kubernetes"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// APIRequests returns the API server's request counts so far
// (apiserver_request_total), summed by "verb resource[/subresource]" and
// sorted, most first: where a run's load on the API server came from.
func (f *Fleet) APIRequests(ctx context.Context) ([]RequestCount, error) {
	families, err := apiMetrics(ctx, f.Kube)
	if err != nil {
		return nil, err
	}
	sums := map[string]float64{}
	seconds := map[string]float64{}
	if fam := families["apiserver_request_total"]; fam != nil {
		for _, m := range fam.GetMetric() {
			sums[requestKey(m)] += m.GetCounter().GetValue()
		}
	}
	if fam := families["apiserver_request_duration_seconds"]; fam != nil {
		for _, m := range fam.GetMetric() {
			seconds[requestKey(m)] += m.GetHistogram().GetSampleSum()
		}
	}
	out := make([]RequestCount, 0, len(sums))
	for k, v := range sums {
		out = append(out, RequestCount{What: k, Count: int64(v), Seconds: seconds[k]})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Count > out[j].Count })
	return out, nil
}

// TerminatedWatchers returns, by resource, the watches the API server has
// closed because their client did not read its events in time
// (apiserver_terminated_watchers_total): each costs its client a new WATCH.
func (f *Fleet) TerminatedWatchers(ctx context.Context) (map[string]float64, error) {
	return terminatedWatchers(ctx, f.Kube)
}

func terminatedWatchers(ctx context.Context, kube kubernetes.Interface) (map[string]float64, error) {
	families, err := apiMetrics(ctx, kube)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	if fam := families["apiserver_terminated_watchers_total"]; fam != nil {
		for _, m := range fam.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "resource" {
					out[l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	return out, nil
}

// APIServerCPU is the API server's CPU time so far (process_cpu_seconds_total).
func (f *Fleet) APIServerCPU(ctx context.Context) (float64, error) { return apiServerCPU(ctx, f.Kube) }

func apiServerCPU(ctx context.Context, kube kubernetes.Interface) (float64, error) {
	families, err := apiMetrics(ctx, kube)
	if err != nil {
		return 0, err
	}
	fam := families["process_cpu_seconds_total"]
	if fam == nil || len(fam.GetMetric()) == 0 {
		return 0, fmt.Errorf("the API server exports no process_cpu_seconds_total")
	}
	return fam.GetMetric()[0].GetCounter().GetValue(), nil
}

// apiMetrics reads and parses the API server's /metrics.
func apiMetrics(ctx context.Context, kube kubernetes.Interface) (map[string]*dto.MetricFamily, error) {
	raw, err := kube.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading the API server's /metrics: %w", err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("parsing the API server's /metrics: %w", err)
	}
	return families, nil
}

// requestKey is "VERB resource[/subresource]" of one request metric.
func requestKey(m *dto.Metric) string {
	l := map[string]string{}
	for _, p := range m.GetLabel() {
		l[p.GetName()] = p.GetValue()
	}
	key := l["verb"] + " " + l["resource"]
	if l["subresource"] != "" {
		key += "/" + l["subresource"]
	}
	return key
}

// Since returns the requests served between before and cs.
func Since(before, cs []RequestCount) []RequestCount {
	prev := map[string]RequestCount{}
	for _, c := range before {
		prev[c.What] = c
	}
	var out []RequestCount
	for _, c := range cs {
		d := RequestCount{What: c.What, Count: c.Count - prev[c.What].Count, Seconds: c.Seconds - prev[c.What].Seconds}
		if d.Count > 0 {
			out = append(out, d)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Count > out[j].Count })
	return out
}

// PerNode renders writes (and, separately, every request) per node update,
// with the mean server-side latency of each kind.
func PerNode(cs []RequestCount, nodes int) string {
	var writes, all float64
	var parts []string
	for _, c := range cs {
		per := float64(c.Count) / float64(nodes)
		all += per
		verb := strings.SplitN(c.What, " ", 2)[0]
		if verb == "POST" || verb == "PUT" || verb == "PATCH" || verb == "DELETE" || verb == "APPLY" {
			writes += per
		}
		if per >= 0.05 {
			parts = append(parts, fmt.Sprintf("%s %.2f (%.1f ms)", c.What, per, 1000*c.Seconds/float64(c.Count)))
		}
	}
	return fmt.Sprintf("%.1f writes and %.1f requests per node update: %s", writes, all, strings.Join(parts, ", "))
}

// RequestCount is how many requests of one verb and resource were served.
type RequestCount struct {
	What  string
	Count int64
	// Seconds is the server-side time these requests took, summed.
	Seconds float64
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
