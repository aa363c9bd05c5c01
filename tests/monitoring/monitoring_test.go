// Package monitoring checks what the chart ships for Prometheus and Grafana
// (packaging/chart/monitoring, packaging/chart/templates/monitoring): each
// object renders only behind its switch, the alert rules as the chart
// renders them pass `promtool check rules` and `promtool test rules`
// (testdata/rules_test.yaml: a firing and a quiet case per alert, on series
// shaped as the coordinator exports them), every alert links to its runbook
// section, and the dashboard is well formed. That the rules and the dashboard
// use only metrics the coordinator serves is checked against a real
// coordinator's /metrics in internal/coordinator/integration.
//
// Builds helm once (packaging/install-helm.sh). Runs promtool from PATH
// (Debian package prometheus); without it the promtool test skips, or fails
// when BOOTC_FLEET_REQUIRE_PROMTOOL=1.
package monitoring

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"sigs.k8s.io/yaml"

	tenv "github.com/bootc-fleet/bootc-fleet/tests/envtest"
)

var (
	root      = tenv.RepoRoot()
	chart     = filepath.Join(root, "packaging", "chart")
	helmOnce  sync.Once
	helmPath  string
	helmError error
)

// alerts are the alert names the runbook (docs/operations.md) documents.
var alerts = []string{
	"BootcFleetPoolHalted", "BootcFleetNodeFailed", "BootcFleetRolloutStalled",
	"BootcFleetAgentsQuiet", "BootcFleetNodeHeldTooLong", "BootcFleetNoLeader",
}

func helm(t *testing.T) string {
	t.Helper()
	helmOnce.Do(func() {
		out, err := exec.Command("bash", filepath.Join(root, "packaging", "install-helm.sh")).Output()
		helmPath, helmError = strings.TrimSpace(string(out)), err
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			helmError = fmt.Errorf("%w\n%s", err, ee.Stderr)
		}
	})
	if helmError != nil {
		t.Fatalf("building helm: %v", helmError)
	}
	return helmPath
}

func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("BOOTC_FLEET_REQUIRE_PROMTOOL") == "1" {
			t.Fatalf("promtool not found (Debian package prometheus): %v", err)
		}
		t.Skipf("skipping: promtool not found (Debian package prometheus): %v", err)
	}
	return p
}

type object = map[string]any

// render runs helm template on the chart with sets (key=value) and returns
// its objects.
func render(t *testing.T, sets ...string) []object {
	t.Helper()
	args := []string{"template", "bootc-fleet", chart}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	var stderr bytes.Buffer
	cmd := exec.Command(helm(t), args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	var objs []object
	for _, doc := range regexp.MustCompile(`(?m)^---$`).Split(string(out), -1) {
		var o object
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
			t.Fatalf("helm rendered YAML that does not parse: %v\n%s", err, doc)
		}
		if o != nil {
			objs = append(objs, o)
		}
	}
	return objs
}

// get walks o along path (map keys; a number indexes a list).
func get(o any, path ...string) any {
	for _, p := range path {
		switch v := o.(type) {
		case map[string]any:
			o = v[p]
		case []any:
			var i int
			if _, err := fmt.Sscan(p, &i); err != nil || i >= len(v) {
				return nil
			}
			o = v[i]
		default:
			return nil
		}
	}
	return o
}

func find(objs []object, kind, name string) object {
	for _, o := range objs {
		if get(o, "kind") == kind && get(o, "metadata", "name") == name {
			return o
		}
	}
	return nil
}

// monitoringObjects are what the three switches add, by switch.
var monitoringObjects = map[string][][2]string{
	"monitoring.serviceMonitor.enabled": {
		{"ServiceAccount", "bootc-fleet-metrics-scraper"}, {"Secret", "bootc-fleet-metrics-scraper-token"},
		{"ClusterRoleBinding", "bootc-fleet-metrics-scraper"}, {"ServiceMonitor", "bootc-fleet-coordinator"},
	},
	"monitoring.prometheusRule.enabled": {{"PrometheusRule", "bootc-fleet"}},
	"monitoring.dashboard.enabled":      {{"ConfigMap", "bootc-fleet-dashboard"}},
}

