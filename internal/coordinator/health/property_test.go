package health

import (
	"testing"
	"time"
	"unicode/utf8"

	"pgregory.net/rapid"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// TestHostProperties: for any host report (rapid prints the seed of a
// failure), the host check passes only for a report of the node's current
// boot with a running manager (or degraded, allowed), every required unit
// active, and boot-complete.target active when required; a failure always
// has a reason and a bounded, valid UTF-8 message.
func TestHostProperties(t *testing.T) {
	units := []string{"a.service", "b.service", "kubelet.service", "x\xffy.service", "bad name", ""}
	states := []string{"active", "failed", "inactive", "activating", "", "ACTIVE"}
	boots := []string{boot1, boot2, "not-a-boot"}
	passed := 0
	defer func() {
		if passed == 0 && !t.Failed() {
			t.Error("no generated report passed: the property checked only failures")
		}
	}()
	rapid.Check(t, func(t *rapid.T) {
		spec := &fleetv1.HostHealthCheck{
			RequireBootComplete: rapid.Bool().Draw(t, "requireBootComplete"),
			AllowDegraded:       rapid.Bool().Draw(t, "allowDegraded"),
			RequiredUnits:       rapid.SliceOfNDistinct(rapid.SampledFrom(units[:3]), 0, 3, rapid.ID[string]).Draw(t, "required"),
		}
		kubelet := rapid.SampledFrom(boots[:2]).Draw(t, "kubelet")
		soft := rapid.Int64Range(0, 1).Draw(t, "currentSoft")
		var st *fleetv1.HostHealth
		if rapid.IntRange(0, 9).Draw(t, "reported") > 0 {
			st = &fleetv1.HostHealth{
				BootID:           rapid.SampledFrom(boots).Draw(t, "bootID"),
				SoftRebootCount:  rapid.Int64Range(-1, 2).Draw(t, "soft"),
				SystemState:      fleetv1.SystemState(rapid.SampledFrom([]string{"running", "degraded", "starting", "offline", "bogus"}).Draw(t, "state")),
				FailedUnits:      rapid.SliceOfN(rapid.SampledFrom(units), 0, 20).Draw(t, "failed"),
				FailedUnitsTotal: rapid.Int32Range(-1, 40).Draw(t, "total"),
				BootComplete:     rapid.SampledFrom(states).Draw(t, "bootComplete"),
			}
			for i, n := range rapid.SliceOfN(rapid.SampledFrom(units), 0, 20).Draw(t, "units") {
				st.Units = append(st.Units, fleetv1.UnitState{Name: n, ActiveState: states[i%len(states)]})
			}
			if rapid.IntRange(0, 2).Draw(t, "wellFormed") > 0 {
				// What an agent writes, mostly in the current boot: no failed
				// unit, the required units reported once.
				st.FailedUnits, st.FailedUnitsTotal, st.Units = nil, 0, nil
				st.SystemState = fleetv1.SystemState(rapid.SampledFrom([]string{"running", "running", "running", "degraded"}).Draw(t, "wellFormedState"))
				st.BootComplete = rapid.SampledFrom(states[:2]).Draw(t, "wellFormedBootComplete")
				if rapid.IntRange(0, 3).Draw(t, "otherBoot") > 0 {
					st.BootID, st.SoftRebootCount = kubelet, soft
				}
				for _, n := range units[:3] {
					st.Units = append(st.Units, fleetv1.UnitState{Name: n, ActiveState: rapid.SampledFrom([]string{"active", "active", "active", "failed"}).Draw(t, "unitState")})
				}
			}
		}
		r := Host(spec, st, kubelet, soft)
		if r.Pass {
			passed++
		}
		if !r.Pass {
			if r.Reason == "" || r.Message == "" || len(r.Message) > MaxMessage || !utf8.ValidString(r.Message) {
				t.Fatalf("failure without a bounded reason and message: %+v", r)
			}
			return
		}
		if st == nil || st.BootID != kubelet || st.SoftRebootCount != soft {
			t.Fatalf("passed a report of another boot: %+v", st)
		}
		if st.SystemState != fleetv1.SystemRunning && (st.SystemState != fleetv1.SystemDegraded || !spec.AllowDegraded) {
			t.Fatalf("passed with systemd %s", st.SystemState)
		}
		if spec.RequireBootComplete && st.BootComplete != "active" {
			t.Fatalf("passed with boot-complete.target %q", st.BootComplete)
		}
		for _, u := range spec.RequiredUnits {
			ok := false
			for _, s := range st.Units {
				ok = ok || (s.Name == u && s.ActiveState == "active")
			}
			if !ok {
				t.Fatalf("passed with %s not active: %+v", u, st.Units)
			}
		}
	})
}

// TestWorkloadsProperties: the workloads check passes only when the node
// is Ready and every pod has been Ready for minReadySeconds at now (a
// kubelet clock ahead of the coordinator's only makes it wait).
func TestWorkloadsProperties(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	rapid.Check(t, func(t *rapid.T) {
		spec := &fleetv1.WorkloadHealthCheck{MinReadySeconds: rapid.Int32Range(0, 120).Draw(t, "minReady")}
		var pods []Pod
		for i := range rapid.IntRange(0, 12).Draw(t, "pods") {
			pods = append(pods, Pod{Namespace: "ns", Name: string(rune('a' + i)), Ready: rapid.Bool().Draw(t, "ready"),
				ReadySince: now.Add(-time.Duration(rapid.IntRange(-60, 300).Draw(t, "ago")) * time.Second)})
		}
		ready := rapid.Bool().Draw(t, "nodeReady")
		r := Workloads(spec, ready, pods, now)
		want := ready
		for _, p := range pods {
			// minReadySeconds 0: Ready is enough, whatever the kubelet's clock says.
			want = want && p.Ready && (spec.MinReadySeconds == 0 || now.Sub(p.ReadySince) >= time.Duration(spec.MinReadySeconds)*time.Second)
		}
		if r.Pass != want || len(r.Message) > MaxMessage {
			t.Fatalf("pass %v, want %v: %+v", r.Pass, want, r)
		}
	})
}
