package integration

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/metrics"
	"github.com/bootc-fleet/bootc-fleet/tests/envtest"
)

// scrape reads the coordinator's plain-HTTP /metrics at addr.
func scrape(addr string) (map[string]*dto.MetricFamily, error) {
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("GET /metrics: %s: %s", resp.Status, b)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(resp.Body)
}

// value is the value of the series of fam with exactly labels, and whether
// there is one.
func value(fams map[string]*dto.MetricFamily, fam string, labels map[string]string) (float64, bool) {
	f := fams[fam]
	if f == nil {
		return 0, false
	}
	for _, m := range f.GetMetric() {
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		if fmt.Sprint(got) != fmt.Sprint(labels) {
			continue
		}
		switch {
		case m.GetGauge() != nil:
			return m.GetGauge().GetValue(), true
		case m.GetCounter() != nil:
			return m.GetCounter().GetValue(), true
		}
		return 0, true
	}
	return 0, false
}

// monitoringFiles are the chart's rules and dashboard, by file name.
func monitoringFiles(t *testing.T) map[string]string {
	t.Helper()
	dir := filepath.Join(envtest.RepoRoot(), "packaging", "chart", "monitoring")
	files := map[string]string{}
	for _, f := range []string{"rules.yaml", "dashboard.json"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		files[f] = string(b)
	}
	return files
}

// family folds a histogram's series suffixes into its family name.
func family(n string) string {
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		n = strings.TrimSuffix(n, suffix)
	}
	return n
}

// metricNamesUsed are the coordinator metric families the chart's alert
// rules and dashboard query, with the files that query each.
func metricNamesUsed(t *testing.T) map[string][]string {
	t.Helper()
	name := regexp.MustCompile(`\bbootc_fleet_[a-z0-9_]*[a-z0-9]`)
	used := map[string][]string{}
	for f, text := range monitoringFiles(t) {
		for _, n := range name.FindAllString(text, -1) {
			if n = family(n); !slices.Contains(used[n], f) {
				used[n] = append(used[n], f)
			}
		}
	}
	if len(used) == 0 {
		t.Fatal("no metric names found in the rules and the dashboard")
	}
	return used
}

// checkGroupingLabels checks that every label the rules and the dashboard
// aggregate a served family by (`by (pool, node) (metric`) is one its
// series carry: an alert grouped by a label the coordinator does not set
// would fire without it, or not tell the pools apart.
func checkGroupingLabels(t *testing.T, fams map[string]*dto.MetricFamily) {
	t.Helper()
	by := regexp.MustCompile(`by \(([a-z_, ]+)\) \((?:[a-z_]+\()?(bootc_fleet_[a-z0-9_]*[a-z0-9])`)
	checked := 0
	for f, text := range monitoringFiles(t) {
		for _, m := range by.FindAllStringSubmatch(text, -1) {
			fam := fams[family(m[2])]
			if fam == nil || len(fam.GetMetric()) == 0 {
				continue
			}
			have := map[string]bool{"le": fam.GetType() == dto.MetricType_HISTOGRAM}
			for _, l := range fam.GetMetric()[0].GetLabel() {
				have[l.GetName()] = true
			}
			for _, l := range strings.Split(m[1], ",") {
				if l = strings.TrimSpace(l); !have[l] {
					t.Errorf("%s groups %s by %q, a label its series do not carry", f, fam.GetName(), l)
				}
			}
			checked++
		}
	}
	if checked == 0 {
		t.Error("no grouping checked")
	}
}

// checkHaltedPoolMetrics scrapes a coordinator whose pool halted on a node
// that never came back: the gauges the alerts read say so, and every metric
// the chart's rules and dashboard use is one the coordinator serves.
func checkHaltedPoolMetrics(t *testing.T, addr, pool, stuck string) {
	t.Helper()
	var fams map[string]*dto.MetricFamily
	p := func(extra ...string) map[string]string {
		l := map[string]string{"pool": pool}
		for i := 0; i+1 < len(extra); i += 2 {
			l[extra[i]] = extra[i+1]
		}
		return l
	}
	want := []struct {
		fam    string
		labels map[string]string
		value  float64
	}{
		{"bootc_fleet_coordinator_pool_halted", p(), 1},
		{"bootc_fleet_coordinator_pool_paused", p(), 0},
		{"bootc_fleet_coordinator_pool_in_window", p(), 1},
		{"bootc_fleet_coordinator_pool_nodes", p(), 3},
		{"bootc_fleet_coordinator_pool_nodes_updated", p(), 0},
		{"bootc_fleet_coordinator_pool_slots", p("kind", "reboot"), 2},
		{"bootc_fleet_coordinator_node_failed", p("node", stuck, "reason", "RebootTimeout"), 1},
		{"bootc_fleet_coordinator_leader", map[string]string{}, 1},
	}
	eventually(t, 30*time.Second, "the halted pool's gauges", func() (bool, string) {
		var err error
		if fams, err = scrape(addr); err != nil {
			return false, err.Error()
		}
		for _, w := range want {
			if v, ok := value(fams, w.fam, w.labels); !ok || v != w.value {
				return false, fmt.Sprintf("%s%v = %v (present %v), want %v", w.fam, w.labels, v, ok, w.value)
			}
		}
		return true, ""
	})
	now := float64(time.Now().Unix())
	for _, g := range []struct {
		fam    string
		labels map[string]string
	}{
		{"bootc_fleet_coordinator_node_slot_held_since_timestamp_seconds", p("node", stuck, "kind", "reboot")},
		{"bootc_fleet_coordinator_pool_last_grant_timestamp_seconds", p()},
		{"bootc_fleet_coordinator_pool_last_progress_timestamp_seconds", p()},
	} {
		if v, ok := value(fams, g.fam, g.labels); !ok || v < now-600 || v > now+5 {
			t.Errorf("%s%v = %v (present %v), want a unix time of the last minutes", g.fam, g.labels, v, ok)
		}
	}

	checkGroupingLabels(t, fams)
	registered := metrics.Names()
	var served, onlyRegistered []string
	for n, files := range metricNamesUsed(t) {
		switch {
		case fams[n] != nil:
			served = append(served, n)
		case slices.Contains(registered, n) && !slices.Contains(files, "rules.yaml"):
			// A counter or histogram of an event this rollout had
			// none of (a revoke, say): registered, no series yet.
			onlyRegistered = append(onlyRegistered, n)
		default:
			t.Errorf("%s (used in %v) is not served by the coordinator", n, files)
		}
	}
	sort.Strings(served)
	sort.Strings(onlyRegistered)
	t.Logf("metrics the chart uses, served with series: %v; registered, no series in this rollout: %v", served, onlyRegistered)
}