// Each switch is off by default and adds exactly its objects, in
// bootc-fleet-system (but the cluster-scoped binding).
func TestChartRendersMonitoringObjectsOnlyBehindTheirSwitches(t *testing.T) {
	base := render(t)
	for sw := range monitoringObjects {
		for _, o := range monitoringObjects[sw] {
			if find(base, o[0], o[1]) != nil {
				t.Errorf("default values render %s %s (switch %s is off)", o[0], o[1], sw)
			}
		}
	}
	for sw, want := range monitoringObjects {
		t.Run(sw, func(t *testing.T) {
			objs := render(t, sw+"=true")
			if len(objs) != len(base)+len(want) {
				t.Errorf("%d objects, want the %d of the defaults and %d more", len(objs), len(base), len(want))
			}
			for _, w := range want {
				o := find(objs, w[0], w[1])
				if o == nil {
					t.Fatalf("%s %s not rendered", w[0], w[1])
				}
				if ns := get(o, "metadata", "namespace"); w[0] != "ClusterRoleBinding" && ns != "bootc-fleet-system" {
					t.Errorf("%s %s in namespace %v", w[0], w[1], ns)
				}
			}
		})
	}
}

// The ServiceMonitor scrapes the metrics Service's HTTPS port with the
// token of a ServiceAccount bound to the metrics-reader ClusterRole.
func TestServiceMonitorScrapesTheMetricsServiceWithAReaderToken(t *testing.T) {
	objs := render(t, "monitoring.serviceMonitor.enabled=true", "monitoring.serviceMonitor.labels.release=kps")
	sm, svc := find(objs, "ServiceMonitor", "bootc-fleet-coordinator"), find(objs, "Service", "bootc-fleet-coordinator-metrics")
	if sm == nil || svc == nil {
		t.Fatalf("ServiceMonitor %v, metrics Service %v", sm != nil, svc != nil)
	}
	if get(sm, "metadata", "labels", "release") != "kps" {
		t.Errorf("serviceMonitor.labels not applied: %v", get(sm, "metadata", "labels"))
	}
	for k, v := range get(sm, "spec", "selector", "matchLabels").(map[string]any) {
		if get(svc, "metadata", "labels", k) != v {
			t.Errorf("selector %s=%v does not match the metrics Service's labels %v", k, v, get(svc, "metadata", "labels"))
		}
	}
	ep := get(sm, "spec", "endpoints", "0")
	if get(ep, "port") != get(svc, "spec", "ports", "0", "name") || get(ep, "scheme") != "https" || get(ep, "path") != "/metrics" {
		t.Errorf("endpoint %v does not scrape https /metrics on the Service's port %v", ep, get(svc, "spec", "ports", "0", "name"))
	}
	if get(ep, "authorization", "type") != "Bearer" || get(ep, "authorization", "credentials", "name") != "bootc-fleet-metrics-scraper-token" ||
		get(ep, "authorization", "credentials", "key") != "token" {
		t.Errorf("endpoint authorization %v", get(ep, "authorization"))
	}
	if get(ep, "tlsConfig", "insecureSkipVerify") != true {
		t.Errorf("tlsConfig %v: the coordinator's certificate is self-signed by default", get(ep, "tlsConfig"))
	}
	sec := find(objs, "Secret", "bootc-fleet-metrics-scraper-token")
	if get(sec, "type") != "kubernetes.io/service-account-token" ||
		get(sec, "metadata", "annotations", "kubernetes.io/service-account.name") != "bootc-fleet-metrics-scraper" {
		t.Errorf("token Secret %v", sec)
	}
	crb := find(objs, "ClusterRoleBinding", "bootc-fleet-metrics-scraper")
	if get(crb, "roleRef", "name") != "bootc-fleet-metrics-reader" || find(objs, "ClusterRole", "bootc-fleet-metrics-reader") == nil ||
		get(crb, "subjects", "0", "name") != "bootc-fleet-metrics-scraper" || get(crb, "subjects", "0", "namespace") != "bootc-fleet-system" {
		t.Errorf("binding %v does not bind the scraper to the rendered bootc-fleet-metrics-reader", crb)
	}
}

