package plan

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// A stage grant carries the pool's stageTimeout to the agent, which reads
// only its own BootcNode and Leases (amendment 19).
func TestStageGrantCarriesTheStageTimeout(t *testing.T) {
	for _, c := range []struct {
		name string
		spec *metav1.Duration
		want string
	}{
		{"unset: the default", nil, "1h0m0s"},
		{"set", &metav1.Duration{Duration: 20 * time.Minute}, "20m0s"},
		{"out of bounds (past an older schema): the default", &metav1.Duration{Duration: 48 * time.Hour}, "1h0m0s"},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := settled(2, 1, 1)
			w.pool.Spec.Rollout.StageTimeout = c.spec
			w.step()
			s, ok := w.grantOf("node-00", lease.KindStage)
			if !ok {
				t.Fatal("node-00 has no stage grant")
			}
			if got := w.leases[s.Name].Annotations[lease.AnnotationStageTimeout]; got != c.want {
				t.Fatalf("%s = %q, want %q", lease.AnnotationStageTimeout, got, c.want)
			}
			if s.Grant.StageTimeoutProblem != "" {
				t.Fatalf("the agent would not read the grant's timeout: %s", s.Grant.StageTimeoutProblem)
			}
		})
	}
}

// stallingWorld: maxStaging 1, three nodes; node-00 holds the stage slot
// and its agent keeps reporting Staging, listing the grant, every 30s.
func stallingWorld(t *testing.T, stageTimeout time.Duration) *world {
	t.Helper()
	w := settled(3, 1, 1)
	w.pool.Spec.Rollout.StageTimeout = &metav1.Duration{Duration: stageTimeout}
	w.step()
	if _, ok := w.grantOf("node-00", lease.KindStage); !ok {
		t.Fatal("setup: node-00 has no stage grant")
	}
	w.step() // the grant is first seen on the pass after it is written
	return w
}

// A stage that hangs (a registry that stalls or trickles a layer) holds its
// slot while the agent's heartbeats keep coming; the coordinator revokes the
// grant stageTimeout plus a lease duration after it first saw it, on its own
// clock, and counts the node's share until it reports that it stopped.
func TestStageGrantRevokedAfterStageTimeout(t *testing.T) {
	const timeout = 10 * time.Minute
	w := stallingWorld(t, timeout)
	granted := w.now
	var out Output
	for w.now.Before(granted.Add(timeout + time.Minute - 30*time.Second)) {
		w.now = w.now.Add(30 * time.Second)
		w.agentReports("node-00", imgV0, imageref.Pinned{}, fleetv1.PhaseStaging)
		out = w.step()
		if rv := changes(out, OpRevoke, lease.KindStage); len(rv) > 0 {
			t.Fatalf("revoked at %s after the grant, before stageTimeout plus a lease duration: %+v", w.now.Sub(granted), rv)
		}
	}
	if out.RequeueAfter <= 0 || out.RequeueAfter > 30*time.Second {
		t.Fatalf("requeue after %s, want by the stage deadline", out.RequeueAfter)
	}
	w.now = granted.Add(timeout + time.Minute)
	w.agentReports("node-00", imgV0, imageref.Pinned{}, fleetv1.PhaseStaging)
	out = w.step()
	rv := changes(out, OpRevoke, lease.KindStage)
	if len(rv) != 1 || rv[0].Node != "node-00" || rv[0].Why != WhyStageTimedOut {
		t.Fatalf("want node-00's grant revoked as %s, got %+v", WhyStageTimedOut, out.Changes)
	}
	named := false
	for _, e := range out.Events {
		named = named || (e.Reason == fleetv1.EventGrantRevoked && strings.Contains(e.Message, fleetv1.ReasonStageTimedOut) && strings.Contains(e.Message, "node-00"))
	}
	if !named {
		t.Fatalf("no Event names the revoke's reason: %+v", out.Events)
	}
	// Amendment 7: the old holder still downloads until its agent sees the
	// revoke; the slot is not handed on meanwhile.
	if g := changes(out, OpGrant, lease.KindStage); len(g) != 0 {
		t.Fatalf("slot handed on while node-00 still reports Staging: %+v", g)
	}
	w.now = w.now.Add(2 * time.Second)
	w.agentReports("node-00", imgV0, imageref.Pinned{}, fleetv1.PhaseWaiting)
	w.bns["node-00"].Status.Reason = fleetv1.ReasonStageTimedOut
	out = w.step()
	if g := changes(out, OpGrant, lease.KindStage); len(g) != 1 || g[0].Node != "node-01" {
		t.Fatalf("stage slot went to %v, want node-01 once node-00 stopped", nodesOf(g))
	}
}

