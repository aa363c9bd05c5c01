package plan

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/health"
)

// Golden scenarios of the health gate, quarantine and rollback
// (amendments 24 and 25): appended to scenarios, played by TestScenarios.
func init() {
	scenarios = append(scenarios, gateScenarios...)
}

var (
	hostPass   = health.Verdict{Results: []health.Result{{Check: health.CheckHost, Pass: true}}}
	hostFailed = health.Verdict{Results: []health.Result{{Check: health.CheckHost, Reason: fleetv1.ReasonHostUnitFailed, Message: "failed units: bad.service"}}}
)

// gated gives the pool a host gate timing out after timeout, with
// minReadySeconds minReady and onFailure policy.
func gatedPool(w *world, timeout time.Duration, minReady int32, policy fleetv1.FailurePolicy) {
	w.pool.Spec.Health = &fleetv1.HealthSpec{Timeout: &metav1.Duration{Duration: timeout}, Host: &fleetv1.HostHealthCheck{RequiredUnits: []string{"kubelet.service"}}}
	w.pool.Spec.Rollout.MinReadySeconds = minReady
	w.pool.Spec.Rollout.OnFailure = policy
}

// verdicts sets, for each node holding a reboot grant, its gate's verdict:
// bad(node) says whether it fails; a node whose gate passes late fails
// until its grant has been back for late.
func verdicts(w *world, bad func(node string, s Slot) bool) {
	for name := range w.nodes {
		s, ok := w.grantOf(name, lease.KindReboot)
		switch {
		case !ok || s.Grant.Phase != lease.PhaseReboot:
			delete(w.health, name)
		case bad(name, s):
			w.health[name] = hostFailed
		default:
			w.health[name] = hostPass
		}
	}
}

// badImage: node-00 fails its host gate on v1.
func badImage(name string, s Slot) bool { return name == "node-00" && s.Grant.Image == imgV1 }

var gateScenarios = []scenario{
	{
		name: "gate-passes-late",
		about: "3 nodes, maxUnavailable 1, a host gate with timeout 1m: node-00 comes back on v1 but its host check fails " +
			"(a unit failed) for 40s, then passes; its slot is released only then, and the rollout goes on",
		nodes: 3, passes: 60,
		setup: func(w *world) {
			budget(w, 1, 3)
			gatedPool(w, time.Minute, 0, "")
		},
		act: func(w *world, _ int, _ map[string]bool) {
			verdicts(w, func(name string, s Slot) bool {
				return name == "node-00" && (s.BackSince.IsZero() || w.now.Before(s.BackSince.Add(40*time.Second)))
			})
			w.idealWorld()
		},
	},
	{
		name: "gate-fails-rollback",
		about: "3 nodes, maxUnavailable 1, minReadySeconds 20, a host gate with timeout 1m, onFailure Rollback: node-00 comes back on v1 " +
			"and its host check keeps failing; at the timeout its grant is marked failed (HostUnitFailed), v1 is quarantined (Degraded " +
			"ImageFailedHealthCheck) and every other desired image cleared (node-01 and node-02 keep v1 staged, locked); the slot is re-issued to node-00 as " +
			"a rollback grant to v0, it is drained, rolls back, comes back on v0 and is released (RolledBack); nobody else reboots",
		nodes: 3, passes: 30,
		setup: func(w *world) {
			budget(w, 1, 3)
			gatedPool(w, time.Minute, 20, fleetv1.OnFailureRollback)
		},
		act: func(w *world, _ int, _ map[string]bool) {
			verdicts(w, badImage)
			w.idealWorld()
		},
	},
	{
		name: "quarantine-cleared",
		about: "as gate-fails-rollback, then at pass 25 spec.image names v2 (which passes the gate): the quarantine is lifted " +
			"and every node rolls to v2",
		nodes: 3, passes: 90,
		setup: func(w *world) {
			budget(w, 1, 3)
			gatedPool(w, time.Minute, 20, fleetv1.OnFailureRollback)
		},
		act: func(w *world, pass int, _ map[string]bool) {
			if pass == 25 {
				w.pool.Spec.Image, w.target = "quay.io/example/os:v2", imgV2
			}
			verdicts(w, badImage)
			w.idealWorld()
		},
	},
	{
		name: "rolled-back-by-host",
		about: "3 nodes, maxUnavailable 1, a host gate: node-00 reboots into v1 and its boot counting falls back, so it comes back " +
			"on v0 with v1 as its rollback deployment: v1 is quarantined (RolledBackByHost) and the slot released, with no second rollback",
		nodes: 3, passes: 20,
		setup: func(w *world) {
			budget(w, 1, 3)
			gatedPool(w, time.Minute, 0, fleetv1.OnFailureRollback)
		},
		act: func(w *world, _ int, _ map[string]bool) {
			if s, ok := w.grantOf("node-00", lease.KindReboot); ok && s.Grant.Phase == lease.PhaseReboot && w.grantedInBoot("node-00", s.Grant) {
				w.reboot("node-00") // booted v1 ...
				w.rollBack("node-00")
				w.boots["node-00"]-- // ... and fell back to v0 in the same boot
				w.nodes["node-00"].BootID = bootID("node-00", w.boots["node-00"])
			}
			verdicts(w, func(string, Slot) bool { return false })
			w.idealWorld()
		},
	},
	{
		name: "rollback-failed",
		about: "as gate-fails-rollback, but node-00's rollback does not take: it comes back on v1 again; its rollback grant is marked " +
			"RollbackFailed, stays held, and the pool halts",
		nodes: 3, passes: 30,
		setup: func(w *world) {
			budget(w, 1, 3)
			gatedPool(w, time.Minute, 20, fleetv1.OnFailureRollback)
		},
		act: func(w *world, _ int, _ map[string]bool) {
			if s, ok := w.grantOf("node-00", lease.KindReboot); ok && s.Grant.Rollback && s.Grant.Phase == lease.PhaseReboot && w.grantedInBoot("node-00", s.Grant) {
				w.reboot("node-00") // a new boot, still on v1
			}
			verdicts(w, badImage)
			w.idealWorld()
		},
	},
	{
		name: "gate-fails-halt",
		about: "3 nodes, maxUnavailable 1, a host gate with timeout 1m, onFailure Halt: node-00 fails its gate on v1; its grant is " +
			"marked failed and stays held, v1 is quarantined and the pool halts; nothing rolls back",
		nodes: 3, passes: 25,
		setup: func(w *world) {
			budget(w, 1, 3)
			gatedPool(w, time.Minute, 0, fleetv1.OnFailureHalt)
		},
		act: func(w *world, _ int, _ map[string]bool) {
			verdicts(w, badImage)
			w.idealWorld()
		},
	},
}
