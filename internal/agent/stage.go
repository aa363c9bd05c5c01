package agent

import (
	"context"
	"errors"
	"time"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	"github.com/bootc-fleet/bootc-fleet/internal/agent/bootc"
	"github.com/bootc-fleet/bootc-fleet/internal/agent/decide"
)

// startStage is the Stage effect: its grant was just confirmed; start the
// stage (bootc.CLI.Stage) in the background. Its end comes back to Step as
// a StageDone input (sleep).
func (r *runner) startStage(ctx context.Context, e decide.Effect) decide.Result {
	r.confirmed(e)
	res := decide.Result{Kind: e.Kind}
	if r.probe == nil || !r.probe.support.CanStage || r.probe.boot != e.Boot {
		res.Err = "bootc cannot stage in this boot" // Decide checked it; kept as a guard
		return res
	}
	caps := r.probe.caps
	g := e.Grant
	if g.StageTimeoutProblem != "" {
		r.log.Warn("the stage grant's timeout is unusable; bounding the stage by the default", "grant", g.ID.String(),
			"problem", g.StageTimeoutProblem, "stageTimeout", g.StageTimeout.String())
	}
	sctx, cancel := context.WithCancel(ctx)
	s := &stageRun{image: e.Image, grant: g.ID, cancel: cancel, done: make(chan error, 1)}
	r.stage = s
	opts := bootc.StageOptions{EnforceSignatures: e.Enforce}
	go func() { s.done <- r.deps.Bootc.Stage(sctx, e.Image, caps, opts) }()
	return res
}

// stageFinished feeds the end of the stage into Step.
func (r *runner) stageFinished(err error) {
	s := r.stage
	r.stage = nil
	r.lastRead = nil // the stage changed what bootc reports
	if s == nil {
		return
	}
	s.cancel()
	var d decide.StageDone
	if err != nil {
		d = decide.StageDone{Err: err.Error(), Rejected: errors.Is(err, bootc.ErrSignatureRejected),
			Unauthorized: errors.Is(err, bootc.ErrRegistryUnauthorized), Message: bootc.FailureMessage(err)}
	}
	r.step(decide.Input{Now: r.now(), StageDone: &d})
	outcome := StageFinished
	switch f := r.st.StageFail; {
	case d.Rejected:
		outcome = StageRejected
		r.log.Error("the host's container signature policy rejected the image; not trying it again until the desired image changes",
			"image", s.image.String(), "grant", s.grant.String(), "err", err)
	case err != nil && f != nil:
		outcome = StageFailed
		r.log.Error("stage failed", "image", s.image.String(), "grant", s.grant.String(), "attempt", f.Attempts,
			"of", lease.MaxStageAttempts, "err", err, "retryIn", r.st.StageDelay)
	default:
		r.log.Info("stage finished", "image", s.image.String())
	}
	r.traceStageEnd(s, outcome)
}

// traceStageEnd tells Deps.Trace that the stage s is over.
func (r *runner) traceStageEnd(s *stageRun, outcome string) {
	if r.deps.Trace != nil {
		r.deps.Trace(Step{Time: r.now(), Kind: StepStageEnded, Grant: s.grant, Lease: s.grant.Lease, Image: s.image.String(), Outcome: outcome})
	}
}

// cancelStage is the CancelStage effect: stop the in-flight stage and wait
// for the bootc process to be gone, pinging the watchdog meanwhile.
func (r *runner) cancelStage(ctx context.Context, e decide.Effect) decide.Result {
	if s := r.stage; s != nil {
		s.cancel()
		_ = r.await(ctx, s.done)
		r.stage = nil
		r.lastRead = nil
		r.log.Info("stage cancelled", "image", s.image.String())
		r.traceStageEnd(s, StageCancelled)
	}
	return decide.Result{Kind: e.Kind}
}

// await waits for done, sending WATCHDOG=1 from this loop while it waits.
// It does not return at the end of the agent's context: the bootc command
// behind done runs under that context, so done comes soon after, and the
// caller must not go on while bootc may still hold its lock.
func (r *runner) await(_ context.Context, done <-chan error) error {
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
