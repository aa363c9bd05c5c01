package decide

import (
	"testing"
	"time"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// A staged image left unlocked (a stage cut between its switch and its
// lock) is locked again under a stage grant; a lock that fails backs off
// and gives the grant up as any stage does, instead of running again every
// round (found by TestStepHistories, seed 11268).
func TestFailedLockBacksOffLikeAnyStage(t *testing.T) {
	g := stageGrant(imgV2)
	o := holding(base(), g)
	o.Status.Staged = &Deployment{Image: imgV2}
	o.LastStageFailure = &StageFailure{Image: imgV2, Grant: g.ID, Attempts: 1, Message: "pull failed", RetryAt: t0.Add(30 * time.Second)}
	if a := Decide(o); a.Kind != Nothing || a.Reason != fleetv1.ReasonStageFailed {
		t.Fatalf("before the retry time: %s, want Nothing StageFailed", a)
	}
	o.Now = t0.Add(31 * time.Second)
	o.Grants[0].LastHeartbeat = o.Now
	if a := Decide(o); a.Kind != Stage || a.Reason != fleetv1.ReasonLockingStagedImage {
		t.Fatalf("after the retry time: %s, want Stage LockingStagedImage", a)
	}
	o.LastStageFailure.Attempts = lease.MaxStageAttempts
	if a := Decide(o); a.Kind != Nothing || a.Phase != fleetv1.PhaseWaiting || a.Reason != fleetv1.ReasonStageFailed {
		t.Fatalf("after %d failures: %s, want Waiting StageFailed", lease.MaxStageAttempts, a)
	}
}
