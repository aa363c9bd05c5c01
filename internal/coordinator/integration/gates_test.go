package integration

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/kubectl"
	"github.com/bootc-fleet/bootc-fleet/tests/promtest"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// What a user writes in a pool's spec.health and sees when a node fails
// its gate (docs/health.md pastes these goldens): for each gate, one node
// of a two-node pool reboots into an image that breaks that gate; the
// other node is never rebooted. The real coordinator fails the gate at
// health.timeout and applies onFailure; the test waits for the outcome to
// settle and compares with testdata/gates/NAME.golden the pool's spec as
// the API server holds it, its quarantine and conditions, the Events on
// the pool and the node, and `kubectl bootc-fleet explain NODE` and
// `status POOL` run in-process against the API server (times, ages and the
// exporter's port normalized).

// gateScenario is one gate driven to fail on node POOL-n00.
type gateScenario struct {
	name string // pool name and golden file
	// health and onFailure are what the user writes.
	health    func(t *testing.T, ctx context.Context, f *fleet) *fleetv1.HealthSpec
	onFailure fleetv1.FailurePolicy
	// host plays the agent's host report (nil: healthy on every image);
	// noHostReport: the agent reports none on the bad image.
	host         func(fn *fakeNode) *fleetv1.HostHealth
	noHostReport bool
	// minReadySeconds is the pool's spec.rollout.minReadySeconds.
	minReadySeconds int32
	// rollbackFails: bootc rollback does not take; the node comes back on
	// the bad image.
	rollbackFails bool
	// outcome: what the coordinator ends in.
	outcome gateOutcome
}

type gateOutcome int

const (
	rolledBack gateOutcome = iota
	haltedHeld
	rollbackFailed
)

// hostOn reports a healthy host on every image but the bad one (v1), where
// bad describes it.
func hostOn(bad func(h *fleetv1.HostHealth)) func(fn *fakeNode) *fleetv1.HostHealth {
	return func(fn *fakeNode) *fleetv1.HostHealth {
		h := &fleetv1.HostHealth{BootID: fn.bootID(), SystemState: fleetv1.SystemRunning, BootComplete: "active",
			Units: []fleetv1.UnitState{{Name: "app-agent.service", ActiveState: "active"}, {Name: "kubelet.service", ActiveState: "active"}}}
		if fn.booted == v1 {
			bad(h)
		}
		return h
	}
}

func failedUnit(h *fleetv1.HostHealth) {
	h.SystemState, h.FailedUnits, h.FailedUnitsTotal = fleetv1.SystemDegraded, []string{"bad-image-check.service"}, 1
}

func gateScenarios() []gateScenario {
	host := func(c fleetv1.HostHealthCheck) func(*testing.T, context.Context, *fleet) *fleetv1.HealthSpec {
		return func(*testing.T, context.Context, *fleet) *fleetv1.HealthSpec {
			return &fleetv1.HealthSpec{Timeout: &metav1.Duration{Duration: 30 * time.Second}, Host: &c}
		}
	}
	return []gateScenario{
		{name: "host-failed-unit", health: host(fleetv1.HostHealthCheck{}), host: hostOn(failedUnit)},
		{name: "host-unit-inactive", health: host(fleetv1.HostHealthCheck{RequiredUnits: []string{"kubelet.service", "app-agent.service"}}),
			host: hostOn(func(h *fleetv1.HostHealth) { h.Units[0].ActiveState = "inactive" })},
		{name: "host-boot-incomplete", health: host(fleetv1.HostHealthCheck{RequireBootComplete: true, AllowDegraded: true}),
			host: hostOn(func(h *fleetv1.HostHealth) {
				h.SystemState, h.FailedUnits, h.FailedUnitsTotal = fleetv1.SystemDegraded, []string{"greenboot-healthcheck.service"}, 1
				h.BootComplete = "inactive"
			})},
		// The agent on the bad image never reports its host (it does not
		// start, or D-Bus does not answer): the gate fails at its timeout.
		{name: "host-not-reported", health: host(fleetv1.HostHealthCheck{}), noHostReport: true},
		{name: "workloads-halt", health: workloadsGate, onFailure: fleetv1.OnFailureHalt, outcome: haltedHeld},
		// An alert takes a scrape and a rule evaluation to fire, and the
		// coordinator reuses a query's answer for 15s: minReadySeconds
		// keeps the slot while it does.
		{name: "metrics-alert", health: metricsGate, minReadySeconds: 20},
		{name: "rollback-failed", health: host(fleetv1.HostHealthCheck{}), host: hostOn(failedUnit), rollbackFails: true, outcome: rollbackFailed},
	}
}

