package decide

import (
	"testing"
	"time"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// stagingFor: v2 staging under its grant for d, bounded by timeout.
func stagingFor(d, timeout time.Duration) Observation {
	o := holding(base(), stageGrant(imgV2))
	img := imgV2
	o.InFlight = &img
	o.InFlightStarted, o.InFlightTimeout = t0.Add(-d), timeout
	return o
}

// Amendment 19: a stage that runs past the grant's stage timeout is
// cancelled, reported as StageTimedOut, and counted as a failed stage that
// lets go of the grant, so the slot goes to the next node.
func TestStageTimeout(t *testing.T) {
	tests := []struct {
		name   string
		obs    Observation
		kind   Kind
		reason string
		timed  bool
	}{
		{"a stage within its timeout continues", stagingFor(59*time.Minute, time.Hour), Nothing, fleetv1.ReasonStaging, false},
		{"a stage at its timeout is cancelled as timed out", stagingFor(time.Hour, time.Hour), CancelStage, fleetv1.ReasonStageTimedOut, true},
		{"a stage long past its timeout is cancelled as timed out", stagingFor(5*time.Hour, time.Hour), CancelStage, fleetv1.ReasonStageTimedOut, true},
		{"an unbounded stage (no timeout known) is not timed out", stagingFor(5*time.Hour, 0), Nothing, fleetv1.ReasonStaging, false},
		{"a stage past its timeout is cancelled even while bootc status fails", func() Observation {
			o := stagingFor(2*time.Hour, time.Hour)
			o.Status.Unavailable = "exit status 1"
			return o
		}(), CancelStage, fleetv1.ReasonStageTimedOut, true},
		{"a stage past its timeout whose image is staged already (finishing) is cancelled too", func() Observation {
			o := withStaged(stagingFor(2*time.Hour, time.Hour), dep(imgV2))
			return o
		}(), CancelStage, fleetv1.ReasonStageTimedOut, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Decide(tc.obs)
			if got.Kind != tc.kind || got.Reason != tc.reason || got.TimedOut != tc.timed {
				t.Fatalf("Decide = %+v, want %s/%s timedOut=%v", got, tc.kind, tc.reason, tc.timed)
			}
			if tc.timed && (got.Image != imgV2 || got.Phase != fleetv1.PhaseWaiting) {
				t.Fatalf("Decide = %+v, want the stage of v2 cancelled, phase Waiting", got)
			}
		})
	}
}

// After a timed-out stage the agent neither retries under that grant nor
// keeps it: it reports StageTimedOut (the coordinator queues it last) and
// lists the grant as released; a new grant starts afresh.
func TestAfterAStageTimedOut(t *testing.T) {
	sg := stageGrant(imgV2)
	timedOut := &StageFailure{Image: imgV2, Grant: sg.ID, Attempts: 1, TimedOut: true, Message: "did not finish within 1h0m0s", RetryAt: t0}
	t.Run("under the same grant: no retry, the grant is let go of", func(t *testing.T) {
		o := holding(base(), sg)
		o.LastStageFailure = timedOut
		a := Decide(o)
		if a.Kind != Nothing || a.Phase != fleetv1.PhaseWaiting || a.Reason != fleetv1.ReasonStageTimedOut {
			t.Fatalf("Decide = %+v, want Nothing Waiting/StageTimedOut", a)
		}
		cs := Claims(o, a)
		if len(cs) != 1 || cs[0].ID != sg.ID || cs[0].Released != fleetv1.ReasonStageTimedOut {
			t.Fatalf("Claims = %+v, want %s released as %s", cs, sg.ID, fleetv1.ReasonStageTimedOut)
		}
	})
	t.Run("without a grant: says it timed out", func(t *testing.T) {
		o := base()
		o.LastStageFailure = timedOut
		if a := Decide(o); a.Kind != Nothing || a.Phase != fleetv1.PhaseWaiting || a.Reason != fleetv1.ReasonStageTimedOut {
			t.Fatalf("Decide = %+v, want Nothing Waiting/StageTimedOut", a)
		}
	})
	t.Run("a new grant starts with fresh attempts", func(t *testing.T) {
		o := holding(base(), sg)
		old := *timedOut
		old.Grant.Transitions--
		o.LastStageFailure = &old
		if a := Decide(o); a.Kind != Stage || a.Image != imgV2 {
			t.Fatalf("Decide = %+v, want Stage v2", a)
		}
	})
	t.Run("a cancelled stage's report keeps the grant until the timeout is recorded", func(t *testing.T) {
		o := stagingFor(time.Hour, time.Hour)
		cs := Claims(o, Decide(o))
		if len(cs) != 1 || cs[0].Released != "" {
			t.Fatalf("Claims = %+v", cs)
		}
	})
	if lease.MaxStageAttempts < 2 {
		t.Fatal("a timed-out stage must release its grant on the first attempt, not by the attempt count")
	}
}