// The deadline runs from when this coordinator first saw the grant: an
// acquireTime another replica wrote with a clock hours ahead or behind
// neither shortens nor stretches it.
func TestStageDeadlineIgnoresTheLeasesTimestamps(t *testing.T) {
	const timeout = 10 * time.Minute
	for _, skew := range []time.Duration{-3 * time.Hour, 3 * time.Hour} {
		t.Run(skew.String(), func(t *testing.T) {
			w := stallingWorld(t, timeout)
			s, _ := w.grantOf("node-00", lease.KindStage)
			l := w.leases[s.Name]
			l.Spec.AcquireTime = &metav1.MicroTime{Time: w.now.Add(skew)}
			l.Spec.RenewTime = l.Spec.AcquireTime.DeepCopy()
			w.grantsSeen = map[lease.ID]time.Time{} // a new leader: seen now
			w.now = w.now.Add(time.Second)
			seen := w.now
			w.agentReports("node-00", imgV0, imageref.Pinned{}, fleetv1.PhaseStaging)
			w.step()
			for w.now.Before(seen.Add(timeout + time.Minute - 30*time.Second)) {
				w.now = w.now.Add(30 * time.Second)
				w.agentReports("node-00", imgV0, imageref.Pinned{}, fleetv1.PhaseStaging)
				if rv := changes(w.step(), OpRevoke, lease.KindStage); len(rv) > 0 {
					t.Fatalf("revoked %s after this coordinator first saw the grant: %+v", w.now.Sub(seen), rv)
				}
			}
			w.now = seen.Add(timeout + time.Minute)
			w.agentReports("node-00", imgV0, imageref.Pinned{}, fleetv1.PhaseStaging)
			if rv := changes(w.step(), OpRevoke, lease.KindStage); len(rv) != 1 || rv[0].Why != WhyStageTimedOut {
				t.Fatal("not revoked at stageTimeout plus a lease duration after the grant was first seen")
			}
		})
	}
}