func TestWhatAUserSeesWhenAGateFails(t *testing.T) {
	startCoordinator(t, "gates", nil)
	for _, sc := range gateScenarios() {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			runGateScenario(t, sc)
		})
	}
}

func runGateScenario(t *testing.T, sc gateScenario) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := newFleet(t, sc.name, 2, v0)
	f.withRollback, f.host = true, sc.host
	if f.host == nil {
		f.host = hostOn(func(*fleetv1.HostHealth) {})
	}
	if sc.noHostReport {
		f.host = func(fn *fakeNode) *fleetv1.HostHealth {
			if fn.booted == v1 {
				return nil
			}
			return hostOn(func(*fleetv1.HostHealth) {})(fn)
		}
	}
	bad := sc.name + "-n00"
	f.nodes[bad].rollbackFails = sc.rollbackFails
	health := sc.health(t, ctx, f)
	f.run(ctx, 1)
	f.createPool(func(p *fleetv1.BootcNodePool) {
		p.Spec.Image = v1.String()
		p.Spec.Rollout.MaxUnavailable = ptr.To(intstr.FromInt32(1))
		p.Spec.Rollout.MaxStaging = ptr.To(intstr.FromInt32(1))
		p.Spec.Rollout.OnFailure = sc.onFailure
		p.Spec.Rollout.MinReadySeconds = sc.minReadySeconds
		p.Spec.Health = health
		p.Spec.Rollout.Paused = true
	})
	// Paused until both agents report: then POOL-n00, first by name, takes
	// the one stage slot first, so it is the first node granted a reboot.
	eventually(t, 60*time.Second, "both agents reporting", func() (bool, string) {
		for _, name := range []string{bad, sc.name + "-n01"} {
			var bn fleetv1.BootcNode
			if err := f.c.Get(ctx, clientKey("", name), &bn); err != nil || bn.Status.LastReportTime == nil {
				return false, name + " not reporting"
			}
		}
		return true, ""
	})
	resume := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"rollout":{"paused":false}}}`))
	if err := f.c.Patch(ctx, &fleetv1.BootcNodePool{ObjectMeta: metav1.ObjectMeta{Name: f.pool}}, resume); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pool status: %+v", f.getPool().Status)
			for _, e := range append(allEvents(t, sc.name), allEvents(t, bad)...) {
				t.Log("event: " + e)
			}
			t.Log(userView(t, context.Background(), f, bad))
		}
	})
	eventually(t, 180*time.Second, sc.name+" settled", func() (bool, string) { return gateSettled(ctx, f, bad, sc.outcome) })
	// Events are recorded in the background, after the writes they tell.
	eventually(t, 60*time.Second, sc.name+"'s Events recorded", func() (bool, string) { return gateEventsLanded(ctx, f.pool, bad, sc.outcome) })
	got := userView(t, ctx, f, bad)
	cancel()
	goldenFile(t, filepath.Join("gates", sc.name), got)
	f.assertBudgetHeld(t)
	f.mu.Lock()
	defer f.mu.Unlock()
	want := map[gateOutcome]int{rolledBack: 2, haltedHeld: 1, rollbackFailed: 2}[sc.outcome]
	if n := f.nodes[bad].reboots; n != want {
		t.Errorf("%s rebooted %d times, want %d", bad, n, want)
	}
	if n := f.nodes[sc.name+"-n01"].reboots; n != 0 {
		t.Errorf("%s-n01 rebooted %d times into a quarantined target", sc.name, n)
	}
}

// gateSettled: the pool reached the scenario's outcome on node bad and the
// coordinator's notes on the node say so.
func gateSettled(ctx context.Context, f *fleet, bad string, o gateOutcome) (bool, string) {
	p := f.getPool()
	if p.Status.Quarantine == nil {
		return false, "not quarantined yet"
	}
	var bn fleetv1.BootcNode
	if err := f.c.Get(ctx, clientKey("", bad), &bn); err != nil {
		return false, err.Error()
	}
	state := bn.Annotations[fleetv1.AnnotationRolloutState]
	halted := meta.IsStatusConditionTrue(p.Status.Conditions, fleetv1.PoolHalted)
	failure := ""
	if l := failedLease(f, bad); l != nil {
		failure = l.Annotations[lease.AnnotationFailure]
	}
	switch o {
	case rolledBack:
		n := f.node(bad)
		f.mu.Lock()
		back := n.booted == v0 && n.reboots == 2 && n.back.IsZero()
		f.mu.Unlock()
		return back && !f.holdsReboot(ctx, bad) && state == fleetv1.RolloutBlocked, "rollout state " + state
	case haltedHeld:
		return halted && failure != "" && state == "Failed", "rollout state " + state
	default:
		return halted && failure == fleetv1.ReasonRollbackFailed && state == "Failed", "failure " + failure + ", rollout state " + state
	}
}

// gateEventsLanded: every copy of the Events outcome o tells about node
// is recorded: the Warnings on the Node, its BootcNode and the pool, the
// quarantine on the pool, and a rollback's end on the Node.
func gateEventsLanded(ctx context.Context, pool, node string, o gateOutcome) (bool, string) {
	type copyOf struct{ reason, kind, name string }
	var want []copyOf
	warn := func(reasons ...string) {
		for _, r := range reasons {
			want = append(want, copyOf{r, "Node", node}, copyOf{r, "BootcNode", node}, copyOf{r, "BootcNodePool", pool})
		}
	}
	warn(fleetv1.EventHealthCheckFailed)
	want = append(want, copyOf{fleetv1.EventImageQuarantined, "BootcNodePool", pool})
	switch o {
	case rolledBack:
		warn(fleetv1.EventRollbackGranted)
		want = append(want, copyOf{fleetv1.EventRolledBack, "Node", node})
	case rollbackFailed:
		warn(fleetv1.EventRollbackGranted, fleetv1.EventRollbackFailed)
	}
	var evs eventsv1.EventList
	if err := env.Client.List(ctx, &evs); err != nil {
		return false, err.Error()
	}
	have := map[copyOf]bool{}
	for _, e := range evs.Items {
		have[copyOf{e.Reason, e.Regarding.Kind, e.Regarding.Name}] = true
	}
	for _, w := range want {
		if !have[w] {
			return false, fmt.Sprintf("no %s Event on %s/%s yet", w.reason, w.kind, w.name)
		}
	}
	return true, ""
}

// userView is what the user reads of pool f after node failed: the pool
// spec's gate, its quarantine and conditions, the Events, explain and
// status.
func userView(t *testing.T, ctx context.Context, f *fleet, node string) string {
	t.Helper()
	p := f.getPool()
	var b strings.Builder
	spec, err := yaml.Marshal(map[string]any{"spec": map[string]any{"image": p.Spec.Image, "health": p.Spec.Health,
		"rollout": map[string]any{"onFailure": p.Spec.Rollout.OnFailure, "minReadySeconds": p.Spec.Rollout.MinReadySeconds}}})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(&b, "# The pool's gate, as the API server holds it\n%s\n", spec)
	q, err := yaml.Marshal(map[string]any{"quarantine": p.Status.Quarantine})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(&b, "# status.quarantine\n%s\n# Conditions that are True, and Progressing\n", q)
	conds := append([]metav1.Condition(nil), p.Status.Conditions...)
	sort.Slice(conds, func(i, j int) bool { return conds[i].Type < conds[j].Type })
	for _, c := range conds {
		if c.Status == metav1.ConditionTrue || c.Type == fleetv1.PoolProgressing {
			fmt.Fprintf(&b, "%s=%s %s: %s\n", c.Type, c.Status, c.Reason, c.Message)
		}
	}
	fmt.Fprintf(&b, "\n# Warning Events, and those of the gate, on the pool and the node\n%s\n", gateEvents(t, ctx, f.pool, node))
	cl, err := client.NewWithWatch(env.Config, client.Options{Scheme: kubectl.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"explain", node}, {"status", f.pool}} {
		var out bytes.Buffer
		code := kubectl.Run(ctx, kubectl.Options{Out: &out, ErrOut: &out, Client: cl, Version: "test"}, args)
		fmt.Fprintf(&b, "$ kubectl bootc-fleet %s\n%s[exit %d]\n", strings.Join(args, " "), out.String(), code)
	}
	return normalize(b.String())
}

// gateEvents lists, once each, the Warning Events and those of the gate's
// reasons regarding the pool or node, in the order the story happens.
func gateEvents(t *testing.T, ctx context.Context, pool, node string) string {
	t.Helper()
	var evs eventsv1.EventList
	if err := env.Client.List(ctx, &evs); err != nil {
		t.Fatal(err)
	}
	rank := map[string]int{fleetv1.EventHealthCheckFailed: 1, fleetv1.EventImageQuarantined: 2, fleetv1.EventRollbackGranted: 3, fleetv1.EventRolledBack: 4, fleetv1.EventRollbackFailed: 5}
	seen := map[string]bool{}
	var lines []string
	for _, e := range evs.Items {
		r := e.Regarding
		onPool := r.Kind == "BootcNodePool" && r.Name == pool
		onNode := (r.Kind == "Node" || r.Kind == "BootcNode") && r.Name == node
		if !onPool && !onNode {
			continue
		}
		if e.Type != "Warning" && rank[e.Reason] == 0 {
			continue
		}
		l := fmt.Sprintf("%d %s %s %s/%s: %s", rank[e.Reason], e.Type, e.Reason, r.Kind, r.Name, e.Note)
		if !seen[l] {
			seen[l] = true
			lines = append(lines, l)
		}
	}
	sort.Strings(lines)
	for i, l := range lines {
		lines[i] = l[2:]
	}
	return strings.Join(lines, "\n") + "\n"
}

var (
	rfc3339     = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z`)
	agoAge      = regexp.MustCompile(`\([0-9hms.]+ ago\)`)
	sinceAge    = regexp.MustCompile(`(since <time>) \([0-9hmsd.]+\)`)
	heldAge     = regexp.MustCompile(`\((draining|rebooting|verifying|failed|staging) [0-9hmsd.]+\)`)
	loopback    = regexp.MustCompile(`127\.0\.0\.1:\d+`)
	eventsTable = regexp.MustCompile(`(?m)^Events:\n((?:  .*\n)+)`)
	columnGap   = regexp.MustCompile(`\s{3,}`)
	leadingAge  = regexp.MustCompile(`^[0-9hmsd.]+`)
)

