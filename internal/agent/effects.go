package agent

import (
	"context"

	"github.com/bootc-fleet/bootc-fleet/internal/agent/bootc"
	"github.com/bootc-fleet/bootc-fleet/internal/agent/decide"
	"github.com/bootc-fleet/bootc-fleet/internal/agent/record"
)

// execute runs one effect of decide.Step and returns its result.
func (r *runner) execute(ctx context.Context, e decide.Effect) decide.Result {
	switch e.Kind {
	case decide.EffectConfirmStage, decide.EffectConfirmApply, decide.EffectConfirmReboot, decide.EffectConfirmRollback:
		return r.readGrant(ctx, e)
	case decide.EffectStage:
		return r.startStage(ctx, e)
	case decide.EffectCancelStage:
		return r.cancelStage(ctx, e)
	case decide.EffectClearRecord:
		return r.clearRecord(e)
	case decide.EffectWriteRecord:
		return r.writeRecord(e)
	case decide.EffectReport:
		r.report(ctx, r.st.Last.Obs, bootc.Status{}, e.Action)
		return decide.Result{Kind: e.Kind}
	case decide.EffectReadStatus:
		return r.reread(ctx, e)
	case decide.EffectUnlock:
		return r.unlock(ctx, e)
	case decide.EffectReboot:
		return r.reboot(ctx, e)
	case decide.EffectRollback:
		return r.rollback(ctx, e)
	}
	return decide.Result{Kind: e.Kind, Err: "unknown effect"}
}

// noteResult logs what Step made of a result when it stopped a sequence.
func (r *runner) noteResult(e decide.Effect, res decide.Result) {
	switch e.Kind {
	case decide.EffectConfirmStage, decide.EffectConfirmApply, decide.EffectConfirmReboot, decide.EffectConfirmRollback:
		if r.st.Note != "" {
			r.log.Info("grant not confirmed; not acting", "step", e.Step, "lease", e.Grant.Lease, "grant", e.Grant.ID.String(), "err", r.st.Note)
		}
	case decide.EffectReadStatus:
		if e.Step == decide.StepBeforeRollback || e.Step == decide.StepAfterRollback {
			if _, ok := decide.RollbackIs(res.Status, e.Boot, e.Image); !ok || (e.Step == decide.StepAfterRollback && !res.Status.RollbackQueued) {
				r.log.Error("the rollback deployment is not the granted image, queued; not rebooting", "when", e.Step,
					"rollback", stagedName(res.Status.Rollback), "queued", res.Status.RollbackQueued, "granted", e.Image.String(),
					"statusErr", res.Status.Unavailable, "boot", res.Status.ReadIn.String())
			}
			return
		}
		if _, ok := decide.StagedIs(res.Status, e.Boot, e.Image); !ok {
			r.log.Error("staged deployment is not the granted image; not rebooting", "when", e.Step,
				"staged", stagedName(res.Status.Staged), "granted", e.Image.String(), "statusErr", res.Status.Unavailable,
				"boot", res.Status.ReadIn.String())
		}
	case decide.EffectCancelStage:
		if f := r.st.StageFail; e.TimedOut && f != nil && f.TimedOut {
			r.log.Error("stage timed out; cancelled it and letting go of the grant", "image", f.Image.String(), "grant", f.Grant.String(),
				"stageTimeout", r.st.Last.Obs.InFlightTimeout.String(), "attempt", f.Attempts)
		}
	}
}

func stagedName(d *decide.Deployment) string {
	if d == nil {
		return ""
	}
	return d.Image.String()
}

// clearRecord is the ClearRecord effect: remove the reboot record, marking
// its grant spent first when the reboot happened.
func (r *runner) clearRecord(e decide.Effect) decide.Result {
	res := decide.Result{Kind: e.Kind}
	if e.MarkSpent {
		if err := r.deps.Records.AddSpent(e.Grant.ID); err != nil {
			r.log.Error("could not mark the grant spent; keeping the record", "grant", e.Grant.ID.String(), "err", err)
			res.Err = err.Error()
			return res
		}
	}
	if err := r.deps.Records.Clear(); err != nil {
		r.log.Error("could not clear the reboot record", "err", err)
		res.Err = err.Error()
	}
	return res
}

// writeRecord is the WriteRecord effect: the first use of a reboot grant.
func (r *runner) writeRecord(e decide.Effect) decide.Result {
	rec := record.Record{Grant: e.Grant.ID, Image: e.Image.String(), BootID: e.Boot.BootID,
		SoftRebootCount: e.Boot.SoftRebootCount, Soft: e.Soft, Recorded: e.Recorded, Rollback: e.Rollback}
	if err := r.deps.Records.Write(rec); err != nil {
		r.log.Error("could not write the reboot record; not rebooting", "err", err)
		return decide.Result{Kind: e.Kind, Err: err.Error()}
	}
	r.log.Info("reboot recorded", "grant", e.Grant.ID.String(), "image", e.Image.String(), "boot", e.Boot.String(), "soft", e.Soft, "rollback", e.Rollback)
	return decide.Result{Kind: e.Kind}
}

