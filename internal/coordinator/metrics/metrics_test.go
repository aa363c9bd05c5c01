package metrics

import (
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// record puts one observation in every collector for pool.
func record(pool string) {
	SlotsHeld.WithLabelValues(pool, "reboot").Set(2)
	NodesByPhase.WithLabelValues(pool, "Staged").Set(3)
	GrantLatency.WithLabelValues(pool, "stage").Observe(42)
	DrainDuration.WithLabelValues(pool, DrainSucceeded).Observe(7)
	Failures.WithLabelValues(pool, "RebootTimeout").Inc()
	Grants.WithLabelValues(pool, "reboot").Inc()
	Revokes.WithLabelValues(pool, "ImageChanged").Inc()
	PoolNodes.WithLabelValues(pool).Set(10)
	PoolNodesUpdated.WithLabelValues(pool).Set(4)
	PoolNodesQuiet.WithLabelValues(pool).Set(1)
	PoolHalted.WithLabelValues(pool).Set(0)
	PoolPaused.WithLabelValues(pool).Set(0)
	PoolInWindow.WithLabelValues(pool).Set(1)
	PoolSlots.WithLabelValues(pool, "reboot").Set(3)
	PoolLastGrant.WithLabelValues(pool).Set(1.7e9)
	PoolLastProgress.WithLabelValues(pool).Set(1.7e9)
	NodeSlotHeldSince.WithLabelValues(pool, "node-1", "reboot").Set(1.7e9)
	NodeFailed.WithLabelValues(pool, "node-2", "RebootTimeout").Set(1)
}

var want = []struct {
	name   string
	typ    dto.MetricType
	labels []string
	help   string // a fragment the help text must contain
}{
	{"bootc_fleet_coordinator_slots_held", dto.MetricType_GAUGE, []string{"kind", "pool"}, "Slot Leases currently held"},
	{"bootc_fleet_coordinator_nodes", dto.MetricType_GAUGE, []string{"phase", "pool"}, "by the phase"},
	{"bootc_fleet_coordinator_grant_latency_seconds", dto.MetricType_HISTOGRAM, []string{"kind", "pool"}, "eligible"},
	{"bootc_fleet_coordinator_drain_duration_seconds", dto.MetricType_HISTOGRAM, []string{"pool", "result"}, "drain took"},
	{"bootc_fleet_coordinator_failures_total", dto.MetricType_COUNTER, []string{"pool", "reason"}, "failed"},
	{"bootc_fleet_coordinator_grants_total", dto.MetricType_COUNTER, []string{"kind", "pool"}, "grants issued"},
	{"bootc_fleet_coordinator_revokes_total", dto.MetricType_COUNTER, []string{"pool", "reason"}, "revoked"},
	{"bootc_fleet_coordinator_pool_nodes", dto.MetricType_GAUGE, []string{"pool"}, "status.nodes"},
	{"bootc_fleet_coordinator_pool_nodes_updated", dto.MetricType_GAUGE, []string{"pool"}, "status.updated"},
	{"bootc_fleet_coordinator_pool_nodes_quiet", dto.MetricType_GAUGE, []string{"pool"}, "status.quiet"},
	{"bootc_fleet_coordinator_pool_halted", dto.MetricType_GAUGE, []string{"pool"}, "halted"},
	{"bootc_fleet_coordinator_pool_paused", dto.MetricType_GAUGE, []string{"pool"}, "paused"},
	{"bootc_fleet_coordinator_pool_in_window", dto.MetricType_GAUGE, []string{"pool"}, "windows"},
	{"bootc_fleet_coordinator_pool_slots", dto.MetricType_GAUGE, []string{"kind", "pool"}, "budget"},
	{"bootc_fleet_coordinator_pool_last_grant_timestamp_seconds", dto.MetricType_GAUGE, []string{"pool"}, "last slot grant"},
	{"bootc_fleet_coordinator_pool_last_progress_timestamp_seconds", dto.MetricType_GAUGE, []string{"pool"}, "progressed"},
	{"bootc_fleet_coordinator_node_slot_held_since_timestamp_seconds", dto.MetricType_GAUGE, []string{"kind", "node", "pool"}, "acquired"},
	{"bootc_fleet_coordinator_node_failed", dto.MetricType_GAUGE, []string{"node", "pool", "reason"}, "marked failed"},
}

func names() []string {
	var n []string
	for _, w := range want {
		n = append(n, w.name)
	}
	return n
}

func gather(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	fams, err := crmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		m[f.GetName()] = f
	}
	return m
}

func TestMetricsAreRegisteredWithNamesHelpAndLabels(t *testing.T) {
	record("names")
	t.Cleanup(func() { ForgetPool("names") })
	fams := gather(t)
	for _, w := range want {
		t.Run(w.name, func(t *testing.T) {
			f, ok := fams[w.name]
			if !ok {
				t.Fatalf("%s not served by controller-runtime's registry", w.name)
			}
			if f.GetType() != w.typ {
				t.Fatalf("type %v, want %v", f.GetType(), w.typ)
			}
			if !strings.Contains(f.GetHelp(), w.help) {
				t.Fatalf("help %q lacks %q", f.GetHelp(), w.help)
			}
			for _, m := range f.GetMetric() {
				var got []string
				for _, l := range m.GetLabel() {
					got = append(got, l.GetName())
				}
				if !slices.Equal(got, w.labels) {
					t.Fatalf("labels %v, want %v", got, w.labels)
				}
			}
		})
	}
}

func TestMetricsLint(t *testing.T) {
	record("lint")
	t.Cleanup(func() { ForgetPool("lint") })
	problems, err := testutil.GatherAndLint(crmetrics.Registry, names()...)
	if err != nil {
		t.Fatal(err)
	}
	if len(problems) != 0 {
		t.Fatalf("lint problems: %+v", problems)
	}
	// Lint of nothing passes: make sure every family was there to lint.
	if n, err := testutil.GatherAndCount(crmetrics.Registry, names()...); err != nil || n < len(want) {
		t.Fatalf("gathered %d series of %d families (%v)", n, len(want), err)
	}
}

func TestForgetPoolDeletesOnlyThatPool(t *testing.T) {
	record("gone")
	record("kept")
	t.Cleanup(func() { ForgetPool("kept") })
	ForgetPool("gone")

	for name, f := range gather(t) {
		if !strings.HasPrefix(name, namespace+"_") || name == namespace+"_leader" {
			continue
		}
		pools := map[string]bool{}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == LabelPool {
					pools[l.GetValue()] = true
				}
			}
		}
		if pools["gone"] {
			t.Errorf("%s still has series of the forgotten pool", name)
		}
		if !pools["kept"] {
			t.Errorf("%s lost the series of the other pool", name)
		}
	}
	if got := testutil.ToFloat64(Grants.WithLabelValues("kept", "reboot")); got != 1 {
		t.Fatalf("grants of the kept pool = %v, want 1", got)
	}
}

func TestRegisteredOnce(t *testing.T) {
	for _, v := range vecs {
		if err := crmetrics.Registry.Register(v); err == nil {
			t.Fatal("a collector registered twice without error: it was not registered at init")
		}
	}
}

func TestNamesListsEveryCollector(t *testing.T) {
	got := Names()
	for _, w := range want {
		if !slices.Contains(got, w.name) {
			t.Errorf("Names() lacks %s", w.name)
		}
	}
	if !slices.Contains(got, namespace+"_leader") || len(got) != len(want)+2 { // + conflicts_total, leader
		t.Errorf("Names() = %v", got)
	}
}
