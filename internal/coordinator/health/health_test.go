package health

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

const (
	boot1 = "11111111-1111-4111-8111-111111111111"
	boot2 = "22222222-2222-4222-8222-222222222222"
)

func running() *fleetv1.HostHealth {
	return &fleetv1.HostHealth{BootID: boot1, SystemState: fleetv1.SystemRunning, BootComplete: "active",
		Units: []fleetv1.UnitState{{Name: "kubelet.service", ActiveState: "active"}}}
}

func TestHost(t *testing.T) {
	spec := &fleetv1.HostHealthCheck{RequireBootComplete: true, RequiredUnits: []string{"kubelet.service"}}
	with := func(f func(*fleetv1.HostHealth)) *fleetv1.HostHealth { h := running(); f(h); return h }
	manyFailed := make([]string, 16)
	for i := range manyFailed {
		manyFailed[i] = fmt.Sprintf("bad%02d.service", i)
	}
	for _, c := range []struct {
		name    string
		spec    *fleetv1.HostHealthCheck
		st      *fleetv1.HostHealth
		boot    string
		soft    int64
		reason  string // "" passes
		message string // a part of the message
	}{
		{name: "running, required unit active, boot complete: passes", st: running(), boot: boot1},
		{name: "no report is not reported", st: nil, boot: boot1, reason: fleetv1.ReasonHostNotReported, message: "status.host"},
		{name: "a report from the previous boot counts as none (I5)", st: running(), boot: boot2, reason: fleetv1.ReasonHostNotReported, message: "not in the node's current boot"},
		{name: "a report from before a soft reboot counts as none (I5)", st: running(), boot: boot1, soft: 1, reason: fleetv1.ReasonHostNotReported, message: "soft reboot 0"},
		{name: "same boot after a soft reboot passes", st: with(func(h *fleetv1.HostHealth) { h.SoftRebootCount = 1 }), boot: boot1, soft: 1},
		{name: "still starting is not running", st: with(func(h *fleetv1.HostHealth) { h.SystemState = fleetv1.SystemStarting }), boot: boot1, reason: fleetv1.ReasonHostNotRunning, message: "systemd is starting"},
		{name: "degraded names the failed units", st: with(func(h *fleetv1.HostHealth) {
			h.SystemState, h.FailedUnits, h.FailedUnitsTotal = fleetv1.SystemDegraded, []string{"app.service", "db.service"}, 2
		}), boot: boot1, reason: fleetv1.ReasonHostUnitFailed, message: "2 failed: app.service, db.service"},
		{name: "degraded passes with allowDegraded", spec: &fleetv1.HostHealthCheck{AllowDegraded: true}, st: with(func(h *fleetv1.HostHealth) {
			h.SystemState, h.FailedUnits, h.FailedUnitsTotal = fleetv1.SystemDegraded, []string{"app.service"}, 1
		}), boot: boot1},
		{name: "degraded lists at most five and counts the rest", st: with(func(h *fleetv1.HostHealth) {
			h.SystemState, h.FailedUnits, h.FailedUnitsTotal = fleetv1.SystemDegraded, manyFailed, 40
		}), boot: boot1, reason: fleetv1.ReasonHostUnitFailed, message: "bad04.service and 35 more"},
		{name: "running with failed units (read a moment apart) does not pass", st: with(func(h *fleetv1.HostHealth) {
			h.FailedUnits, h.FailedUnitsTotal = []string{"app.service"}, 1
		}), boot: boot1, reason: fleetv1.ReasonHostUnitFailed, message: "app.service"},
		{name: "a required unit not active is named with its state", st: with(func(h *fleetv1.HostHealth) { h.Units[0].ActiveState = "activating" }),
			boot: boot1, reason: fleetv1.ReasonHostUnitInactive, message: "kubelet.service (activating)"},
		{name: "a required unit not reported", st: with(func(h *fleetv1.HostHealth) { h.Units = nil }), boot: boot1, reason: fleetv1.ReasonHostUnitInactive, message: "kubelet.service (not reported)"},
		{name: "a required unit not loaded", st: with(func(h *fleetv1.HostHealth) { h.Units[0].ActiveState = "" }), boot: boot1, reason: fleetv1.ReasonHostUnitInactive, message: "not loaded"},
		{name: "boot-complete.target not reached", st: with(func(h *fleetv1.HostHealth) { h.BootComplete = "inactive" }), boot: boot1, reason: fleetv1.ReasonHostBootIncomplete, message: "inactive"},
		{name: "boot-complete.target not reached, degraded allowed: the failed check unit is named", spec: &fleetv1.HostHealthCheck{RequireBootComplete: true, AllowDegraded: true},
			st: with(func(h *fleetv1.HostHealth) {
				h.SystemState, h.FailedUnits, h.FailedUnitsTotal, h.BootComplete = fleetv1.SystemDegraded, []string{"greenboot-healthcheck.service"}, 1, "inactive"
			}), boot: boot1, reason: fleetv1.ReasonHostBootIncomplete, message: "boot-complete.target is inactive, not active; 1 failed: greenboot-healthcheck.service"},
		{name: "boot-complete.target not required", spec: &fleetv1.HostHealthCheck{}, st: with(func(h *fleetv1.HostHealth) { h.BootComplete = "" }), boot: boot1},
		{name: "nonsense: a state systemd has not", st: with(func(h *fleetv1.HostHealth) { h.SystemState = "fine" }), boot: boot1, reason: fleetv1.ReasonHostNotReported, message: "not valid: systemState"},
		{name: "nonsense: a total below the list", st: with(func(h *fleetv1.HostHealth) {
			h.SystemState, h.FailedUnits, h.FailedUnitsTotal = fleetv1.SystemDegraded, []string{"a.service", "b.service"}, 1
		}), boot: boot1, reason: fleetv1.ReasonHostNotReported, message: "failedUnitsTotal"},
		{name: "nonsense: a total above a short list", st: with(func(h *fleetv1.HostHealth) {
			h.SystemState, h.FailedUnits, h.FailedUnitsTotal = fleetv1.SystemDegraded, []string{"a.service"}, 3
		}), boot: boot1, reason: fleetv1.ReasonHostNotReported, message: "failedUnitsTotal"},
		{name: "nonsense: unsorted failed units", st: with(func(h *fleetv1.HostHealth) {
			h.SystemState, h.FailedUnits, h.FailedUnitsTotal = fleetv1.SystemDegraded, []string{"b.service", "a.service"}, 2
		}), boot: boot1, reason: fleetv1.ReasonHostNotReported, message: "sorted"},
		{name: "nonsense: a failed unit that is no unit name", st: with(func(h *fleetv1.HostHealth) {
			h.SystemState, h.FailedUnits, h.FailedUnitsTotal = fleetv1.SystemDegraded, []string{"rm -rf"}, 1
		}), boot: boot1, reason: fleetv1.ReasonHostNotReported, message: "not a unit name"},
		{name: "nonsense: a unit named twice", st: with(func(h *fleetv1.HostHealth) { h.Units = append(h.Units, h.Units[0]) }), boot: boot1, reason: fleetv1.ReasonHostNotReported, message: "named twice"},
		{name: "nonsense: a boot ID that is none", st: with(func(h *fleetv1.HostHealth) { h.BootID = "x" }), boot: "x", reason: fleetv1.ReasonHostNotReported, message: "bootID"},
		{name: "nonsense: a negative soft-reboot count", st: with(func(h *fleetv1.HostHealth) { h.SoftRebootCount = -1 }), boot: boot1, soft: -1, reason: fleetv1.ReasonHostNotReported, message: "softRebootCount"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := spec
			if c.spec != nil {
				s = c.spec
			}
			r := Host(s, c.st, c.boot, c.soft)
			check(t, r, CheckHost, c.reason, c.message)
		})
	}
}

