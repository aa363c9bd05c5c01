package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/agent/bootc"
	"github.com/bootc-fleet/bootc-fleet/internal/agent/decide"
)

// startStage confirms the stage grant with a consistent read and starts the
// stage (bootc.CLI.Stage) in the background.
func (r *runner) startStage(ctx context.Context, o decide.Observation, a decide.Action) bool {
	g, ok := r.heldGrant(a.Grant)
	if !ok || !r.confirm(ctx, g, lease.ActionStage, "stage", a.Image.String(), o.Boot) {
		return false
	}
	if r.probe == nil || !r.probe.support.CanStage || r.probe.boot != o.Boot {
		return false // Decide checked it; kept as a guard
	}
	caps := r.probe.caps
	if g.StageTimeoutProblem != "" {
		r.log.Warn("the stage grant's timeout is unusable; bounding the stage by the default", "grant", g.ID.String(),
			"problem", g.StageTimeoutProblem, "stageTimeout", g.StageTimeout.String())
	}
	sctx, cancel := context.WithCancel(ctx)
	s := &stageRun{image: a.Image, grant: a.Grant, cancel: cancel, done: make(chan error, 1), started: r.now(), timeout: g.StageTimeout}
	r.stage = s
	opts := bootc.StageOptions{EnforceSignatures: a.Enforce}
	go func() { s.done <- r.deps.Bootc.Stage(sctx, a.Image, caps, opts) }()
	return true
}

func (r *runner) stageFinished(err error) {
	s := r.stage
	r.stage = nil
	r.lastRead = nil // the stage changed what bootc reports
	if s == nil {
		return
	}
	s.cancel()
	if err != nil && errors.Is(err, bootc.ErrSignatureRejected) {
		// Deterministic: no retry for this image (decide.Rejection).
		r.rejected = &decide.Rejection{Image: s.image, Message: bootc.FailureMessage(err)}
		r.stageFail, r.stageDelay = nil, 0
		r.log.Error("the host's container signature policy rejected the image; not trying it again until the desired image changes",
			"image", s.image.String(), "grant", s.grant.String(), "err", err)
		return
	}
	if err != nil {
		attempts := 1
		if f := r.stageFail; f != nil && f.Grant == s.grant && f.Image == s.image {
			attempts = f.Attempts + 1
		} else {
			r.stageDelay = 0
		}
		if r.stageDelay == 0 {
			r.stageDelay = r.cfg.StageRetry
		} else if r.stageDelay *= 2; r.stageDelay > 10*time.Minute {
			r.stageDelay = 10 * time.Minute
		}
		r.stageFail = &decide.StageFailure{Image: s.image, Grant: s.grant, Attempts: attempts, Message: err.Error(), RetryAt: r.now().Add(r.stageDelay)}
		if errors.Is(err, bootc.ErrRegistryUnauthorized) {
			r.stageFail.Class = fleetv1.ReasonRegistryUnauthorized
			r.stageFail.Message = bootc.FailureMessage(err)
		}
		r.log.Error("stage failed", "image", s.image.String(), "grant", s.grant.String(), "attempt", attempts,
			"of", lease.MaxStageAttempts, "err", err, "retryIn", r.stageDelay)
		return
	}
	r.stageFail, r.stageDelay = nil, 0
	r.log.Info("stage finished", "image", s.image.String())
}

// stageTimedOut counts a stage cancelled at its timeout (amendment 19) as a
// failed stage that lets go of its grant (decide.StageFailure.TimedOut): the
// next round reports StageTimedOut and lists the grant as released.
func (r *runner) stageTimedOut(s *stageRun) {
	attempts := 1
	if f := r.stageFail; f != nil && f.Grant == s.grant && f.Image == s.image {
		attempts = f.Attempts + 1
	}
	r.stageFail = &decide.StageFailure{Image: s.image, Grant: s.grant, Attempts: attempts, TimedOut: true, RetryAt: r.now(),
		Message: fmt.Sprintf("the stage did not finish within the stage timeout of %s", s.timeout)}
	r.stageDelay = 0
	r.log.Error("stage timed out; cancelled it and letting go of the grant", "image", s.image.String(), "grant", s.grant.String(),
		"stageTimeout", s.timeout.String(), "attempt", attempts)
}

// cancelStage stops the in-flight stage and waits for the bootc process to
// be gone, pinging the watchdog meanwhile.
func (r *runner) cancelStage(ctx context.Context) {
	s := r.stage
	if s == nil {
		return
	}
	s.cancel()
	r.await(ctx, s.done)
	r.stage = nil
	r.lastRead = nil
	r.log.Info("stage cancelled", "image", s.image.String())
}

// await waits for done, sending WATCHDOG=1 from this loop while it waits.
func (r *runner) await(ctx context.Context, done <-chan error) error {
	tick := time.Second
	if wd, ok := r.deps.Notifier.WatchdogInterval(); ok && wd/2 < tick {
		tick = wd / 2
	}
	for {
		t := r.deps.Clock.NewTimer(tick)
		select {
		case err := <-done:
			t.Stop()
			return err
		case <-t.C():
			_ = r.deps.Notifier.Watchdog()
		}
	}
}
