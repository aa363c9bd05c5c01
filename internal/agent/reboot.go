package agent

import (
	"context"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	"github.com/bootc-fleet/bootc-fleet/internal/agent/bootc"
	"github.com/bootc-fleet/bootc-fleet/internal/agent/decide"
	"github.com/bootc-fleet/bootc-fleet/internal/agent/record"
)

// clearRecord removes the reboot record (marking its grant spent first when
// the reboot happened) and keeps a Degraded verdict for the boot if asked.
func (r *runner) clearRecord(o decide.Observation, a decide.Action) bool {
	if a.MarkSpent {
		if err := r.deps.Records.AddSpent(o.Record.Grant); err != nil {
			r.log.Error("could not mark the grant spent; keeping the record", "grant", o.Record.Grant.String(), "err", err)
			return false
		}
	}
	if err := r.deps.Records.Clear(); err != nil {
		r.log.Error("could not clear the reboot record", "err", err)
		return false
	}
	r.rebootIssued = nil
	if a.Keep && o.Desired.Set && o.Desired.Invalid == "" {
		r.verdict = &decide.Verdict{Boot: o.Boot, Desired: o.Desired.Image, Reason: a.Reason, Message: a.Message}
	}
	return true
}

// applyAndReboot: write the record (first use of the grant), report
// Rebooting, re-read status and check the staged digest, unlock (preparing a
// soft reboot when a.Soft), re-read and check again, then reboot through
// logind: soft only if the re-read shows bootc prepared it
// (decide.SoftAfterUnlock), else fully.
func (r *runner) applyAndReboot(ctx context.Context, o decide.Observation, a decide.Action) bool {
	if a.WriteRecord {
		rec := record.Record{Grant: a.Grant, Image: a.Image.String(), BootID: o.Boot.BootID,
			SoftRebootCount: o.Boot.SoftRebootCount, Soft: a.Soft, Recorded: o.Now}
		if err := r.deps.Records.Write(rec); err != nil {
			r.log.Error("could not write the reboot record; not rebooting", "err", err)
			return false
		}
		r.log.Info("reboot recorded", "grant", a.Grant.String(), "image", a.Image.String(), "boot", o.Boot.String(), "soft", a.Soft)
	}
	r.report(ctx, o, bootc.Status{}, a)
	if _, ok := r.stagedIs(ctx, o.Boot, a.Image, "before unlocking"); !ok {
		return true
	}
	g, ok := r.heldGrant(a.Grant)
	if !ok || !r.confirm(ctx, g, lease.ActionReboot, "apply", a.Image.String(), o.Boot) {
		return true
	}
	mode := bootc.NoSoftReboot
	if a.Soft {
		// auto, not required: on a deployment bootc finds incapable,
		// required would fail after unlocking, and the agent would retry
		// an apply that cannot succeed; auto unlocks and prepares nothing,
		// and the re-read below then picks a full reboot.
		mode = bootc.SoftRebootAuto
	}
	actx, cancel := context.WithTimeout(ctx, r.cfg.CommandTimeout)
	done := make(chan error, 1)
	go func() { done <- r.deps.Bootc.ApplyStaged(actx, mode) }()
	err := r.await(ctx, done)
	cancel()
	if err != nil {
		r.log.Error("bootc upgrade --from-downloaded failed; will retry while the grant is valid", "softReboot", string(mode), "err", err)
		return false
	}
	staged, ok := r.stagedIs(ctx, o.Boot, a.Image, "after unlocking")
	if !ok {
		return true
	}
	soft, why := decide.SoftAfterUnlock(a, staged)
	if a.Soft != soft {
		r.log.Info("rebooting fully instead of soft: "+why, "grant", a.Grant.String(), "image", a.Image.String())
	}
	step := "reboot"
	if soft {
		step = "soft-reboot"
	}
	if g, ok = r.heldGrant(a.Grant); !ok || !r.confirm(ctx, g, lease.ActionReboot, step, a.Image.String(), o.Boot) {
		return true
	}
	rctx, rcancel := context.WithTimeout(ctx, r.cfg.CommandTimeout)
	defer rcancel()
	if soft {
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
			r.log.Info("stopped while logind took the reboot request (the host is going down)", "soft", soft,
				"grant", a.Grant.String(), "image", a.Image.String(), "err", err)
			return false
		}
		r.log.Error("reboot request failed; will retry while the grant is valid", "soft", soft, "err", err)
		return false
	}
	id := a.Grant
	r.rebootIssued = &id
	r.log.Info("reboot requested", "grant", a.Grant.String(), "image", a.Image.String(), "soft", soft, "why", why)
	return false
}

// stagedIs re-reads bootc status and checks, in the same boot, that the
// staged deployment is exactly img, and returns it as read. On a mismatch it
// drops the record (no reboot happens) and the next round reports what it
// finds.
func (r *runner) stagedIs(ctx context.Context, boot decide.BootIdentity, img imageref.Pinned, when string) (*decide.Deployment, bool) {
	st, err := r.readStatus(ctx)
	now, _, idErr := r.identity(ctx)
	var got imageref.Pinned
	if err == nil && st.Staged != nil {
		got, _ = st.Staged.Pinned()
	}
	if err == nil && idErr == nil && now == boot && got == img {
		return statusOf(st, now).Staged, true
	}
	r.log.Error("staged deployment is not the granted image; not rebooting", "when", when,
		"staged", got.String(), "granted", img.String(), "statusErr", err, "boot", now.String())
	if st.Staged != nil && !st.Staged.DownloadOnly && got != img {
		return nil, false // leave the record: the next round reports the unlocked mismatch
	}
	if cerr := r.deps.Records.Clear(); cerr != nil {
		r.log.Error("could not clear the reboot record", "err", cerr)
	}
	return nil, false
}