func check(t *testing.T, r Result, want Check, reason, message string) {
	t.Helper()
	if r.Check != want {
		t.Errorf("check %q, want %q", r.Check, want)
	}
	if (reason == "") != r.Pass || r.Reason != reason {
		t.Fatalf("pass %v reason %q (%s), want reason %q", r.Pass, r.Reason, r.Message, reason)
	}
	if !strings.Contains(r.Message, message) {
		t.Errorf("message %q does not say %q", r.Message, message)
	}
	if len(r.Message) > MaxMessage {
		t.Errorf("message of %d bytes, more than %d", len(r.Message), MaxMessage)
	}
}

func TestWorkloads(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	spec := &fleetv1.WorkloadHealthCheck{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}}, MinReadySeconds: 30}
	ready := func(name string, ago time.Duration) Pod {
		return Pod{Namespace: "kube-system", Name: name, Ready: true, ReadySince: now.Add(-ago)}
	}
	many := make([]Pod, 300)
	for i := range many {
		many[i] = Pod{Namespace: "ns", Name: strings.Repeat("p", 200) + fmt.Sprint(i)}
	}
	for _, c := range []struct {
		name      string
		spec      *fleetv1.WorkloadHealthCheck
		nodeReady bool
		pods      []Pod
		reason    string
		message   string
	}{
		{name: "every pod Ready long enough passes", nodeReady: true, pods: []Pod{ready("a", time.Minute), ready("b", 30*time.Second)}},
		{name: "a node not Ready does not pass", nodeReady: false, pods: []Pod{ready("a", time.Minute)}, reason: fleetv1.ReasonWorkloadsNotReady, message: "node is not Ready"},
		{name: "a pod not Ready is named", nodeReady: true, pods: []Pod{ready("a", time.Minute), {Namespace: "kube-system", Name: "cni-xyz"}},
			reason: fleetv1.ReasonWorkloadsNotReady, message: "1 of 2 pods not Ready for 30s: kube-system/cni-xyz (not Ready)"},
		{name: "a pod Ready too briefly is named with how long", nodeReady: true, pods: []Pod{ready("a", 10*time.Second)},
			reason: fleetv1.ReasonWorkloadsNotReady, message: "kube-system/a (Ready for 10s of 30s)"},
		{name: "a kubelet clock ahead waits longer, never shorter", nodeReady: true, pods: []Pod{ready("a", -time.Hour)},
			reason: fleetv1.ReasonWorkloadsNotReady, message: "Ready for 0s of 30s"},
		{name: "Ready since an unknown time does not pass", nodeReady: true, pods: []Pod{{Namespace: "n", Name: "a", Ready: true}},
			reason: fleetv1.ReasonWorkloadsNotReady, message: "unknown"},
		{name: "minReadySeconds 0: Ready is enough", spec: &fleetv1.WorkloadHealthCheck{}, nodeReady: true, pods: []Pod{{Namespace: "n", Name: "a", Ready: true}}},
		{name: "no pod matches: passes and says so", nodeReady: true, message: "no pod"},
		{name: "many pods: bounded message", nodeReady: true, pods: many, reason: fleetv1.ReasonWorkloadsNotReady, message: "300 of 300"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := spec
			if c.spec != nil {
				s = c.spec
			}
			check(t, Workloads(s, c.nodeReady, c.pods, now), CheckWorkloads, c.reason, c.message)
		})
	}
}