// rules renders the PrometheusRule with sets and writes its spec, a
// Prometheus rule file, to dir/rules.yaml.
func rules(t *testing.T, dir string, sets ...string) map[string]any {
	t.Helper()
	pr := find(render(t, append([]string{"monitoring.prometheusRule.enabled=true"}, sets...)...), "PrometheusRule", "bootc-fleet")
	if pr == nil {
		t.Fatal("PrometheusRule not rendered")
	}
	spec, _ := get(pr, "spec").(map[string]any)
	b, err := yaml.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return spec
}

func run(t *testing.T, dir, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, out)
	}
	t.Logf("%s %s:\n%s", filepath.Base(name), strings.Join(args, " "), out)
}

// The rule file as the chart renders it passes promtool, and each alert
// fires in its firing case and only there (testdata/rules_test.yaml).
func TestAlertRulesPassPromtool(t *testing.T) {
	pt := promtool(t)
	dir := t.TempDir()
	rules(t, dir)
	tests, err := os.ReadFile(filepath.Join("testdata", "rules_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules_test.yaml"), tests, 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, dir, pt, "check", "rules", "rules.yaml")
	run(t, dir, pt, "test", "rules", "rules_test.yaml")
	for _, a := range alerts {
		if !strings.Contains(string(tests), "alertname: "+a+"\n") {
			t.Errorf("testdata/rules_test.yaml has no case for %s", a)
		}
	}
}

// The thresholds are chart values, and rules rendered with other values
// still pass `promtool check rules`.
func TestAlertThresholdsAreChartValues(t *testing.T) {
	pt := promtool(t)
	dir := t.TempDir()
	spec := rules(t, dir, "monitoring.prometheusRule.rolloutStalledAfterSeconds=1800", "monitoring.prometheusRule.rolloutStalledFor=20m",
		"monitoring.prometheusRule.agentsQuietFor=3m", "monitoring.prometheusRule.nodeHeldTooLongSeconds=600",
		"monitoring.prometheusRule.noLeaderFor=2m", "monitoring.prometheusRule.poolHaltedFor=0s",
		"monitoring.runbookBaseURL=https://wiki.example/bootc")
	run(t, dir, pt, "check", "rules", "rules.yaml")
	got := ruleByAlert(t, spec)
	for _, c := range []struct{ alert, field, want string }{
		{"BootcFleetRolloutStalled", "expr", "> 1800)"},
		{"BootcFleetRolloutStalled", "for", "20m"},
		{"BootcFleetAgentsQuiet", "for", "3m"},
		{"BootcFleetNodeHeldTooLong", "expr", "> 600"},
		{"BootcFleetNoLeader", "for", "2m"},
		{"BootcFleetPoolHalted", "for", "0s"},
	} {
		if v, _ := got[c.alert][c.field].(string); !strings.Contains(v, c.want) {
			t.Errorf("%s %s = %q, want it to contain %q", c.alert, c.field, v, c.want)
		}
	}
	if u := get(got["BootcFleetNoLeader"], "annotations", "runbook_url"); u != "https://wiki.example/bootc#bootcfleetnoleader" {
		t.Errorf("runbook_url %v does not follow monitoring.runbookBaseURL", u)
	}
}

func ruleByAlert(t *testing.T, spec map[string]any) map[string]map[string]any {
	t.Helper()
	m := map[string]map[string]any{}
	groups, _ := get(spec, "groups").([]any)
	for _, g := range groups {
		rs, _ := get(g, "rules").([]any)
		for _, r := range rs {
			rm, _ := r.(map[string]any)
			name, _ := rm["alert"].(string)
			if _, dup := m[name]; dup {
				t.Errorf("alert %s defined twice", name)
			}
			m[name] = rm
		}
	}
	return m
}