// normalize replaces what changes from run to run (times, ages, the
// exporter's port) and lines the Events table up again.
func normalize(s string) string {
	s = rfc3339.ReplaceAllString(s, "<time>")
	s = agoAge.ReplaceAllString(s, "(<age> ago)")
	s = sinceAge.ReplaceAllString(s, "$1 (<age>)")
	s = heldAge.ReplaceAllString(s, "($1 <age>)")
	s = loopback.ReplaceAllString(s, "127.0.0.1:<port>")
	return eventsTable.ReplaceAllStringFunc(s, func(tbl string) string {
		var out bytes.Buffer
		out.WriteString("Events:\n")
		tw := tabwriter.NewWriter(&out, 0, 8, 3, ' ', 0)
		for i, l := range strings.Split(strings.TrimSuffix(strings.TrimPrefix(tbl, "Events:\n"), "\n"), "\n") {
			cols := columnGap.Split(strings.TrimSpace(l), 5)
			if i > 0 && len(cols) == 5 {
				cols[2] = leadingAge.ReplaceAllString(cols[2], "<age>")
			}
			fmt.Fprintf(tw, "  %s\n", strings.Join(cols, "\t"))
		}
		_ = tw.Flush()
		return out.String()
	})
}

// goldenFile compares got with testdata/name.golden (-update writes it).
func goldenFile(t *testing.T, name, got string) {
	t.Helper()
	p := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("%v (rerun with -update to write it)", err)
	}
	if got != string(want) {
		t.Errorf("what the user sees differs from %s (rerun with -update if the change is intended)\n--- got\n%s--- want\n%s", p, got, want)
	}
}