// Amendment 20: a node that reports Staging without a stage slot takes a
// share of maxStaging (amendment 7) only for a bound; then the share lapses,
// the pool names it, and the waiting nodes' explanations name it before.
func TestStagingWithoutAGrantLapses(t *testing.T) {
	const timeout = 10 * time.Minute
	w := settled(3, 1, 1)
	w.pool.Spec.Rollout.StageTimeout = &metav1.Duration{Duration: timeout}
	// node-00's agent says Staging without ever being granted anything.
	w.agentReports("node-00", imgV0, imageref.Pinned{}, fleetv1.PhaseStaging)
	out := w.step()
	if g := changes(out, OpGrant, lease.KindStage); len(g) != 0 {
		t.Fatalf("granted %v while node-00 counts as staging", nodesOf(g))
	}
	first := w.now
	w.step() // BootcNodes carry the explanations of the pass before
	if s, r := w.bns["node-00"].Annotations[fleetv1.AnnotationRolloutState], w.bns["node-00"].Annotations[fleetv1.AnnotationRolloutReason]; s != fleetv1.RolloutStaging || !strings.Contains(r, "without a stage grant") {
		t.Fatalf("node-00's rollout state %q, reason %q: want Staging, saying it has no grant", s, r)
	}
	for _, n := range []string{"node-01", "node-02"} {
		if r := w.bns[n].Annotations[fleetv1.AnnotationRolloutReason]; !strings.Contains(r, "node-00") || !strings.Contains(r, "without a stage grant") {
			t.Fatalf("%s's explanation does not name node-00: %q", n, r)
		}
	}
	for w.now.Before(first.Add(timeout + time.Minute - 30*time.Second)) {
		w.now = w.now.Add(30 * time.Second)
		w.agentReports("node-00", imgV0, imageref.Pinned{}, fleetv1.PhaseStaging)
		out = w.step()
		if g := changes(out, OpGrant, lease.KindStage); len(g) != 0 {
			t.Fatalf("granted %v %s after node-00 was first seen staging without a grant", nodesOf(g), w.now.Sub(first))
		}
	}
	if c := cond(out, fleetv1.PoolAgentsReporting); c.Reason == fleetv1.ReasonStagingWithoutGrant {
		t.Fatalf("named before the bound: %+v", c)
	}
	w.now = first.Add(timeout + time.Minute)
	w.agentReports("node-00", imgV0, imageref.Pinned{}, fleetv1.PhaseStaging)
	out = w.step()
	if g := changes(out, OpGrant, lease.KindStage); len(g) != 1 || g[0].Node != "node-01" {
		t.Fatalf("stage slot went to %v, want node-01 once node-00's share lapsed", nodesOf(g))
	}
	w.step() // the BootcNodes carry this pass's explanations
	if s := w.bns["node-00"].Annotations[fleetv1.AnnotationRolloutState]; s != fleetv1.RolloutBlocked {
		t.Fatalf("node-00's rollout-state = %q, want %s (its share lapsed)", s, fleetv1.RolloutBlocked)
	}
	c := cond(out, fleetv1.PoolAgentsReporting)
	if c.Status != metav1.ConditionFalse || c.Reason != fleetv1.ReasonStagingWithoutGrant || !strings.Contains(c.Message, "node-00") {
		t.Fatalf("AgentsReporting = %+v, want False/%s naming node-00", c, fleetv1.ReasonStagingWithoutGrant)
	}
	// Still lapsed on the next pass; node-00 itself gets no slot while it
	// reports so.
	w.now = w.now.Add(30 * time.Second)
	w.agentReports("node-00", imgV0, imageref.Pinned{}, fleetv1.PhaseStaging)
	w.agentReports("node-01", imgV0, imgV1, fleetv1.PhaseStaged)
	out = w.step()
	if g := changes(out, OpGrant, lease.KindStage); len(g) != 1 || g[0].Node != "node-02" {
		t.Fatalf("stage slot went to %v, want node-02", nodesOf(g))
	}
	if c := cond(out, fleetv1.PoolAgentsReporting); c.Reason != fleetv1.ReasonStagingWithoutGrant {
		t.Fatalf("AgentsReporting = %+v", c)
	}
}

// A revoked holder that stops within the bound keeps its share until it
// says so, as amendment 7 has it: the lapse never cuts an honest agent.
func TestRevokedHolderWithinTheBoundKeepsItsShare(t *testing.T) {
	w := stallingWorld(t, time.Hour)
	w.agentReports("node-00", imgV0, imageref.Pinned{}, fleetv1.PhaseStaging)
	w.target = imgV2
	w.step()
	for range 10 {
		w.now = w.now.Add(30 * time.Second)
		w.agentReports("node-00", imgV0, imageref.Pinned{}, fleetv1.PhaseStaging)
		if g := changes(w.step(), OpGrant, lease.KindStage); len(g) != 0 {
			t.Fatalf("slot handed on while the revoked holder still stages: %v", nodesOf(g))
		}
	}
}