// Every alert is one the runbook documents, with a severity, a summary and
// description that name its labels, and a runbook_url to its own section.
func TestEveryAlertLinksToItsRunbookSection(t *testing.T) {
	spec := rules(t, t.TempDir())
	got := ruleByAlert(t, spec)
	var names []string
	for n := range got {
		names = append(names, n)
	}
	slices.Sort(names)
	want := slices.Clone(alerts)
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Fatalf("alerts %v, want %v", names, want)
	}
	doc, err := os.ReadFile(filepath.Join(root, "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	byLabels := regexp.MustCompile(`by \(([a-z, ]+)\)`)
	for name, r := range got {
		if s := get(r, "labels", "severity"); s != "critical" && s != "warning" {
			t.Errorf("%s: severity %v", name, s)
		}
		url, _ := get(r, "annotations", "runbook_url").(string)
		anchor := strings.ToLower(name)
		if !strings.HasSuffix(url, "/docs/operations.md#"+anchor) {
			t.Errorf("%s: runbook_url %q, want docs/operations.md#%s", name, url, anchor)
		}
		if !regexp.MustCompile(`(?m)^#+ ` + name + `$`).Match(doc) {
			t.Errorf("docs/operations.md has no heading %q (anchor #%s)", name, anchor)
		}
		text := fmt.Sprint(get(r, "annotations", "summary"), " ", get(r, "annotations", "description"))
		if m := byLabels.FindStringSubmatch(fmt.Sprint(r["expr"])); m != nil {
			for _, l := range strings.Split(m[1], ",") {
				if l = strings.TrimSpace(l); !strings.Contains(text, "$labels."+l) {
					t.Errorf("%s: summary and description do not name label %s", name, l)
				}
			}
		}
	}
}

// The dashboard ConfigMap carries the sidecar's label (configurable) and
// the JSON file as it is in the repository; the dashboard has the panels
// the docs list, each with queries.
func TestDashboardConfigMap(t *testing.T) {
	file, err := os.ReadFile(filepath.Join(chart, "monitoring", "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	cm := find(render(t, "monitoring.dashboard.enabled=true"), "ConfigMap", "bootc-fleet-dashboard")
	if get(cm, "metadata", "labels", "grafana_dashboard") != "1" {
		t.Errorf("labels %v lack grafana_dashboard: \"1\"", get(cm, "metadata", "labels"))
	}
	if data, _ := get(cm, "data", "bootc-fleet.json").(string); data != strings.TrimRight(string(file), "\n") {
		t.Errorf("the ConfigMap's dashboard differs from monitoring/dashboard.json")
	}
	cm = find(render(t, "monitoring.dashboard.enabled=true", "monitoring.dashboard.labels.grafana_dashboard=null",
		"monitoring.dashboard.labels.dashboards=fleet", "monitoring.dashboard.annotations.grafana_folder=Fleet"), "ConfigMap", "bootc-fleet-dashboard")
	if get(cm, "metadata", "labels", "dashboards") != "fleet" || get(cm, "metadata", "labels", "grafana_dashboard") != nil ||
		get(cm, "metadata", "annotations", "grafana_folder") != "Fleet" {
		t.Errorf("dashboard labels and annotations not configurable: %v", get(cm, "metadata"))
	}

	var d struct {
		UID    string `json:"uid"`
		Panels []struct {
			ID      int    `json:"id"`
			Title   string `json:"title"`
			Targets []struct {
				Expr  string `json:"expr"`
				RefID string `json:"refId"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(file, &d); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	ids, titles := map[int]bool{}, map[string]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] || len(p.Targets) == 0 {
			t.Errorf("panel %d %q: duplicate id or no query", p.ID, p.Title)
		}
		ids[p.ID], titles[p.Title] = true, true
		for _, q := range p.Targets {
			if !strings.Contains(q.Expr, "bootc_fleet_coordinator_") || q.RefID == "" {
				t.Errorf("panel %q: query %q", p.Title, q.Expr)
			}
		}
	}
	for _, want := range []string{"Rollout progress per pool", "Slots held against the budget", "Grant latency", "Drain durations", "Failures by reason", "Revokes by reason"} {
		if !titles[want] {
			t.Errorf("dashboard has no panel %q", want)
		}
	}
}
