// Package decide is the agent's decision: one pure function from what the
// agent observed to the one thing it does next (docs/design.md, "The agent's
// decision", rules 1-5). It does no I/O and reads no clock: the caller passes
// the time in.
package decide

import (
	"fmt"
	"time"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	"github.com/bootc-fleet/bootc-fleet/api/text"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// Decide returns the next action. It applies, in order: the freshness and
// readability guards, rule 1 and 2 (a reboot record exists), a rollback
// grant (amendment 25), the invalid desired image guard, rule 3 (nothing to
// do), the boot's verdict, rule 4 (staged) and rule 5 (stage or wait).
func Decide(o Observation) Action {
	if a, ok := guardRecordUnreadable(o); ok {
		return a
	}
	if a, ok := stageTimedOut(o); ok {
		return a
	}
	if a, ok := guardStatus(o); ok {
		return a
	}
	if o.Record.Present {
		if o.Record.Boot == o.Boot {
			return rebootPending(o) // rule 1
		}
		return afterReboot(o) // rule 2
	}
	if a, ok := rollback(o); ok {
		return a
	}
	if o.Desired.Set && o.Desired.Invalid != "" {
		return cancelOr(o, Action{Kind: Nothing, Phase: fleetv1.PhaseDegraded, Reason: fleetv1.ReasonInvalidDesiredImage,
			Message: "spec.desiredImage is not a digest-pinned image: " + o.Desired.Invalid})
	}
	if !o.Desired.Set || o.Status.Booted.Is(o.Desired.Image) {
		return idle(o) // rule 3
	}
	if v := o.Verdict; v.of(o.Boot) && v.Desired == o.Desired.Image {
		return cancelOr(o, Action{Kind: Nothing, Phase: fleetv1.PhaseDegraded, Reason: v.Reason, Message: v.Message})
	}
	if r := o.Rejected; r.holdsFor(o.Desired) {
		return cancelOr(o, Action{Kind: Nothing, Phase: fleetv1.PhaseDegraded, Reason: fleetv1.ReasonSignatureRejected,
			Message: "the host's container signature policy rejected " + short(r.Image) + "; not trying it again until the desired image changes or the agent restarts: " + r.Message})
	}
	if o.Status.Staged.Is(o.Desired.Image) {
		if !o.RequireSigned || o.Status.Staged.verified() {
			return staged(o) // rule 4
		}
		return unverifiedStaged(o)
	}
	return stageOrWait(o) // rule 5
}

// guardRecordUnreadable: a torn or corrupt record means the agent does not
// know whether this boot already spent a grant, so nothing disruptive runs.
func guardRecordUnreadable(o Observation) (Action, bool) {
	if o.Record.Unreadable == "" {
		return Action{}, false
	}
	return cancelOr(o, Action{Kind: Nothing, Phase: fleetv1.PhaseDegraded, Reason: fleetv1.ReasonRecordUnreadable,
		Message: "the reboot record is unreadable (" + o.Record.Unreadable + "); no stage or reboot until a person removes it"}), true
}

// stageTimedOut: a stage that ran past its grant's stage timeout is
// cancelled whatever else the observation says (amendment 19): a registry
// that stalls or trickles a layer must not hold the stage slot forever.
func stageTimedOut(o Observation) (Action, bool) {
	if o.InFlight == nil || o.InFlightTimeout <= 0 || o.Now.Before(o.InFlightStarted.Add(o.InFlightTimeout)) {
		return Action{}, false
	}
	a := cancel(o, fmt.Sprintf("it did not finish within the stage timeout of %s; letting the slot go to the next node", o.InFlightTimeout))
	a.Reason, a.TimedOut = fleetv1.ReasonStageTimedOut, true
	return a, true
}

// guardStatus: never act on a status that failed, or that was read in another
// boot than the current one (I5).
func guardStatus(o Observation) (Action, bool) {
	switch {
	case o.Status.Unavailable != "":
		return Action{Kind: RereadLater, Phase: fleetv1.PhaseDegraded, Reason: fleetv1.ReasonStatusUnavailable,
			Message: "bootc status failed: " + o.Status.Unavailable}, true
	case !o.Boot.Known() || !o.Status.ReadIn.Known() || o.Status.ReadIn != o.Boot:
		return Action{Kind: RereadLater, Phase: fleetv1.PhaseWaiting, Reason: fleetv1.ReasonStaleStatus,
			Message: fmt.Sprintf("bootc status was read in boot %s, current boot is %s; reading again", o.Status.ReadIn, o.Boot)}, true
	}
	return Action{}, false
}

// rebootPending is rule 1: the record was written in this boot, so the reboot
// has not happened yet.
func rebootPending(o Observation) Action {
	r := o.Record
	if o.InFlight != nil {
		return cancel(o, "a reboot is recorded")
	}
	if o.Now.Sub(r.Recorded) >= o.RebootTimeout {
		return Action{Kind: Nothing, Phase: fleetv1.PhaseDegraded, Reason: fleetv1.ReasonRebootDidNotHappen,
			Message: fmt.Sprintf("reboot into %s under %s recorded at %s did not happen within %s",
				r.Image, r.Grant, r.Recorded.UTC().Format(time.RFC3339), o.RebootTimeout)}
	}
	if r.Rollback {
		return rollbackPending(o)
	}
	if _, ok := StagedIs(o.Status, o.Boot, r.Image); !ok {
		return Action{Kind: ClearRecord, Phase: fleetv1.PhaseDegraded, Reason: fleetv1.ReasonStagedDigestMismatch,
			Message: "reboot into " + short(r.Image) + " recorded, but bootc has " + describe(o.Status.Staged) + " staged; dropped the record, not rebooting"}
	}
	if o.RequireSigned && !o.Status.Staged.verified() {
		a := Action{Kind: ClearRecord, Phase: fleetv1.PhaseWaiting, Reason: fleetv1.ReasonStagedNotVerified,
			Message: "reboot into " + short(r.Image) + " recorded, but signed images are required and bootc did not verify the staged deployment (signature " + signatureName(o.Status.Staged) + "); dropped the record, not rebooting"}
		if !o.Status.Staged.DownloadOnly {
			a.Phase, a.Reason = fleetv1.PhaseDegraded, fleetv1.ReasonUnlockedWithoutGrant
			a.Message += "; the staged deployment is unlocked, so any reboot will apply it"
		}
		return a
	}
	// An update's reboot needs no heartbeat (amendment 37): the grant
	// stands or it was revoked.
	g, err := grantFor(o, r.Grant, lease.ActionReboot, r.Image)
	if err == nil {
		if o.RebootIssued {
			return Action{Kind: Nothing, Phase: fleetv1.PhaseRebooting, Reason: fleetv1.ReasonRebooting,
				Message: "rebooting into " + short(r.Image) + "; waiting for the host to go down"}
		}
		return Action{Kind: ApplyAndReboot, Phase: fleetv1.PhaseRebooting, Reason: fleetv1.ReasonRebooting,
			Image: r.Image, Grant: g.ID, Soft: r.Soft,
			Message: "rebooting into " + short(r.Image) + " under " + g.ID.String() + " (recorded in this boot, not yet rebooted)"}
	}
	a := Action{Kind: ClearRecord, Phase: fleetv1.PhaseWaiting, Reason: fleetv1.ReasonWaitingForRebootGrant,
		Message: "reboot grant " + r.Grant.String() + " was revoked before the reboot (" + err.Error() + "); dropped the record"}
	if o.Status.Staged != nil && !o.Status.Staged.DownloadOnly {
		a.Phase, a.Reason = fleetv1.PhaseDegraded, fleetv1.ReasonUnlockedWithoutGrant
		a.Message = "reboot grant " + r.Grant.String() + " was revoked after the staged deployment was unlocked; any reboot will apply it"
	}
	return a
}

// afterReboot is rule 2: the boot identity changed since the record was
// written. It never stages or reboots: it waits for the status to settle,
// then clears the record with a verdict.
func afterReboot(o Observation) Action {
	r := o.Record
	if o.InFlight != nil {
		return cancel(o, "a reboot was recorded in an earlier boot")
	}
	if o.Status.Booted.Is(r.Image) {
		return Action{Kind: ClearRecord, MarkSpent: true, Phase: fleetv1.PhaseIdle, Reason: fleetv1.ReasonRebootCompleted,
			Message: "rebooted into " + short(r.Image) + " (boot " + o.Boot.String() + ")"}
	}
	if o.Now.Before(o.SettleDeadline) {
		return Action{Kind: RereadLater, Phase: fleetv1.PhaseRebooting, Reason: fleetv1.ReasonStatusSettling,
			Message: "new boot " + o.Boot.String() + " still shows " + describe(o.Status.Booted) + ", expected " + short(r.Image) + "; re-reading bootc status"}
	}
	return Action{Kind: ClearRecord, MarkSpent: true, Keep: true, Phase: fleetv1.PhaseDegraded, Reason: fleetv1.ReasonBootedUnexpectedImage,
		Message: "rebooted under " + r.Grant.String() + " but booted " + describe(o.Status.Booted) + ", expected " + short(r.Image)}
}

// idle is rule 3.
func idle(o Observation) Action {
	a := Action{Kind: Nothing, Phase: fleetv1.PhaseIdle, Reason: fleetv1.ReasonUpToDate, Message: "booted " + describe(o.Status.Booted)}
	if !o.Desired.Set {
		a.Reason, a.Message = fleetv1.ReasonNoDesiredImage, "no desired image; booted "+describe(o.Status.Booted)
	}
	if o.InFlight != nil {
		return cancel(o, "the stage is no longer needed")
	}
	return a
}

// staged is rule 4.
func staged(o Observation) Action {
	img := o.Desired.Image
	if o.InFlight != nil {
		if *o.InFlight == img {
			return Action{Kind: Nothing, Phase: fleetv1.PhaseStaging, Reason: fleetv1.ReasonStaging, Message: "finishing the stage of " + short(img)}
		}
		return cancel(o, "another image is staged")
	}
	soft := o.Policy == fleetv1.RebootPolicyAllowSoftReboot && o.Status.Staged.SoftRebootCapable && o.SoftRebootSupported && o.Bootc.SoftReboot
	how := "reboot"
	if soft {
		how = "soft reboot"
	}
	if g, err := validGrant(o, lease.ActionReboot, img); err == nil {
		return Action{Kind: ApplyAndReboot, WriteRecord: true, Phase: fleetv1.PhaseRebooting, Reason: fleetv1.ReasonRebooting,
			Image: img, Grant: g.ID, Soft: soft, Message: how + " into " + short(img) + " under " + g.ID.String()}
	}
	if !o.Status.Staged.DownloadOnly {
		// A stage that ended between its switch and its lock (the agent
		// stopped) left img unlocked: the stage grant lets it lock it.
		if g, err := validGrant(o, lease.ActionStage, img); err == nil && o.Bootc.Known && o.Bootc.CanStage {
			// A failing lock backs off and gives up as any stage does.
			if a, ok := backoff(o, o.LastStageFailure, g.ID); ok {
				return a
			}
			return Action{Kind: Stage, Phase: fleetv1.PhaseStaging, Reason: fleetv1.ReasonLockingStagedImage, Image: img, Grant: g.ID, Enforce: o.RequireSigned,
				Message: "staged " + short(img) + " is unlocked; locking it under " + g.ID.String()}
		}
		return Action{Kind: Nothing, Phase: fleetv1.PhaseDegraded, Reason: fleetv1.ReasonUnlockedWithoutGrant,
			Message: "staged " + short(img) + " is unlocked without a reboot grant; any reboot will apply it"}
	}
	// The same report with or without a reboot grant in phase Drain: the
	// agent has nothing to do under it (amendment 18), and the coordinator's
	// rollout-state annotation says Draining.
	return Action{Kind: Nothing, Phase: fleetv1.PhaseStaged, Reason: fleetv1.ReasonWaitingForRebootGrant,
		Message: "Staged " + short(img) + "; waiting for a reboot slot and the drain"}
}

// backoff holds a stage of the desired image under grant id back after
// failures f: given up once they exhausted the grant, else until the retry
// time. A new grant starts with fresh attempts and no delay: other nodes had
// their turn in between.
func backoff(o Observation, f *StageFailure, id lease.ID) (Action, bool) {
	img := o.Desired.Image
	if f == nil || f.Image != img {
		return Action{}, false
	}
	if f.exhausted(id) {
		msg := fmt.Sprintf("gave up staging %s under %s after %d failed attempts (last: %s); letting the slot go to the next node", short(img), id, f.Attempts, f.Message)
		if f.TimedOut {
			msg = fmt.Sprintf("gave up staging %s under %s: %s; letting the slot go to the next node", short(img), id, f.Message)
		}
		return Action{Kind: Nothing, Phase: fleetv1.PhaseWaiting, Reason: f.reason(), Message: f.prefix() + msg}, true
	}
	if f.Grant == id && o.Now.Before(f.RetryAt) {
		return Action{Kind: Nothing, Phase: fleetv1.PhaseDegraded, Reason: fleetv1.ReasonStageFailed,
			Message: f.prefix() + fmt.Sprintf("staging %s failed (attempt %d of %d): %s; retrying at %s", short(img), f.Attempts, lease.MaxStageAttempts, f.Message, f.RetryAt.UTC().Format(time.RFC3339))}, true
	}
	return Action{}, false
}

// stageOrWait is rule 5.
func stageOrWait(o Observation) Action {
	img := o.Desired.Image
	if o.InFlight == nil {
		switch b := o.Bootc; {
		case !b.Known:
			why := b.Problem
			if why == "" {
				why = "not asked yet"
			}
			return Action{Kind: RereadLater, Phase: fleetv1.PhaseWaiting, Reason: fleetv1.ReasonProbingBootc,
				Message: "learning what the installed bootc supports before staging " + short(img) + " (" + why + ")"}
		case !b.CanStage:
			why := b.Problem
			if why == "" {
				why = "bootc " + b.Version + " cannot stage an image without applying it"
			}
			return Action{Kind: Nothing, Phase: fleetv1.PhaseDegraded, Reason: fleetv1.ReasonBootcUnsupported, Message: why + "; nothing is run"}
		}
	}
	f := o.LastStageFailure
	if f != nil && f.Image != img {
		f = nil
	}
	g, err := validGrant(o, lease.ActionStage, img)
	if err != nil {
		if o.InFlight != nil {
			return cancel(o, "the stage grant for "+short(*o.InFlight)+" is gone ("+err.Error()+")")
		}
		if f != nil {
			// Reported as StageFailed while waiting, so the coordinator puts
			// this node behind the others in its queue.
			msg := fmt.Sprintf("waiting for a stage slot for %s; the last stage failed (%d attempts under %s): %s", short(img), f.Attempts, f.Grant, f.Message)
			if f.TimedOut {
				msg = fmt.Sprintf("waiting for a stage slot for %s; the last stage, under %s, timed out: %s", short(img), f.Grant, f.Message)
			}
			return Action{Kind: Nothing, Phase: fleetv1.PhaseWaiting, Reason: f.reason(), Message: f.prefix() + msg}
		}
		if _, ok := awaitingFirstHeartbeat(o, lease.ActionStage, img); ok && f == nil {
			// The report of this decision lists the new grant (Claims); once
			// it is accepted the grant is usable and the stage starts, with
			// the same report: one status write instead of two.
			return Action{Kind: Nothing, Phase: fleetv1.PhaseStaging, Reason: fleetv1.ReasonStaging, Message: "Staging " + short(img)}
		}
		return Action{Kind: Nothing, Phase: fleetv1.PhaseWaiting, Reason: fleetv1.ReasonWaitingForStageGrant,
			Message: "Waiting for a stage slot for " + short(img)}
	}
	if o.InFlight != nil {
		if *o.InFlight == img {
			return Action{Kind: Nothing, Phase: fleetv1.PhaseStaging, Reason: fleetv1.ReasonStaging, Message: "Staging " + short(img)}
		}
		return cancel(o, "the desired image changed to "+short(img))
	}
	if a, ok := backoff(o, f, g.ID); ok {
		return a
	}
	return Action{Kind: Stage, Phase: fleetv1.PhaseStaging, Reason: fleetv1.ReasonStaging, Image: img, Grant: g.ID, Enforce: o.RequireSigned, Message: "Staging " + short(img)}
}

func cancel(o Observation, why string) Action {
	return Action{Kind: CancelStage, Phase: fleetv1.PhaseWaiting, Reason: fleetv1.ReasonCancellingStage, Image: *o.InFlight,
		Message: "cancelling the stage of " + short(*o.InFlight) + ": " + why}
}

// cancelOr cancels an in-flight stage first, else returns a.
func cancelOr(o Observation, a Action) Action {
	if o.InFlight != nil {
		c := cancel(o, a.Message)
		c.Phase, c.Reason = a.Phase, a.Reason
		return c
	}
	return a
}

// validGrant returns a grant that allows act on img in this boot.
func validGrant(o Observation, act lease.Action, img imageref.Pinned) (HeldGrant, error) {
	err := fmt.Errorf("no %s grant held for %s", act, img)
	for _, g := range o.Grants {
		if act == lease.ActionReboot && spent(o, g.ID) {
			err = fmt.Errorf("%s was spent by a reboot in an earlier boot", g.ID)
			continue
		}
		e := g.Allows(check(o, g, act, img))
		if e == nil {
			return g, nil
		}
		if g.Holder == o.Node && g.Image == img && (g.Kind == lease.KindStage) == (act == lease.ActionStage) {
			err = e
		}
	}
	return HeldGrant{}, err
}

// awaitingFirstHeartbeat: a grant that would allow act on img but for the
// heartbeat it has not had yet (a grant seen for the first time is used only
// once a report listing it was accepted, amendment 8).
func awaitingFirstHeartbeat(o Observation, act lease.Action, img imageref.Pinned) (HeldGrant, bool) {
	for _, g := range o.Grants {
		if (g.Kind == lease.KindStage) != (act == lease.ActionStage) || !g.LastHeartbeat.IsZero() {
			continue
		}
		if act == lease.ActionReboot && spent(o, g.ID) {
			continue
		}
		c := check(o, g, act, img)
		c.LastHeartbeat = o.Now
		if g.Allows(c) == nil {
			return g, true
		}
	}
	return HeldGrant{}, false
}

// grantFor checks the grant with exactly this identity.
func grantFor(o Observation, id lease.ID, act lease.Action, img imageref.Pinned) (HeldGrant, error) {
	if spent(o, id) {
		return HeldGrant{}, fmt.Errorf("%s was spent by a reboot in an earlier boot", id)
	}
	for _, g := range o.Grants {
		if g.ID == id {
			return g, g.Allows(check(o, g, act, img))
		}
	}
	return HeldGrant{}, fmt.Errorf("grant %s is no longer held", id)
}

func check(o Observation, g HeldGrant, act lease.Action, img imageref.Pinned) lease.Check {
	return lease.Check{Node: o.Node, Action: act, Image: img.String(), BootID: o.Boot.BootID,
		SoftRebootCount: o.Boot.SoftRebootCount, Now: o.Now, LastHeartbeat: g.LastHeartbeat}
}

// grantedIn reports whether g was issued in boot b (boot ID and soft-reboot
// count: a soft reboot keeps the boot ID).
func grantedIn(g lease.Grant, b BootIdentity) bool {
	return g.BootID == b.BootID && g.SoftRebootCount == b.SoftRebootCount
}

func spent(o Observation, id lease.ID) bool {
	for _, s := range o.Spent {
		if s == id {
			return true
		}
	}
	return false
}

// SoftAfterUnlock says how to reboot once the staged deployment was
// unlocked for action a, from the staged deployment as bootc status shows
// it right after `bootc upgrade --from-downloaded --soft-reboot=auto`. It is
// soft only if a asked for a soft reboot and the staged deployment is still
// unlocked and soft-reboot capable: bootc's auto mode prepares the soft
// reboot (ostree's /run/nextroot) exactly when the staged entry it read is
// softRebootCapable, and silently does nothing otherwise (bootc
// crates/lib/src/cli.rs, handle_soft_reboot). systemd's soft reboot without
// /run/nextroot restarts userspace on the old root, which would spend the
// grant without applying the image, so then the agent reboots fully.
func SoftAfterUnlock(a Action, staged *Deployment) (soft bool, why string) {
	switch {
	case !a.Soft:
		return false, "a full reboot was decided"
	case staged == nil:
		return false, "bootc shows no staged deployment after unlocking"
	case staged.DownloadOnly:
		return false, "the staged deployment is still download-only after unlocking"
	case !staged.SoftRebootCapable:
		return false, "bootc no longer says the staged deployment is soft-reboot capable, so it prepared no soft reboot"
	}
	return true, "bootc prepared the soft reboot into the staged deployment"
}

func describe(d *Deployment) string {
	if d == nil || d.Image.Digest == "" {
		return "an unknown image"
	}
	return short(d.Image)
}

// short abbreviates a digest for messages a person reads: repo@sha256:ab12cd34ef56….
func short(p imageref.Pinned) string {
	return p.Repository + "@" + text.ShortDigest(p.Digest)
}