// workloadsGate: a DaemonSet's pod on each node, Ready on every image but
// the bad one (the kubelet's part, played here).
func workloadsGate(t *testing.T, ctx context.Context, f *fleet) *fleetv1.HealthSpec {
	nodes := []string{f.pool + "-n00", f.pool + "-n01"}
	pods := gateDaemonSetPods(t, ctx, f.pool+"-agent", nodes)
	go func() {
		ready := map[string]bool{}
		for ctx.Err() == nil {
			for _, n := range nodes {
				if ok := !f.bootedOn(n, v1); ok != ready[n] {
					p := pods[n]
					if err := env.Client.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
						continue
					}
					st := map[bool]corev1.ConditionStatus{true: corev1.ConditionTrue, false: corev1.ConditionFalse}[ok]
					p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: st, LastTransitionTime: metav1.Now()}}
					if env.Client.Status().Update(ctx, p) == nil {
						ready[n] = ok
					}
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	return &fleetv1.HealthSpec{Timeout: &metav1.Duration{Duration: 30 * time.Second},
		Workloads: &fleetv1.WorkloadHealthCheck{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": f.pool + "-agent"}}, MinReadySeconds: 10}}
}

const nodeBrokenRule = `groups:
  - name: test
    rules:
      - alert: NodeBroken
        expr: bootc_fleet_test_broken > 0
        labels:
          severity: critical
`

// metricsGate: a real Prometheus scrapes an exporter whose gauge is 1 for
// a node booted on the bad image, and fires NodeBroken for it.
func metricsGate(t *testing.T, ctx context.Context, f *fleet) *fleetv1.HealthSpec {
	reg := prometheus.NewRegistry()
	broken := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "bootc_fleet_test_broken", Help: "1 when the node is broken"}, []string{"node"})
	reg.MustRegister(broken)
	nodes := []string{f.pool + "-n00", f.pool + "-n01"}
	for _, n := range nodes {
		broken.WithLabelValues(n).Set(0)
	}
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(srv.Close)
	promURL := promtest.Start(t, nodeBrokenRule, strings.TrimPrefix(srv.URL, "http://"))
	go func() {
		for ctx.Err() == nil {
			for _, n := range nodes {
				v := 0.0
				if f.bootedOn(n, v1) {
					v = 1
				}
				broken.WithLabelValues(n).Set(v)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	return &fleetv1.HealthSpec{Timeout: &metav1.Duration{Duration: 30 * time.Second},
		Metrics: &fleetv1.MetricsHealthCheck{URL: promURL, Query: `ALERTS{alertstate="firing",severity="critical"}`}}
}