func series(labels ...string) *model.Sample {
	m := model.Metric{model.MetricNameLabel: "ALERTS"}
	for i := 0; i+1 < len(labels); i += 2 {
		m[model.LabelName(labels[i])] = model.LabelValue(labels[i+1])
	}
	return &model.Sample{Metric: m, Value: 1}
}

func TestMetrics(t *testing.T) {
	v := model.Vector{
		series("alertname", "DiskFull", "node", "n1"),
		series("alertname", "CNIDown", "node", "n1"),
		series("alertname", "Other", "instance", "n2"),
		nil,
	}
	for _, c := range []struct {
		name, label, node string
		err               error
		reason, message   string
	}{
		{name: "a series naming the node fires, every one named", node: "n1", reason: fleetv1.ReasonMetricsFiring,
			message: `2 series for the node: ALERTS{alertname="CNIDown", node="n1"}, ALERTS{alertname="DiskFull", node="n1"}`},
		{name: "series naming other nodes pass", node: "n2"},
		{name: "another node label", label: "instance", node: "n2", reason: fleetv1.ReasonMetricsFiring, message: "Other"},
		{name: "an error counts as not healthy, named", node: "n3", err: errors.New("connection refused"), reason: fleetv1.ReasonMetricsQueryFailed, message: "connection refused"},
	} {
		t.Run(c.name, func(t *testing.T) {
			check(t, Metrics(c.label, c.node, v, c.err), CheckMetrics, c.reason, c.message)
		})
	}
}

func TestEvaluateRunsConfiguredChecksInOrder(t *testing.T) {
	now := time.Now()
	if v := Evaluate(nil, Observed{}); !v.Passed() || len(v.Results) != 0 {
		t.Fatalf("no gate: %+v", v)
	}
	spec := &fleetv1.HealthSpec{
		Host:      &fleetv1.HostHealthCheck{},
		Workloads: &fleetv1.WorkloadHealthCheck{},
		Metrics:   &fleetv1.MetricsHealthCheck{URL: "http://p", Query: "up"},
	}
	v := Evaluate(spec, Observed{Node: "n1", Host: running(), KubeletBootID: boot1, NodeReady: false,
		Metrics: model.Vector{series("node", "n1")}, Now: now})
	var got []Check
	for _, r := range v.Results {
		got = append(got, r.Check)
	}
	if fmt.Sprint(got) != fmt.Sprint([]Check{CheckHost, CheckWorkloads, CheckMetrics}) {
		t.Fatalf("checks %v", got)
	}
	first, ok := v.FirstFailure()
	if v.Passed() || !ok || first.Reason != fleetv1.ReasonWorkloadsNotReady {
		t.Fatalf("first failure %+v (%v)", first, ok)
	}
	v = Evaluate(&fleetv1.HealthSpec{Host: &fleetv1.HostHealthCheck{}}, Observed{Host: running(), KubeletBootID: boot1})
	if !v.Passed() || len(v.Results) != 1 {
		t.Fatalf("host only: %+v", v)
	}
}