// reread is the ReadStatus effect: bootc status and the boot identity after
// it (decide.StagedIs judges them).
func (r *runner) reread(ctx context.Context, e decide.Effect) decide.Result {
	st, err := r.readStatus(ctx)
	now, _, idErr := r.identity(ctx)
	res := decide.Result{Kind: e.Kind}
	if idErr != nil {
		now = decide.BootIdentity{}
	}
	if err != nil {
		res.Status = decide.Status{ReadIn: now, Unavailable: err.Error()}
		return res
	}
	res.Status = statusOf(st, now)
	return res
}

// unlock is the Unlock effect: bootc upgrade --from-downloaded, preparing a
// soft reboot when e.Soft.
func (r *runner) unlock(ctx context.Context, e decide.Effect) decide.Result {
	r.confirmed(e)
	mode := bootc.NoSoftReboot
	if e.Soft {
		// auto, not required: on a deployment bootc finds incapable,
		// required would fail after unlocking, and the agent would retry
		// an apply that cannot succeed; auto unlocks and prepares nothing,
		// and the re-read after it then picks a full reboot.
		mode = bootc.SoftRebootAuto
	}
	actx, cancel := context.WithTimeout(ctx, r.cfg.CommandTimeout)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.deps.Bootc.ApplyStaged(actx, mode) }()
	if err := r.await(ctx, done); err != nil {
		r.log.Error("bootc upgrade --from-downloaded failed; will retry while the grant is valid", "softReboot", string(mode), "err", err)
		return decide.Result{Kind: e.Kind, Err: err.Error()}
	}
	return decide.Result{Kind: e.Kind}
}

// reboot is the Reboot effect: ask logind for the (soft) reboot.
func (r *runner) reboot(ctx context.Context, e decide.Effect) decide.Result {
	if p := r.st.Pending; p != nil && p.Action.Soft != e.Soft {
		r.log.Info("rebooting fully instead of soft: "+e.Why, "grant", e.Grant.ID.String(), "image", e.Image.String())
	}
	r.confirmed(e)
	rctx, cancel := context.WithTimeout(ctx, r.cfg.CommandTimeout)
	defer cancel()
	var err error
	if e.Soft {
		err = r.deps.Host.SoftReboot(rctx)
	} else {
		err = r.deps.Host.Reboot(rctx)
	}
	if err != nil {
		if ctx.Err() != nil {
			// logind starts the (soft) reboot before it answers, and
			// stopping the agent is part of it: this is the usual end of a
			// reboot request, not a failure. Were it not, the next start
			// finds the record in the same boot and asks again (rule 1).
			r.log.Info("stopped while logind took the reboot request (the host is going down)", "soft", e.Soft,
				"grant", e.Grant.ID.String(), "image", e.Image.String(), "err", err)
		} else {
			r.log.Error("reboot request failed; will retry while the grant is valid", "soft", e.Soft, "err", err)
		}
		return decide.Result{Kind: e.Kind, Err: err.Error()}
	}
	r.log.Info("reboot requested", "grant", e.Grant.ID.String(), "image", e.Image.String(), "soft", e.Soft, "why", e.Why)
	return decide.Result{Kind: e.Kind}
}

// rollback is the Rollback effect: `bootc rollback` queues the rollback
// deployment (the grant's image) for the next boot, preparing a soft reboot
// into it when e.Soft (auto, as for the unlock: the re-read after it then
// decides how to reboot).
func (r *runner) rollback(ctx context.Context, e decide.Effect) decide.Result {
	r.confirmed(e)
	mode := bootc.NoSoftReboot
	if e.Soft {
		mode = bootc.SoftRebootAuto
	}
	res, err := awaitBootc(ctx, r, func(c context.Context) (bootc.RollbackResult, error) {
		return r.deps.Bootc.Rollback(c, e.Image, mode)
	})
	if err != nil {
		r.log.Error("bootc rollback failed; will retry while the grant is valid", "image", e.Image.String(), "softReboot", string(mode), "err", err)
		return decide.Result{Kind: e.Kind, Err: err.Error()}
	}
	r.log.Info("rollback queued", "grant", e.Grant.ID.String(), "image", e.Image.String(), "alreadyQueued", res.AlreadyQueued,
		"softRebootPrepared", res.SoftRebootPrepared)
	return decide.Result{Kind: e.Kind}
}
